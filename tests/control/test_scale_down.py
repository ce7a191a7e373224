"""Choosing the pods a scale-down removes: fewest requests in flight, then least prefix-cache value."""
from __future__ import annotations

import pytest

from specfleet.operator.control import scale_down
from specfleet.operator.control.scale_down import PodLoad
from specfleet.operator.control.window import Scrape


def scrape(running: float, waiting: float = 0.0, hits: float = 0.0, t: float = 0.0) -> Scrape:
    return Scrape(t, counters={scale_down.PREFIX_HITS: hits},
                  gauges={scale_down.RUNNING: running, scale_down.WAITING: waiting})


def test_the_pods_with_fewest_requests_in_flight_go_first():
    pods = [PodLoad("a", 9), PodLoad("b", 1), PodLoad("c", 4)]
    assert [p.pod for p in scale_down.choose(pods, 2)] == ["b", "c"]


def test_among_equally_loaded_pods_the_coldest_prefix_cache_goes_first():
    pods = [PodLoad("a", 2, prefix_value=500), PodLoad("b", 2, prefix_value=10), PodLoad("c", 3)]
    assert [p.pod for p in scale_down.choose(pods, 1)] == ["b"]


def test_a_pod_that_could_not_be_scraped_goes_before_any_serving_one():
    pods = [PodLoad("a", 0), PodLoad("b", None)]
    assert [p.pod for p in scale_down.choose(pods, 1)] == ["b"]


def test_chosen_pods_get_negative_costs_in_order_and_the_rest_positive():
    pods = [PodLoad("a", 9), PodLoad("b", 1), PodLoad("c", 4)]
    assert scale_down.deletion_costs(pods, 2) == {"b": -2, "c": -1, "a": 1}
    assert scale_down.deletion_costs(pods, 0) == {"b": 1, "c": 2, "a": 3}


def test_loads_count_running_and_waiting_and_prefix_hits_since_the_previous_scrape():
    now = {"a": scrape(3, 2, hits=1000), "b": scrape(1, 0, hits=50), "c": Scrape(0.0)}
    before = {"a": scrape(0, hits=400), "b": scrape(0, hits=80)}         # b restarted: its counter began again
    loads = {p.pod: p for p in scale_down.loads(["a", "b", "c", "d"], now, before)}
    assert (loads["a"].in_flight, loads["a"].prefix_value) == (5, 600)
    assert (loads["b"].in_flight, loads["b"].prefix_value) == (1, 50)
    assert loads["c"].in_flight is None and loads["d"].in_flight is None


def test_removing_a_negative_number_of_pods_is_refused():
    with pytest.raises(ValueError, match="cannot remove -1 pods"):
        scale_down.choose([PodLoad("a", 1)], -1)


class RecordingKube:
    def __init__(self, fail: set[str] = frozenset()):
        self.calls: list[tuple] = []
        self.fail = fail

    def annotate(self, kind, namespace, name, annotations):
        if name in self.fail:
            raise RuntimeError("forbidden")
        self.calls.append(("annotate", kind, name, annotations[scale_down.DELETION_COST]))

    def scale(self, kind, namespace, name, replicas):
        self.calls.append(("scale", kind, name, replicas))

    def get(self, *a):
        return None

    def transient(self, exc):
        return False


def scale_down_to_one(monkeypatch, kube):
    """One interval of a 3-replica service whose policy decides 3 -> 1; the outcome."""
    import asyncio
    from pathlib import Path

    import yaml

    from specfleet.operator.control import autoscaler, loop, runner
    from specfleet.operator.control.discovery import EnginePod
    from specfleet.operator.control.sources import SourceReport

    in_flight = {"chat-a": (6, 1), "chat-b": (0, 0), "chat-c": (2, 0)}

    class Source:
        stale_after_s = 0.0

        async def scrape(self, namespace, endpoints):
            return ({pod: scrape(*in_flight[pod]) for pod in endpoints},
                    SourceReport("direct", "DirectScrape", "the test's in-flight counts", True))

    real = loop.decide_step

    def decide(*args, **kw):
        step = real(*args, **kw)
        step.scale = autoscaler.ScaleDecision(3, 1, "LoadDecrease", "test")
        return step

    monkeypatch.setattr(loop, "decide_step", decide)
    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "manifests/examples/smollm2-cpu.yaml").read_text())["spec"]
    body = {"metadata": {"name": "chat", "namespace": "sd", "generation": 1}, "spec": spec, "status": {}}
    ctl = runner.ServiceControl("sd", "chat", kube, loop.LoopConfig(interval_s=15.0), source=Source())
    pods = [EnginePod("sd", "chat", name, f"http://127.0.0.1:{i + 1}", None) for i, name in enumerate(in_flight)]
    return asyncio.run(ctl.interval(body, pods, (3, 3), "2026-01-01T00:00:00Z"))


def test_the_least_loaded_pods_are_marked_before_replicas_are_lowered(monkeypatch):
    kube = RecordingKube()
    outcome = scale_down_to_one(monkeypatch, kube)
    *marks, last = kube.calls
    assert last == ("scale", "Deployment", "chat", 1)
    assert sorted(marks) == [("annotate", "Pod", "chat-a", "1"), ("annotate", "Pod", "chat-b", "-2"),
                             ("annotate", "Pod", "chat-c", "-1")]
    chosen = [m for _, r, m in outcome.events if r == "PodsChosen"]
    assert chosen and "chat-b (0 in flight), chat-c (2 in flight)" in chosen[0]


def test_a_failed_mark_is_reported_and_the_scale_down_still_happens(monkeypatch):
    kube = RecordingKube(fail={"chat-b"})
    outcome = scale_down_to_one(monkeypatch, kube)
    assert kube.calls[-1] == ("scale", "Deployment", "chat", 1)
    assert [r for t, r, _ in outcome.events if t == "Warning"] == ["DeletionCostFailed"]
