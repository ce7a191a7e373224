"""The error budget wired into the control loop: the pods' SLO counters folded into fleet counts (a pod
restart resets its counter), `status.errorBudget`, the `SLOAtRisk` condition, the burn Events, and the
operator's own metrics."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from specfleet.operator.control import loop, runner, telemetry
from specfleet.operator.control.discovery import EnginePod
from specfleet.operator.control.error_budget import MET, SERVED, FleetCounts
from specfleet.operator.control.sources import SourceReport
from specfleet.operator.control.window import Scrape

ROOT = Path(__file__).resolve().parents[2]


def test_a_pod_restart_folds_in_as_the_new_count_never_a_negative_delta():
    counts = FleetCounts()
    counts.fold({"a": (90, 100), "b": (10, 10)})          # first sight: history before it is not counted
    assert (counts.good, counts.total) == (0, 0)
    counts.fold({"a": (95, 110), "b": (20, 20)})
    assert (counts.good, counts.total) == (15, 20)
    counts.fold({"a": (3, 4), "b": (25, 25)})             # a restarted: its counter began again at 0
    assert (counts.good, counts.total) == (23, 29)


def test_a_pod_missing_one_scrape_keeps_its_baseline_and_a_deleted_one_is_forgotten():
    counts = FleetCounts()
    counts.fold({"a": (10, 10), "b": (10, 10)})
    counts.fold({"a": (20, 20)}, present={"a", "b"})      # b's scrape failed; the pod still exists
    counts.fold({"a": (20, 20), "b": (15, 20)}, present={"a", "b"})
    assert (counts.good, counts.total) == (15, 20)
    counts.fold({"a": (20, 20)}, present={"a"})           # b is gone: a pod of that name later starts afresh
    assert "b" not in counts.last


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class BudgetKube:
    def scale(self, *a):
        pass

    def get(self, *a):
        return None

    def transient(self, exc):
        return False


@pytest.fixture
def body():
    doc = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
    doc["spec"]["slo"]["objective"] = 0.99
    return {"metadata": {"name": "chat", "namespace": "eb", "generation": 1}, "spec": doc["spec"], "status": {}}


def run_intervals(body, monkeypatch, counts: list[tuple[float, float]]):
    """One interval per (met, served) cumulative count of a single pod, 15 s apart; the outcomes."""
    clock, fed = Clock(), iter(counts)

    class FedSource:
        """The pod's counters as `counts` gives them, one pair per interval."""

        stale_after_s = 0.0

        async def scrape(self, namespace, endpoints):
            met, served = next(fed)
            return ({pod: Scrape(clock.t, counters={MET: met, SERVED: served}) for pod in endpoints},
                    SourceReport("direct", "DirectScrape", "fed by the test", True))

    ctl = runner.ServiceControl("eb", "chat", BudgetKube(), loop.LoopConfig(interval_s=15.0), clock=clock,
                                source=FedSource())
    pods = [EnginePod("eb", "chat", "chat-0", "http://127.0.0.1:1", None)]
    outcomes = []
    for _ in counts:
        outcomes.append(asyncio.run(ctl.interval(body, pods, (1, 1), "2026-01-01T00:00:00Z")))
        body = {**body, "status": {**body["status"], **outcomes[-1].status}}
        clock.t += 15
    return outcomes


def condition(status: dict, kind: str) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def test_half_the_requests_missing_burns_fast_sets_slo_at_risk_and_posts_one_event(body, monkeypatch):
    counts = [(50 * i, 100 * i) for i in range(5)]          # 50% met against a 99% objective: 50x burn
    outcomes = run_intervals(body, monkeypatch, counts)
    assert "errorBudget" not in outcomes[0].status           # one scrape: no served request counted yet
    budget = outcomes[-1].status["errorBudget"]
    assert budget["objective"] == 0.99 and budget["attainment"]["5m"] == 0.5
    assert budget["burnRate"]["5m"] == pytest.approx(50.0) and budget["atRisk"] is True
    at_risk = condition(outcomes[-1].status, "SLOAtRisk")
    assert at_risk["status"] == "True" and at_risk["reason"] == "FastBurn" and "fast burn" in at_risk["message"]
    burns = [e for o in outcomes for e in o.events if e[1] == "FastBurn"]
    assert len(burns) == 1 and burns[0][0] == "Warning"      # on the transition, not every interval
    sample = telemetry.REGISTRY.get_sample_value("specfleet_error_budget_burn_rate",
                                                 {"namespace": "eb", "name": "chat", "window": "5m"})
    assert sample == pytest.approx(50.0)
    assert telemetry.REGISTRY.get_sample_value("specfleet_slo_window_attainment",
                                               {"namespace": "eb", "name": "chat", "window": "1h"}) == 0.5


def test_requests_within_the_budget_are_reported_without_risk(body, monkeypatch):
    counts = [(999 * i, 1000 * i) for i in range(4)]         # 99.9% met: a tenth of the budget
    outcomes = run_intervals(body, monkeypatch, counts)
    budget = outcomes[-1].status["errorBudget"]
    assert budget["atRisk"] is False and budget["burnRate"]["5m"] == pytest.approx(0.1)
    at_risk = condition(outcomes[-1].status, "SLOAtRisk")
    assert at_risk["status"] == "False" and at_risk["reason"] == "WithinBudget"
    assert not [e for o in outcomes for e in o.events if e[1].endswith("Burn")]


def test_a_restarted_pod_does_not_read_as_a_burst_of_misses(body, monkeypatch):
    counts = [(0, 0), (100, 100), (200, 200), (5, 5), (105, 105)]   # restart between the 3rd and 4th
    outcomes = run_intervals(body, monkeypatch, counts)
    budget = outcomes[-1].status["errorBudget"]
    assert budget["attainment"]["5m"] == 1.0 and budget["burnRate"]["5m"] == 0.0


def test_a_fast_burn_that_stops_turns_slow_then_clears_each_reported_once(model):
    st = loop.ServiceLoop(1, model)
    met = served = 0.0
    events, conds = [], {}
    for i in range(160):                     # 5 min at 50% met, then 35 min all met (15 s intervals)
        t = 1000.0 + 15 * i
        served += 100
        met += 50 if i < 20 else 100
        _, cond, new = loop.observe_budget(st, {"p": Scrape(t, counters={MET: met, SERVED: served})}, {"p"}, t, 0.99)
        events += [reason for _, reason, _ in new]
        conds[i] = cond and (cond.status, cond.reason)
    # the 5m window clears first (fast burn over); the 30m window still burns (slow); then it clears too
    assert events == ["FastBurn", "SlowBurn", "BurnStopped"]
    assert conds[0] is None                   # one scrape: nothing served yet
    assert conds[19] == ("True", "FastBurn") and conds[60] == ("False", "SlowBurn")
    assert conds[159] == ("False", "WithinBudget")
