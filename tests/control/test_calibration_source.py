"""Online calibration: a profile's cost moves toward the engines' step times, the roofline is refitted,
and `status.calibration` says which source the service's model uses and how well it fits."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from cost_profiles import cpu_catalog

from specfleet.operator import api, capacity, catalogs, planner, status
from specfleet.operator.control import loop, runner
from specfleet.operator.control.discovery import EnginePod
from specfleet.operator.control.window import StepStat, Window
from specfleet.operator.cost import calibration
from specfleet.operator.cost.calibration import recalibrate, recalibrate_from
from specfleet.operator.cost.profile import SCALE_BOUND

EXAMPLE = Path(__file__).parents[2] / "manifests/examples/smollm2-cpu.yaml"


def cpu_service(profiles):
    spec = api.parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), profiles)
    return plan, capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models())


def observed(model, factor: float, batches=(4, 16), steps: float = 200, speculating=False, k=0):
    """Step-time buckets `factor` times what `model` predicts (decodes only, or verifications of k + 1)."""
    q = k + 1 if speculating else 1
    return tuple(StepStat(b, factor * model.cost.step(b, model.ctx, q), speculating, steps, float(b * q))
                 for b in batches)


def test_refinement_moves_the_profile_toward_observed_steps_and_reports_online():
    _, model = cpu_service(cpu_catalog())
    steps = observed(model, 1.6)
    refined = recalibrate(model, steps, k=1)
    before, after, seen = model.step(16), refined.step(16), steps[1].seconds
    assert before < after < seen
    cal = refined.calibration
    assert cal.source == "online" and cal.profile == "smollm2-135m--cpu" and cal.samples == 400
    assert cal.fit_error == pytest.approx(1 - 1.6 ** 0.5 / 1.6, rel=1e-6)
    again = recalibrate(refined, steps, k=1)
    assert again.calibration.samples == 800 and again.calibration.fit_error < cal.fit_error


def test_speculative_steps_alone_move_both_costs_alike():
    _, model = cpu_service(cpu_catalog())
    refined = recalibrate(model, observed(model, 0.5, speculating=True, k=3), k=3)
    assert refined.profile.decode_scale == refined.profile.verify_scale == pytest.approx(0.5 ** 0.5)


def test_speculative_steps_count_only_the_drafts_the_window_made():
    # Half the sequences drafted k = 2: 2 tokens each, not 3. Read as 3, the bucket's steps look cheap
    # for their tokens and the verify scale falls; at the window's share it stays where the steps are.
    _, model = cpu_service(cpu_catalog())
    batch, q = 8, 1 + 0.5 * 2
    seen = (StepStat(batch, model.profile.verified(batch, model.ctx, q), True, 200, batch * q),)
    assert recalibrate(model, seen, k=2, draft_share=0.5).profile.verify_scale == pytest.approx(1.0)
    assert recalibrate(model, seen, k=2).profile.verify_scale < 0.95


def test_the_window_gives_the_depth_and_draft_share_it_measured():
    _, model = cpu_service(cpu_catalog())
    batch, q = 8, 1 + 0.25 * 3
    seen = (StepStat(batch, 1.44 * model.profile.verified(batch, model.ctx, q), True, 200, batch * q),)
    window = Window(0.0, 5.0, 1, 1, draft_share=0.25, num_speculative_tokens=3, steps=seen)
    assert recalibrate_from(model, window, k=1).profile.verify_scale == pytest.approx(1.2)


def test_refinement_stays_within_bounds_of_the_profile():
    _, model = cpu_service(cpu_catalog())
    for _ in range(20):
        model = recalibrate(model, observed(model, 100.0), k=1)
    assert model.profile.decode_scale == SCALE_BOUND


def test_without_enough_steps_the_model_and_its_source_are_unchanged():
    _, model = cpu_service(cpu_catalog())
    assert recalibrate(model, observed(model, 2.0, steps=calibration.MIN_STEPS - 1), k=1) == model
    assert model.calibration.source == "profile"


def test_the_roofline_is_refitted_online_without_a_profile():
    _, model = cpu_service(catalogs.NO_PROFILES)
    assert model.calibration.source == "roofline"
    steps = observed(model, 1.3, batches=(2, 8, 32))
    refined = recalibrate(model, steps, k=1)
    assert refined.cal != model.cal and refined.profile is None
    assert refined.calibration.source == "online" and refined.calibration.profile is None
    assert refined.calibration.samples == 600 and refined.calibration.fit_error is not None


def test_a_refined_profile_moves_the_speculation_threshold_when_one_kind_is_dearer_than_the_other():
    _, model = cpu_service(cpu_catalog())
    both = observed(model, 1.0) + observed(model, 2.0, speculating=True, k=1)
    slower_verify = recalibrate(model, both, k=1)
    assert slower_verify.max_batch_for_speculation(0.6) < model.max_batch_for_speculation(0.6)
    slower_engine = recalibrate(model, observed(model, 2.0, speculating=True, k=1), k=1)   # verify steps only
    assert slower_engine.max_batch_for_speculation(0.6) == model.max_batch_for_speculation(0.6)


def test_the_planned_status_carries_the_calibration_source():
    plan, _ = cpu_service(cpu_catalog())
    st = status.planned(plan, 1, "sel", [], "2026-01-01T00:00:00Z")
    assert st["calibration"] == {"source": "profile", "profile": "smollm2-135m--cpu",
                                 "fitError": round(plan.calibration.fit_error, 4), "samples": 0}
    roofline, _ = cpu_service(catalogs.NO_PROFILES)
    rendered = status.planned(roofline, 1, "sel", [], "2026-01-01T00:00:00Z")["calibration"]
    assert rendered["source"] == "roofline" and rendered["profile"] is None and rendered["fitError"] is None
    assert "no profile" in rendered["reason"]


def test_the_control_loop_status_patch_carries_the_model_calibration(monkeypatch):
    monkeypatch.setattr(catalogs, "profiles", lambda path=None: cpu_catalog())
    body = {"metadata": {"name": "chat", "namespace": "ns", "generation": 1},
            "spec": yaml.safe_load(EXAMPLE.read_text())["spec"], "status": {}}
    ctl = runner.ServiceControl("ns", "chat", None, loop.LoopConfig(interval_s=1.0))
    pending = [EnginePod("ns", "chat", "chat-1", None, "0/1 nodes are available")]
    outcome = asyncio.run(ctl.interval(body, pending, (1, 0), "2026-01-01T00:00:00Z"))
    assert outcome.status["calibration"]["source"] == "profile"
    assert outcome.status["calibration"]["profile"] == "smollm2-135m--cpu"
