"""Calibration of a running service: refit the performance model to the engines' step times.

`recalibrate` refits BW_eff / FLOPS_eff / t_fixed from the engines' step-time histograms
(`Window.steps`), blended with the previous fit and bounded to a sane range of the prior. What a
replica carries with that calibration is `specfleet.operator.capacity`.
"""
from __future__ import annotations

import math
from dataclasses import replace

from specfleet.operator import perfmodel as pm
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.control.window import StepStat

MIN_STEPS = 20          # steps per bucket before a bucket counts as evidence
BLEND = 0.5             # weight of a new fit against the previous calibration
BOUND = 5.0             # a fit stays within [prior / BOUND, prior x BOUND]


def recalibrate(model: ServiceModel, steps: tuple[StepStat, ...], k: int) -> ServiceModel:
    """The model with its calibration refitted to observed step times (unchanged without evidence)."""
    samples = [pm.StepSample(max(1, round(s.batch)), model.ctx, _q(s, k), s.seconds)
               for s in steps if s.steps >= MIN_STEPS and s.seconds > 0]
    if len({s.batch for s in samples}) < 2:
        return model
    fit = pm.fit_calibration(samples, model.shape, model.cal)
    blended = pm.Calibration(bw_eff=_mix(model.cal.bw_eff, fit.bw_eff, model.prior.bw_eff),
                             flops_eff=_mix(model.cal.flops_eff, fit.flops_eff, model.prior.flops_eff),
                             t_fixed=max(0.0, (1 - BLEND) * model.cal.t_fixed + BLEND * fit.t_fixed))
    return replace(model, cal=blended)


def _q(s: StepStat, k: int) -> int:
    """Tokens per sequence in a step: from the step-token counter when known, else 1 or k + 1."""
    if s.tokens:
        return max(1, round(s.tokens / max(s.batch, 1)))
    return (k + 1) if s.speculating else 1


def _mix(old: float, new: float, prior: float) -> float:
    value = math.exp((1 - BLEND) * math.log(old) + BLEND * math.log(max(new, 1e-9)))
    return min(max(value, prior / BOUND), prior * BOUND)
