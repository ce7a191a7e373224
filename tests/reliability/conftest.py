"""Reliability fixtures: live engine servers (in-thread and as processes), free ports, RSS and polling helpers.

Knobs (environment): RELIABILITY_OVERLOAD_S (the overload test's duration, default 15 s; the full run is 60),
RELIABILITY_FUZZ_EXAMPLES (schemathesis examples per operation, default 8).
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import LiveServer, free_port, start_server, started, wait_for

BIN = Path(sys.executable).parent


def rss_mib(pid: int | None = None) -> float:
    import psutil

    return psutil.Process(pid or os.getpid()).memory_info().rss / 2**20


@pytest.fixture(scope="session")
def reliability_server_factory(tiny_llama):
    with started(lambda **kwargs: start_server(tiny_llama, **kwargs), LiveServer.stop) as make:
        yield make


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
    logs = (tmp_path / f"engine-{i}.log" for i in itertools.count())
    with started(lambda *extra: EngineProcess(tiny_llama, next(logs), *extra), EngineProcess.kill) as make:
        yield make


@pytest.fixture(scope="session")
def rel():
    """Helpers for the test modules (importlib mode: modules cannot import this conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(free_port=free_port, wait_for=wait_for, rss_mib=rss_mib)
