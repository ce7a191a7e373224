"""Remote LoRA adapter sources for tests, all real servers on 127.0.0.1: a folder over `http.server`
(counting requests), a distribution registry (Debian's `docker-registry`, filesystem storage) and pushes to
it with `oras` (ORAS's file convention: one layer per file, named by its title annotation)."""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from testkit import free_port, wait_for

REGISTRY = shutil.which("docker-registry")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass
class FolderServer:
    url: str
    paths: list[str] = field(default_factory=list)    # every request's path, in order


@contextlib.contextmanager
def serving_folder(root: Path, delay_s: float = 0.0):
    """`root` over plain HTTP, each answer `delay_s` late; yields a FolderServer whose `paths` record the
    requests."""
    server_box = FolderServer("")

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(delay_s)
            super().do_GET()

        def log_message(self, *args) -> None:
            server_box.paths.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    server_box.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_box
    finally:
        server.shutdown()
        server.server_close()


def require_registry() -> str:
    if REGISTRY is None:
        pytest.skip("the docker-registry binary is missing (apt-get install docker-registry; .ci/run installs it)")
    return REGISTRY


@contextlib.contextmanager
def registry(tmp: Path):
    """A real registry on a free localhost port with its storage under `tmp`; yields its host:port."""
    binary = require_registry()
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "registry.yml"
    config.write_text(f"version: 0.1\nlog: {{level: error}}\n"
                      f"storage:\n  filesystem: {{rootdirectory: {tmp / 'data'}}}\n"
                      f"http: {{addr: 127.0.0.1:{port}}}\n")
    log = open(tmp / "registry.log", "w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    host = f"127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _up(host), 30, 0.05)
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {(tmp / 'registry.log').read_text()}")
        yield host
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


def _up(host: str) -> bool:
    try:
        return httpx.get(f"http://{host}/v2/", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def push(target: str, files: list[Path]) -> None:
    """`oras push target file...` (files titled by their base names), to a plain-http registry."""
    import oras.client

    client = oras.client.OrasClient(insecure=True)
    response = client.push(target=target, files=[str(f) for f in files], disable_path_validation=True)
    assert response.status_code == 201, response.text
