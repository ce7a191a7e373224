"""The one scheduler of all control loops (`control/scheduler.py`): idle services are never stepped, a
service with pods gets its intervals and detections in between, a forgotten one stops."""
from __future__ import annotations

import asyncio

from specfleet.operator.control import loop, scheduler
from specfleet.operator.control.discovery import EngineView

from tests.control.scheduler_kit import FakeControl, run_for, serving_pod


def test_idle_services_are_not_stepped_and_served_ones_are():
    view, published = EngineView(), []

    async def publish(body, outcome):
        published.append((body["metadata"]["name"], outcome.status))

    async def main():
        sched = scheduler.ControlScheduler(view, publish)
        idle = [FakeControl(f"idle-{i}") for i in range(200)]
        for c in idle:
            sched.track(("ns", c.name), c, lambda c=c: {"metadata": {"name": c.name}})
        busy = FakeControl("busy")
        view.pod_changed(serving_pod("busy"))
        sched.track(("ns", "busy"), busy, lambda: {"metadata": {"name": "busy"}})
        await run_for(0.6, sched)
        return idle, busy
    idle, busy = asyncio.run(main())
    assert all(c.steps == [] for c in idle)
    assert busy.steps.count("interval") >= 3 and busy.steps.count("detect") >= 3
    assert published and all(name == "busy" for name, _ in published)


def test_a_forgotten_service_is_stepped_no_more():
    view = EngineView()
    view.pod_changed(serving_pod("gone"))

    async def publish(body, outcome):
        pass

    async def main():
        sched = scheduler.ControlScheduler(view, publish)
        control = FakeControl("gone")
        sched.track(("ns", "gone"), control, lambda: {"metadata": {"name": "gone"}})
        sched.forget(("ns", "gone"))
        await run_for(0.3, sched)
        return control, len(sched)
    control, tracked = asyncio.run(main())
    assert control.steps == [] and tracked == 0


def test_the_view_follows_pods_and_replicas():
    view = EngineView()
    view.pod_changed(serving_pod("chat"))
    assert [p.url for p in view.pods("ns", "chat")] == ["http://127.0.0.9:8123"]
    view.pod_changed(serving_pod("chat"), gone=True)
    assert view.pods("ns", "chat") == []
    view.replicas_changed("ns", "chat", (2, 1))
    assert view.replicas("ns", "chat") == (2, 1)
    view.replicas_changed("ns", "chat", None)
    assert view.replicas("ns", "chat") is None


def test_turns_due_close_together_share_one_wake_up_and_intervals_do_not_drift(monkeypatch):
    view, wakeups = EngineView(), []
    real_wait_for = asyncio.wait_for

    async def counted_wait_for(awaitable, timeout):
        wakeups.append(timeout)
        return await real_wait_for(awaitable, timeout)

    async def publish(body, outcome):
        pass

    async def main():
        monkeypatch.setattr(scheduler.asyncio, "wait_for", counted_wait_for)
        sched = scheduler.ControlScheduler(view, publish)
        controls = [FakeControl(f"s{i}") for i in range(200)]
        for c in controls:
            c.config = loop.LoopConfig(interval_s=1.0, detect_interval_s=0.5)
            view.pod_changed(serving_pod(c.name))
            sched.track(("ns", c.name), c, lambda c=c: {"metadata": {"name": c.name}})
        await run_for(2.2, sched)
        return sched, controls
    sched, controls = asyncio.run(main())
    turns = sum(len(c.steps) for c in controls)
    assert sched.wake_slack_s == scheduler.WAKE_SLACK_S
    assert turns >= 400 and len(wakeups) < turns / 4, (turns, len(wakeups))
    assert all(c.steps.count("interval") == 2 for c in controls)      # first in [0.5, 1.0] s, then 1 s apart
