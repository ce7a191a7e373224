"""Calibration of a running service: refine its step cost from the engines' step times.

`recalibrate` takes the engines' step-time histograms (`Window.steps`, one mean step per batch bucket,
at the window's depth and draft share: `recalibrate_from`) and moves the service model's cost toward them:

- on a measured profile: each step kind's scale (plain, speculative) moves `BLEND` of the way toward
  observed / predicted, within [1/5, 5] of the profile; a window with one kind only moves both alike
  (`step_cost.refine`);
- on the roofline: BW_eff / FLOPS_eff / t_fixed are refitted, blended with the previous fit and
  bounded to a sane range of the prior (`perfmodel.fit_calibration`).

Either way the model's `calibration` then says `online`, the profile it started from (if any), and the
refined cost's relative RMS error against the steps just observed. What a replica carries with that
cost is `specfleet.operator.capacity`.
"""
from __future__ import annotations

import math
from dataclasses import replace

from specfleet.operator import perfmodel as pm
from specfleet.operator import step_cost
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.control.window import StepStat, Window
from specfleet.operator.step_cost import CostSource, ObservedStep

MIN_STEPS = 20          # steps per bucket before a bucket counts as evidence
BLEND = 0.5             # weight of a new fit against the previous calibration
BOUND = 5.0             # a fit stays within [prior / BOUND, prior x BOUND]


def recalibrate_from(model: ServiceModel, window: Window, k: int) -> ServiceModel:
    """`recalibrate` on a window's steps at the depth and draft share the window measured (`k`, the
    controller's depth, where it did not): what the operator and both simulators call each interval."""
    return recalibrate(model, window.steps, window.num_speculative_tokens or k, window.draft_share)


def recalibrate(model: ServiceModel, steps: tuple[StepStat, ...], k: int,
                draft_share: float | None = None) -> ServiceModel:
    """The model with its cost refined toward observed step times (unchanged without evidence).
    `draft_share`: the window's share of decoding sequence-steps that drafted (None: every one did)."""
    evidence = [s for s in steps if s.steps >= MIN_STEPS and s.seconds > 0]
    share = 1.0 if draft_share is None else draft_share
    if model.profile is not None:
        return _refine_profile(model, evidence, k, share)
    return _refit_roofline(model, evidence, k, share)


def _refine_profile(model: ServiceModel, evidence: list[StepStat], k: int, share: float) -> ServiceModel:
    observed = [_observed(s, k, share) for s in evidence]
    if not observed:
        return model
    refined = step_cost.refine(model.profile, observed, model.ctx, BLEND)
    return replace(model, profile=refined, calibration=_online(model, refined, observed))


def _refit_roofline(model: ServiceModel, evidence: list[StepStat], k: int, share: float) -> ServiceModel:
    samples = [pm.StepSample(max(1, round(s.batch)), model.ctx, _q(s, k), s.seconds) for s in evidence]
    if len({s.batch for s in samples}) < 2:
        return model
    fit = pm.fit_calibration(samples, model.shape, model.cal)
    blended = pm.Calibration(bw_eff=_mix(model.cal.bw_eff, fit.bw_eff, model.prior.bw_eff),
                             flops_eff=_mix(model.cal.flops_eff, fit.flops_eff, model.prior.flops_eff),
                             t_fixed=max(0.0, (1 - BLEND) * model.cal.t_fixed + BLEND * fit.t_fixed))
    refined = replace(model, cal=blended)
    return replace(refined, calibration=_online(model, refined.cost, [_observed(s, k, share) for s in evidence]))


def _online(model: ServiceModel, cost: pm.StepCost, observed: list[ObservedStep]) -> CostSource:
    seen = model.calibration.samples if model.calibration.source == step_cost.ONLINE else 0
    scales = (cost.decode_scale, cost.verify_scale) if isinstance(cost, step_cost.ProfileCost) else None
    return CostSource(step_cost.ONLINE, model.calibration.profile, step_cost.fit_error(cost, observed, model.ctx),
                      seen + round(sum(s.weight for s in observed)), model.calibration.reason, scales)


def _observed(s: StepStat, k: int, share: float = 1.0) -> ObservedStep:
    """A bucket's mean step: its sequences' tokens (1 + share x k while speculating: only the sequences
    with a draft verify k more) and the prompt tokens beyond. Counting k + 1 for every sequence would
    price drafts that were never made and take the prompt tokens for them."""
    batch = max(1, round(s.batch))
    q = 1 + share * k if s.speculating and k > 0 else 1
    extra = max(0, round(s.tokens - batch * q)) if s.tokens else 0
    return ObservedStep(batch, q, extra, s.seconds, s.steps)


def _q(s: StepStat, k: int) -> int:
    """Tokens per sequence in a step: from the step-token counter when known, else 1 or k + 1."""
    if s.tokens:
        return max(1, round(s.tokens / max(s.batch, 1)))
    return (k + 1) if s.speculating else 1


def _mix(old: float, new: float, prior: float) -> float:
    value = math.exp((1 - BLEND) * math.log(old) + BLEND * math.log(max(new, 1e-9)))
    return min(max(value, prior / BOUND), prior * BOUND)
