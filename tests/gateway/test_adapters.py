"""LoRA adapters through the gateway, in front of stand-in pods that export what they serve as the engine
does: requests go to a pod serving the adapter, a declared adapter no pod serves yet waits for one, a pod
that lacks it after all costs a retry, an unknown model is a 404 in the OpenAI format."""
from __future__ import annotations

import asyncio
import time

import aiohttp

MODEL = "tiny"                   # the service's base model (tests/gateway/conftest.py)


async def _models(rig) -> dict[str, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.base + "/v1/models") as r:
            return {card["id"]: card for card in (await r.json())["data"]}


async def test_a_request_for_an_adapter_goes_to_the_pod_serving_it_and_models_lists_it_with_its_parent(make_rig):
    rig = await make_rig()
    await rig.add_pod("plain")
    holder = await rig.add_pod("holder", adapters={"sql"})
    await rig.until(lambda: rig.gateway.balancer.resolve("sql"))
    for _ in range(6):
        status, body, headers = await rig.post(rig.chat("sql"))
        assert (status, headers["X-Specfleet-Pod"], body["model"]) == (200, "holder", "sql")
    assert holder.received == 6
    cards = await _models(rig)
    assert cards[MODEL]["parent"] is None and cards[MODEL]["specfleet"]["readyReplicas"] == 2
    assert (cards["sql"]["parent"], cards["sql"]["specfleet"]) == (
        MODEL, {"inferenceService": "default/tiny-cpu", "readyReplicas": 1, "declared": False})


async def test_a_declared_adapter_no_pod_serves_waits_for_the_operator_to_load_it(make_rig):
    rig = await make_rig()
    first, second = await rig.add_pod("p0"), await rig.add_pod("p1")
    await rig.declare("sql")
    assert (await _models(rig))["sql"]["specfleet"] == {"inferenceService": "default/tiny-cpu",
                                                       "readyReplicas": 0, "declared": True}
    request = asyncio.create_task(rig.post(rig.chat("sql")))
    await rig.until(lambda: rig.gateway.holds.counts.get("default/tiny-cpu") == 1)
    assert first.received == second.received == 0
    second.adapters.add("sql")                       # what the operator's load through the admin API does
    status, _, headers = await request
    assert (status, headers["X-Specfleet-Pod"], first.received) == (200, "p1", 0)


async def test_after_the_adapter_wait_a_declared_adapter_goes_to_any_pod_and_its_own_answer_comes_back(make_rig):
    rig = await make_rig(adapter_wait_s=0.3)
    pods = [await rig.add_pod("p0"), await rig.add_pod("p1")]
    await rig.declare("sql")
    start = time.monotonic()
    status, body, _ = await rig.post(rig.chat("sql"))
    assert time.monotonic() - start >= 0.3
    assert status == 404 and body["error"]["code"] == "model_not_found"          # each pod said so in turn
    assert all(pod.received >= 1 for pod in pods)


async def test_a_pod_that_no_longer_serves_the_adapter_costs_a_retry_on_one_that_does_not_the_request(make_rig):
    rig = await make_rig()
    stale = await rig.add_pod("stale", advertised={"sql"})          # unloaded since its last scrape
    await rig.add_pod("holder", adapters={"sql"})
    await rig.until(lambda: len(rig.gateway.routes[MODEL].endpoints) == 2)
    rig.gateway.balancer.outstanding[f"http://127.0.0.1:{stale.port}"] = -100    # picked first
    status, _, headers = await rig.post(rig.chat("sql"))
    assert (status, headers["X-Specfleet-Pod"], stale.received) == (200, "holder", 1)
    assert (await rig.post(rig.chat()))[2]["X-Specfleet-Pod"] == "stale"       # not ejected for the base model


async def test_an_unknown_model_is_404_in_openai_format_after_one_fresh_poll(make_rig):
    rig = await make_rig()
    pod = await rig.add_pod("p0")
    await rig.until(lambda: rig.gateway.routes[MODEL].endpoints)
    status, body, _ = await rig.post(rig.chat("nope"))
    assert status == 404 and body["error"] == {
        "message": "The model `nope` does not exist; GET /v1/models lists the served models and adapters.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    pod.adapters.add("fresh")                        # loaded a moment ago: the next poll sees it, no 404
    status, _, headers = await rig.post(rig.chat("fresh"))
    assert (status, headers["X-Specfleet-Pod"]) == (200, "p0")


async def test_an_adapter_no_service_declares_and_no_pod_serves_any_more_is_404_at_once_not_after_a_wait(make_rig):
    rig = await make_rig(adapter_wait_s=30)
    stale = await rig.add_pod("stale", advertised={"by-hand"})      # unloaded since its last scrape
    other = await rig.add_pod("other")
    await rig.until(lambda: rig.gateway.balancer.resolve("by-hand"))
    start = time.monotonic()
    status, body, _ = await rig.post(rig.chat("by-hand"))
    assert status == 404 and body["error"]["code"] == "model_not_found" and time.monotonic() - start < 5
    assert stale.received >= 1 and other.received >= 1                 # nothing will load it: the pods decide
