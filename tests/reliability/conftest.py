"""Reliability fixtures: live engine servers (in-thread and as processes), free ports, RSS and polling helpers.

Knobs (environment): RELIABILITY_OVERLOAD_S (the overload test's duration, default 15 s; the full run is 60),
RELIABILITY_FUZZ_EXAMPLES (schemathesis examples per operation, default 8).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import free_port, wait_for

BIN = Path(sys.executable).parent


def rss_mib(pid: int | None = None) -> float:
    import psutil

    return psutil.Process(pid or os.getpid()).memory_info().rss / 2**20


@dataclass
class LiveServer:
    base_url: str
    app: object
    server: object
    thread: threading.Thread

    @property
    def state(self):
        return self.app.state.server

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def wait_idle(self, timeout: float = 20.0) -> None:
        wait_for(lambda: not self.state.engine.busy and self.state.in_flight == 0, timeout, 0.02)


def start_server(model: str, admin_token: str | None = None, limits=None, **engine_args) -> LiveServer:
    import uvicorn

    from specfleet.engine.config import EngineConfig
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.app import create_app
    from specfleet.engine.server.async_engine import AsyncEngine

    engine_args = {"num_kv_blocks": 128, "max_num_seqs": 32, "served_model_name": "tiny", **engine_args}
    app = create_app(AsyncEngine(LLMEngine(EngineConfig(model=model, **engine_args))), admin_token=admin_token,
                     limits=limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2,
                                           timeout_keep_alive=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, 0.02)
    return LiveServer(f"http://127.0.0.1:{port}", app, server, thread)


@pytest.fixture(scope="session")
def reliability_server_factory(tiny_llama):
    started: list[LiveServer] = []

    def make(**kwargs) -> LiveServer:
        live = start_server(tiny_llama, **kwargs)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()


@pytest.fixture(scope="module")
def abuse_server(reliability_server_factory):
    """A small-context server (generations stay short) for fuzzing and hand-made hostile requests."""
    return reliability_server_factory(max_model_len=64, admin_token="fuzz-admin-token")


class EngineProcess:
    """`specfleet engine serve` as a child process (its own session), for kill tests."""

    def __init__(self, model: str, log: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [str(BIN / "specfleet"), "engine", "serve", "--model", model, "--served-model-name", "tiny",
                   "--host", "127.0.0.1", "--port", str(self.port), "--num-kv-blocks", "128",
                   "--max-num-seqs", "16", "--device", "cpu", "--log-level", "warning", *extra]
        self.proc = subprocess.Popen(command, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def ready(self) -> bool:
        import httpx

        return self.proc.poll() is None and httpx.get(self.url + "/ready", timeout=2).status_code == 200

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def engine_process(tiny_llama, tmp_path):
    started: list[EngineProcess] = []

    def make(*extra: str) -> EngineProcess:
        proc = EngineProcess(tiny_llama, tmp_path / f"engine-{len(started)}.log", *extra)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()


@pytest.fixture(scope="session")
def rel():
    """Helpers for the test modules (importlib mode: modules cannot import this conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(free_port=free_port, wait_for=wait_for, rss_mib=rss_mib)
