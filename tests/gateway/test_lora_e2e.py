"""The gateway in front of two real engine pods serving LoRA adapters (the tiny random Llama, PEFT adapters
made by `peft`), driven by the official `openai` client: adapter affinity, the operator's late load of a
declared adapter, 404 for an unknown model, and an adapter moved between pods under load with no request
lost."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from lora_kit import build_adapters

from specfleet.engine.server.lora import LoRAModule
from testkit import start_server

pytestmark = pytest.mark.slow
TOKEN = "s3cret"
LORA = dict(enable_lora=True, max_loras=2, max_lora_rank=16, admin_token=TOKEN)


@pytest.fixture(scope="module")
def engines(tiny_llama, tmp_path_factory):
    """Pod a serves `sql`, pod b serves `chat`; `folders` has every adapter's folder."""
    folders = build_adapters(tiny_llama, tmp_path_factory.mktemp("adapters"))
    servers = {}
    try:
        servers["a"] = start_server(tiny_llama, lora_modules=(LoRAModule("sql", folders["all"]),), **LORA)
        servers["b"] = start_server(tiny_llama, lora_modules=(LoRAModule("chat", folders["mlp"]),), **LORA)
        yield servers, folders
    finally:
        for server in servers.values():
            server.stop()


def admin(server, action: str, name: str, path: str | None = None) -> httpx.Response:
    body = {"lora_name": name, **({"lora_path": path} if path else {})}
    return httpx.post(f"{server.base_url}/v1/{action}_lora_adapter", json=body,
                      headers={"Authorization": f"Bearer {TOKEN}"})


def lora_requests(server, name: str) -> float:
    """The pod's own count of requests for adapter `name`."""
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith("specfleet:lora_requests_total{") and f'lora_name="{name}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def ask(client: openai.AsyncOpenAI, model: str) -> str:
    """One chat completion through the gateway; returns the pod that answered."""
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert raw.parse().model == model
    return raw.headers["x-specfleet-pod"]


async def test_adapter_requests_reach_the_pod_serving_them_through_the_openai_client(make_rig, engines):
    (servers, folders), rig = engines, await make_rig()
    for name, server in servers.items():
        await rig.add_pod_at(f"engine-{name}", int(server.base_url.rsplit(":", 1)[1]))
    await rig.declare("sql", "chat", "later")
    await rig.until(lambda: rig.gateway.balancer.resolve("chat") and rig.gateway.balancer.resolve("sql")
                    and len(rig.gateway.balancer.served) == 2)
    async with openai.AsyncOpenAI(base_url=rig.base + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        assert [await ask(client, "sql") for _ in range(4)] == ["engine-a"] * 4
        assert [await ask(client, "chat") for _ in range(4)] == ["engine-b"] * 4
        assert (lora_requests(servers["a"], "sql"), lora_requests(servers["b"], "sql")) == (4, 0)
        assert (lora_requests(servers["b"], "chat"), lora_requests(servers["a"], "chat")) == (4, 0)
        cards = {m.id: m for m in (await client.models.list()).data}
        assert {name: cards[name].parent for name in ("sql", "chat", "later")} == {n: "tiny" for n in
                                                                                  ("sql", "chat", "later")}

        with pytest.raises(openai.NotFoundError) as err:
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        assert (err.value.body["code"], err.value.body["param"]) == ("model_not_found", "model")

        # `later` is declared but no pod serves it: the request waits until the operator loads it on b
        waiting = asyncio.create_task(ask(client, "later"))
        await rig.until(lambda: rig.gateway.holds.counts.get("default/tiny-cpu") == 1)
        assert (await asyncio.to_thread(admin, servers["b"], "load", "later", folders["qv-rslora"])).status_code == 200
        assert await waiting == "engine-b"


async def test_moving_an_adapter_between_pods_under_load_loses_no_request(make_rig, engines):
    """Clients keep asking for `sql` while it is loaded on b and unloaded from a (retried while a request
    there is in flight, as the operator does): every request finishes 200, first on a, at the end on b."""
    (servers, folders), rig = engines, await make_rig()
    for name, server in servers.items():
        await rig.add_pod_at(f"engine-{name}", int(server.base_url.rsplit(":", 1)[1]))
    await rig.declare("sql", "chat")
    await rig.until(lambda: rig.gateway.balancer.resolve("sql") and len(rig.gateway.balancer.served) == 2)
    pods: list[str] = []
    stop = asyncio.Event()

    async def client_loop(client):
        while not stop.is_set():
            pods.append(await ask(client, "sql"))

    async with openai.AsyncOpenAI(base_url=rig.base + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        loops = [asyncio.create_task(client_loop(client)) for _ in range(4)]
        await rig.until(lambda: len(pods) >= 8, timeout=60)
        assert (await asyncio.to_thread(admin, servers["b"], "load", "sql", folders["all"])).status_code == 200
        while (unloaded := await asyncio.to_thread(admin, servers["a"], "unload", "sql")).status_code == 409:
            await asyncio.sleep(0.02)
        assert unloaded.status_code == 200
        moved = len(pods)
        await rig.until(lambda: len(pods) >= moved + 8, timeout=60)
        stop.set()
        await asyncio.gather(*loops)                 # any failed request raises here
    assert set(pods[:8]) == {"engine-a"} and set(pods[moved + 4:]) == {"engine-b"}
    assert admin(servers["a"], "load", "sql", folders["all"]).status_code == 200       # as the first test found it
    assert admin(servers["b"], "unload", "sql").status_code == 200
