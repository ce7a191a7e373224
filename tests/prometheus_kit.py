"""A real Prometheus server for tests: started on a free loopback port with a given scrape config and
its own data folder, stopped (with its process group) however the test ends."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not on PATH: .ci/run installs the Debian prometheus package")
        pytest.skip("prometheus is not on PATH (apt-get install prometheus)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> dict:
        """The `/api/v1/query` reply; a PromQL error comes back as {"status": "error", "error": ...}."""
        data = urllib.parse.urlencode({"query": expr}).encode()
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query", data=data, timeout=10) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())


@contextmanager
def running_prometheus(folder: Path, config: dict | None = None) -> Iterator[Prometheus]:
    port = free_port()
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config or {"global": {"scrape_interval": "1s"}}))
    log = open(folder / "prometheus.log", "wb")
    proc = subprocess.Popen([prometheus_binary(), f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        server = Prometheus(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{server.url}/-/ready", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
