"""Scale from zero, the gateway half: requests for a service without a ready replica are held (bounded per
service and in time), never hang, never leak, and the held count reaches the InferenceService at once."""
from __future__ import annotations

import asyncio

import aiohttp

from specfleet.cluster.gateway.follow import held_annotation

KEY = held_annotation("local")


async def test_a_held_request_succeeds_once_a_replica_turns_ready_and_the_count_is_annotated(make_rig):
    rig = await make_rig()
    waiting = asyncio.create_task(rig.post(rig.chat()))
    await rig.until(lambda: rig.gateway.holds.counts.get("default/tiny-cpu") == 1)
    annotated = await rig.until(lambda: _annotation(rig, "1"))
    assert annotated and not waiting.done()
    await rig.add_pod("p0")
    status, body, headers = await waiting
    assert status == 200 and body["choices"][0]["message"]["content"] == "p0"
    assert await rig.until(lambda: _annotation(rig, None))      # released: the key is gone
    assert rig.gateway.holds.counts == {}


async def test_past_the_bound_a_request_is_refused_503_with_retry_after_at_once(make_rig):
    rig = await make_rig(max_held=1, retry_after_s=7)
    first = asyncio.create_task(rig.post(rig.chat()))
    await rig.until(lambda: rig.gateway.holds.counts.get("default/tiny-cpu") == 1)
    status, body, headers = await rig.post(rig.chat())
    assert status == 503 and headers["Retry-After"] == "7" and body["error"]["code"] == "hold_full"
    first.cancel()


async def test_a_hold_that_times_out_is_503_with_retry_after_not_a_hang(make_rig):
    rig = await make_rig(hold_timeout_s=0.5, retry_after_s=3)
    status, body, headers = await rig.post(rig.chat(), timeout=5)
    assert status == 503 and headers["Retry-After"] == "3"
    assert body["error"]["type"] == "service_unavailable" and body["error"]["code"] == "hold_timeout"
    assert rig.gateway.holds.counts == {}


async def test_a_client_that_disconnects_while_held_is_released(make_rig):
    rig = await make_rig()
    try:
        await rig.post(rig.chat(), timeout=0.5)
    except asyncio.TimeoutError:
        pass
    await rig.until(lambda: rig.gateway.holds.counts == {})
    assert await rig.until(lambda: _annotation(rig, None))
    assert 'specfleet_gateway_held_requests{namespace="default",service="tiny-cpu"} 0.0' in await _metrics(rig)


async def test_the_held_gauge_counts_waiting_requests_per_service(make_rig):
    rig = await make_rig()
    waiting = [asyncio.create_task(rig.post(rig.chat())) for _ in range(3)]
    await rig.until(lambda: rig.gateway.holds.counts.get("default/tiny-cpu") == 3)
    assert 'specfleet_gateway_held_requests{namespace="default",service="tiny-cpu"} 3.0' in await _metrics(rig)
    await rig.add_pod("p0")
    assert [r[0] for r in await asyncio.gather(*waiting)] == [200, 200, 200]


async def _annotation(rig, expected: str | None) -> bool:
    annotations = (await rig.isvc())["metadata"].get("annotations") or {}
    return annotations.get(KEY) == expected


async def _metrics(rig) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.base + "/metrics") as r:
            return await r.text()
