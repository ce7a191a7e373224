"""The one scheduler of all control loops (`control/scheduler.py`): idle services are never stepped, a
service with pods gets its intervals and detections in between, a forgotten one stops."""
from __future__ import annotations

import asyncio

from specfleet.operator.control import loop, scheduler
from specfleet.operator.control.discovery import EngineView
from specfleet.operator.control.runner import ControlOutcome

INTERVAL, DETECT = 0.1, 0.03


class FakeControl:
    """Records its steps; idle while the view shows it no pods (as ServiceControl is without history)."""

    def __init__(self, name: str):
        self.namespace, self.name = "ns", name
        self.config = loop.LoopConfig(interval_s=INTERVAL, detect_interval_s=DETECT)
        self.steps: list[str] = []
        self.kube = self

    def transient(self, exc) -> bool:
        return False

    def idle(self, pods) -> bool:
        return not pods

    async def interval(self, body, pods, replicas, when):
        self.steps.append("interval")
        return ControlOutcome({"observed": {"n": len(self.steps)}}, [])

    async def detect(self, body, pods, replicas, when):
        self.steps.append("detect")
        return None


def serving_pod(name: str) -> dict:
    return {"metadata": {"name": f"{name}-0", "namespace": "ns", "labels": {"specfleet.io/inferenceservice": name}},
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8123}]}]},
            "status": {"podIP": "127.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}}


async def _run_for(seconds: float, sched: scheduler.ControlScheduler) -> None:
    task = asyncio.create_task(sched.run())
    await asyncio.sleep(seconds)
    task.cancel()


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
        await _run_for(0.6, sched)
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
        await _run_for(0.3, sched)
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
