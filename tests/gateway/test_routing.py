"""Retries and metrics: a draining pod's 503 costs a retry on another pod, not the request; the
metrics count requests by service and code, retries, and the time to the first attempt."""
from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def test_a_draining_pod_s_503_is_retried_on_a_ready_one(make_rig):
    rig = await make_rig()
    draining = await rig.add_pod("draining", status=503)
    await _busy(rig, await rig.add_pod("ok"))
    results = await asyncio.gather(*(rig.post(rig.chat()) for _ in range(8)))
    assert [status for status, _, _ in results] == [200] * 8
    assert {body["choices"][0]["message"]["content"] for _, body, _ in results} == {"ok"}
    assert draining.received >= 1          # it was picked first, answered 503, was ejected


async def test_metrics_count_requests_by_service_and_code_retries_and_queue_time(make_rig):
    rig = await make_rig()
    await rig.add_pod("draining", status=503)
    await _busy(rig, await rig.add_pod("ok"))
    for _ in range(4):
        await rig.post(rig.chat())
    await rig.post(rig.chat("unknown"))
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.base + "/metrics") as r:
            text = await r.text()
    service = {"namespace": "default", "service": "tiny-cpu"}
    assert _sample(text, "specfleet_gateway_requests_total", **service, code="200") == 4
    assert _sample(text, "specfleet_gateway_requests_total", namespace="", service="", code="404") == 1
    assert _sample(text, "specfleet_gateway_retries_total", **service) == 1       # the 503, once: then ejected
    assert _sample(text, "specfleet_gateway_queue_seconds_count", **service) == 4
    assert _sample(text, "specfleet_gateway_ready_endpoints", **service) == 2
    assert "unknown" not in text                                               # no label from client input


async def _busy(rig, stand_in) -> None:
    """Make the balancer see `stand_in` as loaded, so the first pick is the other pod."""
    await rig.until(lambda: len(rig.gateway.routes["tiny"].endpoints) == 2)
    rig.gateway.balancer.outstanding[f"http://127.0.0.1:{stand_in.port}"] = 100


async def test_a_not_ready_pod_takes_no_traffic(make_rig):
    rig = await make_rig()
    idle = await rig.add_pod("unready", ready=False)
    await rig.add_pod("ready")
    await rig.until(lambda: rig.gateway.routes["tiny"].endpoints)
    for _ in range(4):
        assert (await rig.post(rig.chat()))[0] == 200
    assert idle.received == 0


def _sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None
