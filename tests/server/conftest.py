"""Server fixtures: the real app on uvicorn in a thread, on a free 127.0.0.1 port, over a tiny model."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest


@dataclass
class LiveServer:
    base_url: str
    app: object
    server: object
    thread: threading.Thread

    @property
    def state(self):
        return self.app.state.server

    @property
    def engine(self):
        """The LLMEngine; read its fields only while it is idle (it belongs to the stepping thread)."""
        return self.state.engine.engine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until the engine has nothing running or waiting and every HTTP request has returned."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.state.engine.busy and self.state.in_flight == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"server still busy: {self.state.engine.snapshot}, in flight {self.state.in_flight}")


def start_server(model: str, admin_token: str | None = None, **engine_args) -> LiveServer:
    import uvicorn

    from specfleet.engine.config import EngineConfig
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.app import create_app
    from specfleet.engine.server.async_engine import AsyncEngine

    engine_args = {"num_kv_blocks": 128, "max_num_seqs": 64, "served_model_name": "tiny", **engine_args}
    app = create_app(AsyncEngine(LLMEngine(EngineConfig(model=model, **engine_args))), admin_token=admin_token)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return LiveServer(f"http://127.0.0.1:{port}", app, server, thread)


@pytest.fixture(scope="session")
def server_factory(tiny_llama):
    started: list[LiveServer] = []

    def make(**kwargs) -> LiveServer:
        live = start_server(tiny_llama, **kwargs)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()


@pytest.fixture(scope="session")
def live_server(server_factory) -> LiveServer:
    """One shared server over the tiny Llama (served as `tiny`); tests must leave it idle."""
    return server_factory()


@pytest.fixture
def openai_client(live_server):
    import openai

    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    yield client
    client.close()


@pytest.fixture
def http(live_server):
    import httpx

    with httpx.Client(base_url=live_server.base_url, timeout=60) as client:
        yield client
