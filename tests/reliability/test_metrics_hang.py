"""A metrics endpoint that hangs: the scrape times out, the pod counts as unknown (never zero), and the
autoscaler holds instead of scaling down."""
from __future__ import annotations

import asyncio
import time

from aiohttp import web

from specfleet.operator.control import autoscaler
from specfleet.operator.control.window import build_window
from specfleet.operator.control.scrape import scrape_pods

QUIET = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="tiny"} 0.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="tiny"} 0.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.0
"""


async def _serve() -> tuple[web.AppRunner, str]:
    async def good(_request):
        return web.Response(text=QUIET, content_type="text/plain")

    async def hang(_request):
        await asyncio.sleep(3600)

    app = web.Application()
    app.router.add_get("/good/metrics", good)
    app.router.add_get("/hang/metrics", hang)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_a_hanging_metrics_endpoint_times_out_and_blocks_any_scale_down():
    from specfleet.sim import run, scenarios

    _spec, _plan, model, _truth = run.setup(scenarios.steady())
    runner, base = await _serve()
    try:
        pods = {"pod-a": f"{base}/good", "pod-b": f"{base}/hang"}
        start = time.monotonic()
        first = await scrape_pods(pods, timeout=0.5)
        second = await scrape_pods(pods, timeout=0.5)
        elapsed = time.monotonic() - start
    finally:
        await runner.cleanup()
    assert set(first) == set(second) == {"pod-a"}               # the hanging pod is unknown, not zero
    assert elapsed < 3.0                                        # bounded by the timeout, not the hang
    window = build_window(first, second, expected=2)
    assert window is not None and not window.complete
    policy = autoscaler.ScalingPolicy(min_replicas=1, max_replicas=4, scale_down_stabilization_seconds=0)
    decision, _ = autoscaler.decide(window, model, 3, policy, autoscaler.AutoscalerState(), now=1000.0)
    assert decision.desired == 3 and decision.reason == "MetricsUnavailable", decision
    none_decision, _ = autoscaler.decide(None, model, 3, policy, autoscaler.AutoscalerState(), now=1000.0)
    assert none_decision.desired == 3
