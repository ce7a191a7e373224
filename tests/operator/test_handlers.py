"""`reconcile.reconcile` against an in-memory fake of the Kube verbs: idempotence, drift, replicas; and the
handlers' `publish` (the one status writer) and wake-up from zero."""
from __future__ import annotations

import copy
import subprocess
import sys

from specfleet.operator import handlers
from specfleet.operator.plan_pinning import REPLAN
from specfleet.operator.reconcile import ReconcileOutcome, reconcile

from tests.operator.fake_kube import BASE, FakeKube, body

NOW = "2026-01-01T00:00:00Z"


def test_a_second_reconcile_writes_nothing_and_posts_no_plan_event():
    kube = FakeKube()
    first = reconcile(body(), kube, NOW)
    writes = kube.writes
    second = reconcile(body(status=first.status), kube, NOW)
    assert kube.writes == writes and second.status["plan"] == first.status["plan"]
    assert not any(reason == "Planned" for _, reason, _ in second.events)
    assert {k for k, _, _ in kube.objects} == {"Deployment", "Service", "PodDisruptionBudget", "Secret", "NetworkPolicy"}


def _max_num_seqs(kube: FakeKube) -> int:
    args = kube.objects[("Deployment", "ns", "svc")]["spec"]["template"]["spec"]["containers"][0]["args"]
    return int(args[args.index("--max-num-seqs") + 1])


def test_a_replan_annotation_renders_the_fresh_plan_once_and_records_it():
    kube = FakeKube()
    fresh = reconcile(body(), kube, NOW).status
    earlier = {**fresh, "plan": {**fresh["plan"], "maxNumSeqs": fresh["plan"]["maxNumSeqs"] + 7}}  # older pricing
    kept = reconcile(body(status=earlier), kube, NOW)
    assert kept.status["plan"] == earlier["plan"] and _max_num_seqs(kube) == earlier["plan"]["maxNumSeqs"]
    asked = body(status=earlier)
    asked["metadata"]["annotations"] = {REPLAN: "1"}
    replanned = reconcile(asked, kube, NOW)
    assert replanned.status["plan"] == fresh["plan"] and replanned.status["replanned"] == "1"
    assert _max_num_seqs(kube) == fresh["plan"]["maxNumSeqs"]
    assert [m for _, reason, m in replanned.events if reason == "Replanned"] == [
        f"planned afresh ({REPLAN}=1): maxNumSeqs {earlier['plan']['maxNumSeqs']} -> {fresh['plan']['maxNumSeqs']}"]
    asked["status"] = {**earlier, **replanned.status}
    again = reconcile(asked, kube, NOW)
    assert again.status["plan"] == fresh["plan"] and not any(r == "Replanned" for _, r, _ in again.events)


def test_drifted_args_are_restored():
    kube = FakeKube()
    reconcile(body(), kube, NOW)
    dep = kube.objects[("Deployment", "ns", "svc")]
    good = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    dep["spec"]["template"]["spec"]["containers"][0]["args"] = ["--tampered"]
    reconcile(body(), kube, NOW)
    assert kube.objects[("Deployment", "ns", "svc")]["spec"]["template"]["spec"]["containers"][0]["args"] == good


