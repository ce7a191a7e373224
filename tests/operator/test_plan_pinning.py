"""A running service keeps the sizes it was rendered with until its spec changes (operator/plan_pinning.py)."""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator import planner, status
from specfleet.operator.plan_pinning import REPLAN, pinned, replan_asked, replanned_message


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


def test_a_replan_is_asked_by_an_annotation_value_the_status_has_not_recorded():
    annotated = {"annotations": {REPLAN: "1733600000"}}
    assert replan_asked({}, {}) == "" and replan_asked({"annotations": {REPLAN: ""}}, {}) == ""
    assert replan_asked(annotated, {}) == "1733600000"
    assert replan_asked(annotated, {"replanned": "1733600000"}) == ""
    assert replan_asked(annotated, {"replanned": "1733500000"}) == "1733600000"


def test_the_replanned_event_names_what_the_fresh_plan_changed(make_spec, gpus, models):
    fresh = status.plan_dict(planner.plan(make_spec(), gpus, models))
    earlier = {**fresh, "maxNumSeqs": fresh["maxNumSeqs"] + 7, "speculation": {**fresh["speculation"], "k": 9}}
    message = replanned_message("7", earlier, fresh)
    assert message.startswith(f"planned afresh ({REPLAN}=7): ")
    assert f"maxNumSeqs {fresh['maxNumSeqs'] + 7} -> {fresh['maxNumSeqs']}" in message
    assert f"speculation.k 9 -> {fresh['speculation']['k']}" in message and message.count(" -> ") == 2
    assert replanned_message("7", fresh, fresh).endswith("the plan is unchanged")
    assert "no plan" in replanned_message("7", fresh, None)
    assert replanned_message("7", None, fresh).endswith("no earlier plan")
