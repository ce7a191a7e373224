"""One service's control loop I/O (`control/runner.py`) against a fake Kube: idle services cost no call,
the plan is made once per generation, pending replicas count as no capacity."""
from __future__ import annotations

import asyncio

import pytest
import yaml

from specfleet.operator import planner
from specfleet.operator.control import loop, runner
from specfleet.operator.control.discovery import EnginePod

EXAMPLE = "manifests/examples/smollm2-cpu.yaml"
PENDING = "0/1 nodes are available: 1 Insufficient cpu."


class RunnerKube:
    def __init__(self):
        self.calls: list[str] = []

    def get(self, kind, namespace, name):
        self.calls.append(f"get {kind}")
        return None

    def scale(self, kind, namespace, name, replicas):
        self.calls.append(f"scale {replicas}")

    def transient(self, exc):
        return False


@pytest.fixture
def body(request):
    from pathlib import Path

    root = Path(request.config.rootpath)
    doc = yaml.safe_load((root / EXAMPLE).read_text())
    return {"metadata": {"name": "chat", "namespace": "ns", "generation": 1}, "spec": doc["spec"], "status": {}}


def control(kube) -> runner.ServiceControl:
    return runner.ServiceControl("ns", "chat", kube, loop.LoopConfig(interval_s=1.0))


def test_a_service_without_pods_is_idle_and_makes_no_api_call(body):
    kube = RunnerKube()
    ctl = control(kube)
    assert asyncio.run(ctl.interval(body, [], (1, 0), "t")) is None
    assert asyncio.run(ctl.detect(body, [], (1, 0), "t")) is None
    assert kube.calls == [] and ctl.planned is None


def test_the_plan_is_made_once_per_generation(body, monkeypatch):
    made = []
    real = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a: made.append(1) or real(*a))
    ctl = control(RunnerKube())
    pending = [EnginePod("ns", "chat", "chat-1", None, PENDING)]
    for _ in range(3):
        asyncio.run(ctl.interval(body, pending, (2, 1), "t"))
    assert len(made) == 1
    edited = {**body, "metadata": {**body["metadata"], "generation": 2},
              "spec": {**body["spec"], "slo": {**body["spec"]["slo"], "itlP99Ms": 300}}}
    asyncio.run(ctl.interval(edited, pending, (2, 1), "t"))
    assert len(made) == 2 and ctl.state.generation == 2
    replanned = {**edited, "status": {"replanned": "1"}}     # the reconcile honoured a specfleet.io/replan
    for _ in range(2):
        asyncio.run(ctl.interval(replanned, pending, (2, 1), "t"))
    assert len(made) == 3


def test_a_replica_no_node_has_room_for_is_reported_pending_not_capacity(body):
    ctl = control(RunnerKube())
    pods = [EnginePod("ns", "chat", "chat-0", None, None), EnginePod("ns", "chat", "chat-1", None, PENDING)]
    outcome = asyncio.run(ctl.interval(body, pods, (2, 1), "2026-01-01T00:00:00Z"))
    assert outcome.status["replicasPending"] == 1
    cond = next(c for c in outcome.status["conditions"] if c["type"] == "Schedulable")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable" and PENDING in cond["message"]
    assert "1 of 2 replicas pending, counted as no capacity" in cond["message"]


def test_a_scale_up_is_held_while_replicas_wait_for_a_node(service, make_window):
    spec, plan, model = service
    rps = 3 * model.replica_rps(0.9)

    def second_step(unschedulable):
        st = loop.ServiceLoop(1, model)
        loop.decide_step(make_window(rps=rps, pods=2, end=15.0), spec, plan, st, 2, 1, 15.0, "t")
        return loop.decide_step(make_window(rps=rps, queue=30.0, growth=2.0, ttft=4.0, pods=2, end=30.0), spec,
                                plan, st, 2, 1, 30.0, "t", unschedulable=unschedulable)
    assert second_step(()).scale.desired > 2                    # with room, the load scales up
    held = second_step((PENDING,))
    assert held.scale.desired == 2 and held.scale.reason == "Unschedulable" and PENDING in held.scale.message
    assert held.pending == 1 and held.decisions == []