def test_autoscaled_replicas_are_kept_within_bounds():
    kube = FakeKube()
    spec = {**BASE, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    reconcile(body(spec), kube, NOW)
    kube.objects[("Deployment", "ns", "svc")]["spec"]["replicas"] = 3
    assert reconcile(body(spec), kube, NOW).status["desiredReplicas"] == 3
    kube.objects[("Deployment", "ns", "svc")]["spec"]["replicas"] = 9
    assert reconcile(body(spec), kube, NOW).status["desiredReplicas"] == 3


def test_an_invalid_spec_is_degraded_and_touches_nothing():
    kube = FakeKube()
    outcome = reconcile(body({"model": {"name": "m"}}), kube, NOW)
    assert outcome.status["phase"] == "Failed" and not kube.objects
    assert outcome.events[0][:2] == ("Warning", "InvalidSpec")


def test_the_admin_token_is_created_once():
    kube = FakeKube()
    reconcile(body(), kube, NOW)
    token = kube.objects[("Secret", "ns", "svc-admin")]["stringData"]["token"]
    reconcile(body(), kube, NOW)
    assert kube.objects[("Secret", "ns", "svc-admin")]["stringData"]["token"] == token and len(token) > 20


class StatusRecorder:
    """The status and Event verbs of Kube, recorded."""

    def __init__(self):
        self.patches: list[dict] = []
        self.events: list[tuple[str, str]] = []

    def patch_service_status(self, namespace, name, status, resource_version=None):
        self.patches.append(status)

    def post_event(self, regarding, type_, reason, message, now):
        self.events.append((regarding["kind"], reason))


def test_publish_writes_status_only_when_more_than_a_timestamp_changed():
    first = reconcile(body(), FakeKube(), NOW)
    recorder = StatusRecorder()
    handlers.publish(recorder, body(), first)
    assert recorder.patches == [first.status] and ("InferenceService", "Planned") in recorder.events
    later = ReconcileOutcome({**first.status, "conditions": [
        {**c, "lastTransitionTime": "2026-01-02T00:00:00Z"} for c in first.status["conditions"]]})
    handlers.publish(recorder, body(status=first.status), later)
    assert len(recorder.patches) == 1                         # same status, newer timestamps: no write
    handlers.publish(recorder, body(status=first.status), ReconcileOutcome({"desiredReplicas": 7}))
    assert recorder.patches[-1] == {"desiredReplicas": 7}


def test_the_operator_never_imports_torch():
    code = ("import sys, specfleet.operator.handlers, specfleet.operator.main, specfleet.cli.operator_cmds; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


PLAN_ONLY = {**BASE, "mode": "PlanOnly"}


def test_plan_only_writes_the_plan_and_the_actions_and_creates_nothing():
    kube = FakeKube()
    outcome = reconcile(body(PLAN_ONLY), kube, NOW)
    assert kube.objects == {} and kube.writes == 0
    st = outcome.status
    assert st["phase"] == "Pending" and st["plan"]["gpusPerReplica"] >= 1
    assert st["plannedActions"] == ["create Secret svc-admin", "create NetworkPolicy svc",
                                    "create Deployment svc (1 replica)",
                                    "create Service svc", "create PodDisruptionBudget svc"]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PlanOnly"
    reasons = [r for _, r, _ in outcome.events]
    assert "Planned" in reasons and "PlanOnly" in reasons and "Applied" not in reasons


def test_switching_to_serving_creates_the_workload_and_drops_the_planned_actions():
    kube = FakeKube()
    planned = reconcile(body(PLAN_ONLY), kube, NOW)
    serving = reconcile(body(BASE, generation=2, status=planned.status), kube, NOW)
    assert ("Deployment", "ns", "svc") in kube.objects and serving.status["plannedActions"] is None
    assert any(r == "Applied" for _, r, _ in serving.events)


def test_switching_a_running_service_to_plan_only_leaves_its_workload_untouched_and_says_so():
    kube = FakeKube()
    reconcile(body(BASE), kube, NOW)
    before, writes = copy.deepcopy(kube.objects), kube.writes
    slower = {**PLAN_ONLY, "slo": {**BASE["slo"], "itlP99Ms": 60}}
    outcome = reconcile(body(slower, generation=2), kube, NOW)
    assert kube.objects == before and kube.writes == writes
    leave = [a for a in outcome.status["plannedActions"] if a.startswith("leave Deployment svc running")]
    assert leave and "Serving would update it" in leave[0]
    again = reconcile(body(slower, generation=2, status=outcome.status), kube, NOW)
    assert not any(r == "PlanOnly" for _, r, _ in again.events)     # the same actions: no second Event


def _memo_at_zero():
    from types import SimpleNamespace

    class ScaleKube:
        def __init__(self):
            self.scales = []

        def scale(self, kind, namespace, name, replicas):
            self.scales.append(replicas)

    class View:
        def replicas(self, namespace, name):
            return (0, 0)
    return SimpleNamespace(kube=ScaleKube(), engines=View(), cold_starts={})


def test_held_requests_wake_a_service_once_while_the_wake_up_is_in_flight(monkeypatch):
    import asyncio

    posted = []
    monkeypatch.setattr(handlers, "publish", lambda k, b, outcome: posted.append(outcome))
    memo = _memo_at_zero()
    svc = body({**BASE, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}})
    asyncio.run(handlers._wake(memo, ("ns", "svc"), svc, 2))
    asyncio.run(handlers._wake(memo, ("ns", "svc"), svc, 3))      # the watch still reports 0: no second scale
    assert memo.kube.scales == [1] and len(posted) == 1
    assert posted[0].status["lastDecisions"][-1]["reason"] == "HeldRequests"
    started, held = memo.cold_starts[("ns", "svc")]
    memo.cold_starts[("ns", "svc")] = (started - 3600, held)       # never got ready; back at 0 since
    asyncio.run(handlers._wake(memo, ("ns", "svc"), svc, 1))
    assert memo.kube.scales == [1, 1] and memo.cold_starts[("ns", "svc")][1] == 1


def test_a_service_that_may_not_go_to_zero_is_never_woken(monkeypatch):
    import asyncio

    monkeypatch.setattr(handlers, "publish", lambda *a: None)
    memo = _memo_at_zero()
    asyncio.run(handlers._wake(memo, ("ns", "svc"), body(BASE), 5))
    assert memo.kube.scales == [] and memo.cold_starts == {}
