"""Server fixtures: the real app on uvicorn in a thread, on a free 127.0.0.1 port, over a tiny model."""
from __future__ import annotations

import pytest

from testkit import LiveServer, start_server, started


@pytest.fixture(scope="session")
def server_factory(tiny_llama):
    with started(lambda **kwargs: start_server(tiny_llama, **{"max_num_seqs": 64, **kwargs}), LiveServer.stop) as make:
        yield make


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
