"""Status patches and conditions from plans, infeasibility, invalid specs and rollouts."""
from __future__ import annotations

from specfleet.operator import planner, status

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _cond(st: dict, kind: str) -> dict:
    return next(c for c in st["conditions"] if c["type"] == kind)


def test_a_feasible_plan_reports_plan_generation_and_pending_slo(make_spec, gpus, models):
    plan = planner.plan(make_spec(), gpus, models)
    st = status.planned(plan, 3, "sel=x", [], T0)
    assert st["observedGeneration"] == 3 and st["plan"]["kvCacheBlocks"] == plan.kv_cache_blocks
    assert st["desiredReplicas"] == plan.replicas and st["selector"] == "sel=x"
    assert _cond(st, "Degraded")["status"] == "False" and _cond(st, "SLOMet")["status"] == "Unknown"
    assert {c["type"] for c in st["conditions"]} == {"Progressing", "Degraded", "SLOMet", "SpeculationActive"}


def test_infeasible_plans_are_degraded_with_the_reason_and_closest_numbers(make_spec, gpus, models):
    result = planner.plan(make_spec(slo={"itlP99Ms": 2}), gpus, models)
    st = status.planned(result, 1, "sel=x", [], T0)
    degraded = _cond(st, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ITLUnreachable"
    assert "closest feasible: itlP99Ms=" in degraded["message"] and st["phase"] == "Failed"
    assert _cond(st, "SLOMet")["status"] == "False"


def test_invalid_specs_are_degraded_and_failed():
    st = status.invalid(["spec.slo.itlP99Ms: required"], 2, [], T0)
    assert _cond(st, "Degraded")["reason"] == "InvalidSpec" and st["phase"] == "Failed"


def test_transition_time_moves_only_when_the_status_changes(make_spec, gpus, models):
    plan = planner.plan(make_spec(), gpus, models)
    first = status.planned(plan, 1, "s", [], T0)
    again = status.planned(plan, 2, "s", first["conditions"], T1)
    assert _cond(again, "Degraded")["lastTransitionTime"] == T0
    assert _cond(again, "Degraded")["observedGeneration"] == 2
    broken = status.invalid(["x"], 3, again["conditions"], T1)
    assert _cond(broken, "Degraded")["lastTransitionTime"] == T1


def test_rollout_is_ready_when_all_replicas_are_ready():
    assert _cond(status.rollout(2, 2, 1, [], T0), "Ready")["status"] == "False"
    done = status.rollout(2, 2, 2, [], T0)
    assert _cond(done, "Ready")["status"] == "True" and _cond(done, "Progressing")["status"] == "False"
    assert done["phase"] == "Ready" and done["readyReplicas"] == 2


def test_capacity_limits_keep_the_plan_but_say_degraded(make_spec, gpus, models):
    plan = planner.plan(make_spec(slo={"requestsPerSecond": 500}, autoscaling={"maxReplicas": 1}), gpus, models)
    st = status.planned(plan, 1, "s", [], T0)
    assert _cond(st, "Degraded")["reason"] == "CapacityLimited" and "plan" in st
    assert status.rollout(1, 1, 1, st["conditions"], T0)["phase"] == "Degraded"


def test_a_service_scaled_to_zero_says_so_rather_than_not_ready():
    ready = _cond(status.rollout(0, 0, 0, [], T0), "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ScaledToZero"


def test_a_patch_rebased_on_a_newer_status_keeps_both_writers_entries():
    from specfleet.operator.status import MAX_DECISIONS, rebase

    def cond(kind, reason):
        return {"type": kind, "status": "True", "reason": reason}
    read = {"conditions": [cond("Ready", "Serving"), cond("SLOMet", "Observed")],
            "lastDecisions": [{"n": i} for i in range(MAX_DECISIONS)]}
    patch = {"desiredReplicas": 3, "conditions": [cond("Ready", "Serving"), cond("SLOMet", "Missed")],
             "lastDecisions": read["lastDecisions"][1:] + [{"n": "mine"}]}
    current = {"conditions": [cond("Ready", "RolloutStuck"), cond("SLOMet", "Observed"), cond("Degraded", "Bad")],
               "lastDecisions": read["lastDecisions"][1:] + [{"n": "theirs"}]}
    rebased = rebase(patch, read, current)
    assert {c["type"]: c["reason"] for c in rebased["conditions"]} == {
        "Ready": "RolloutStuck", "SLOMet": "Missed", "Degraded": "Bad"}     # theirs, mine, theirs
    assert [c["type"] for c in rebased["conditions"]] == ["Ready", "Degraded", "SLOMet"]
    assert rebased["lastDecisions"][-2:] == [{"n": "theirs"}, {"n": "mine"}]
    assert len(rebased["lastDecisions"]) == MAX_DECISIONS and rebased["desiredReplicas"] == 3
    assert rebase({"desiredReplicas": 1}, read, current) == {"desiredReplicas": 1}