def test_a_step_waits_for_each_pods_next_prometheus_sample_but_not_forever(body):
    """Prometheus samples at its own pace: an interval that comes before a pod's next sample waits (no
    decision, no status, `awaiting`) rather than read a window without it; after four intervals it steps
    anyway."""
    from specfleet.operator.control.sources import SourceReport
    from specfleet.operator.control.window import Scrape

    class Clock:
        t = 100.0

        def __call__(self):
            return self.t

    class SampledEvery3s:
        stale_after_s = 0.0

        def __init__(self, clock):
            self.clock = clock

        async def scrape(self, namespace, endpoints):
            sampled = self.clock.t - self.clock.t % 3
            return ({p: Scrape(sampled, counters={"vllm:generation_tokens": sampled}) for p in endpoints},
                    SourceReport("prometheus", "Prometheus", "test", True))

    clock = Clock()
    ctl = runner.ServiceControl("ns", "chat", RunnerKube(), loop.LoopConfig(interval_s=1.0), clock=clock,
                                source=SampledEvery3s(clock))
    pods = [EnginePod("ns", "chat", "chat-0", "http://127.0.0.1:1", None)]
    stepped, awaiting = [], []
    for _ in range(7):
        stepped.append(asyncio.run(ctl.interval(body, pods, (1, 1), "t")) is not None)
        awaiting.append(ctl.awaiting)                                      # the scheduler tries again soon
        clock.t += 1
    assert stepped == [True, False, True, False, False, True, False]     # t = 100 | 102 | 105: new samples
    assert awaiting == [not s for s in stepped]
    ctl.source = type("Frozen", (), {"scrape": SampledEvery3s(Clock()).scrape,
                                      "news": lambda self, namespace, endpoints, seen: False,
                                      "stale_after_s": 0.0})()
    waits = [asyncio.run(ctl.interval(body, pods, (1, 1), "t")) is None for _ in range(3)]
    assert waits == [True, True, True] and ctl.news(pods, interval=True) is False
    clock.t += 4                                                           # four intervals without a sample
    assert ctl.news(pods, interval=True) is None and ctl.news(pods, interval=False) is False
    assert asyncio.run(ctl.interval(body, pods, (1, 1), "t")) is not None
    # A source that serves a sample for a minute: a 1 s interval waits that long for the next one (four
    # intervals would end before Prometheus's next scrape, and step on no window every time).
    ctl.source.stale_after_s = 60.0
    clock.t += 30
    assert asyncio.run(ctl.interval(body, pods, (1, 1), "t")) is None and ctl.awaiting
    clock.t += 31
    assert asyncio.run(ctl.interval(body, pods, (1, 1), "t")) is not None


def test_a_detection_without_a_newer_sample_decides_nothing(body, monkeypatch):
    """Prometheus samples at its own pace: a detection whose scrape holds no sample newer than the last
    one has no new evidence and stops before the surge policy; a newer sample is looked at."""
    from specfleet.operator.control.sources import SourceReport
    from specfleet.operator.control.window import Scrape

    class Source:
        sampled = 100.0
        stale_after_s = 0.0

        async def scrape(self, namespace, endpoints):
            return ({p: Scrape(self.sampled, counters={"vllm:generation_tokens": self.sampled}) for p in endpoints},
                    SourceReport("prometheus", "Prometheus", "test", True))

    source = Source()
    looked = []
    real = loop.detect_step
    monkeypatch.setattr(loop, "detect_step", lambda *a, **kw: looked.append(a[0]) or real(*a, **kw))
    ctl = runner.ServiceControl("ns", "chat", RunnerKube(), loop.LoopConfig(interval_s=15.0), source=source)
    pods = [EnginePod("ns", "chat", "chat-0", "http://127.0.0.1:1", None)]
    assert asyncio.run(ctl.interval(body, pods, (1, 1), "t")) is not None
    assert asyncio.run(ctl.detect(body, pods, (1, 1), "t")) is None and looked == []
    source.sampled = 105.0
    asyncio.run(ctl.detect(body, pods, (1, 1), "t"))
    assert len(looked) == 1 and looked[0].seconds == 5.0
