"""Stand-ins for the control scheduler's tests (tests/control/test_scheduler.py, test_idle_cost.py): a
service control that records its steps, a serving pod, and a scheduler run for a while."""
from __future__ import annotations

import asyncio

from specfleet.operator.control import loop, scheduler
from specfleet.operator.control.runner import ControlOutcome

INTERVAL, DETECT = 0.1, 0.03


class FakeControl:
    """Records its steps; idle while the view shows it no pods (as ServiceControl is without history)."""

    def __init__(self, name: str):
        self.namespace, self.name = "ns", name
        self.config = loop.LoopConfig(interval_s=INTERVAL, detect_interval_s=DETECT)
        self.steps: list[str] = []
        self.kube = self
        self.awaiting = False

    def transient(self, exc) -> bool:
        return False

    def idle(self, pods) -> bool:
        return not pods

    def news(self, pods, interval) -> bool | None:
        return None

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


async def run_for(seconds: float, sched: scheduler.ControlScheduler) -> None:
    task = asyncio.create_task(sched.run())
    await asyncio.sleep(seconds)
    task.cancel()
