"""A running service keeps the sizes it was rendered with until its spec changes (operator/plan_pinning.py)."""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator import planner, status
from specfleet.operator.plan_pinning import pinned


def _stored(plan: planner.Plan, generation: int, warnings: tuple[str, ...] = ()) -> dict:
    """The status an earlier release left: its plan and, with warnings, a CapacityLimited condition."""
    degraded = {"type": "Degraded", "status": "True" if warnings else "False",
                "reason": status.CAPACITY_LIMITED if warnings else "PlanFeasible", "message": "; ".join(warnings)}
    return {"observedGeneration": generation, "plan": status.plan_dict(plan), "conditions": [degraded]}


def test_the_generation_the_status_observed_keeps_the_stored_sizes(make_spec, gpus, models):
    fresh = planner.plan(make_spec(), gpus, models)
    earlier = replace(fresh, max_num_seqs=fresh.max_num_seqs + 7, kv_cache_blocks=fresh.kv_cache_blocks - 3,
                      max_num_batched_tokens=fresh.max_num_batched_tokens * 2,
                      speculation=planner.SpeculationPlan(not fresh.speculation.enabled, "ngram", 3))
    kept = pinned(fresh, _stored(earlier, 4, ("the declared load needs 9 replicas, maxReplicas is 8",)), 4)
    assert status.plan_dict(kept) == status.plan_dict(earlier)
    assert kept.warnings == ("the declared load needs 9 replicas, maxReplicas is 8",)
    assert (kept.accelerator, kept.calibration, kept.replicas) == (fresh.accelerator, fresh.calibration, fresh.replicas)


def test_a_spec_edit_plans_afresh(make_spec, gpus, models):
    fresh = planner.plan(make_spec(), gpus, models)
    earlier = replace(fresh, max_num_seqs=fresh.max_num_seqs + 7)
    assert pinned(fresh, _stored(earlier, 4), 5) is fresh
    assert pinned(fresh, {}, 1) is fresh


def test_an_unreadable_stored_plan_or_an_infeasible_one_is_left_as_planned(make_spec, gpus, models):
    fresh = planner.plan(make_spec(), gpus, models)
    broken = _stored(fresh, 2)
    del broken["plan"]["maxNumSeqs"]
    assert pinned(fresh, broken, 2) is fresh
    infeasible = planner.Infeasible("TTFTUnreachable", "no")
    assert pinned(infeasible, _stored(fresh, 2), 2) is infeasible
