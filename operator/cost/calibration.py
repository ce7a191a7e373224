"""Calibration: fit a step cost to observed step times, offline and online.

`fit_calibration` fits the roofline's BW_eff, FLOPS_eff and t_fixed to step samples in one least-squares
fit (the simulator's baselines fit it to their truth). `recalibrate` refines a running service's cost
from the engines' step-time histograms (`Window.steps`, one mean step per batch bucket, at the window's depth and draft
share: `recalibrate_from`), what the operator and both simulators call each interval:

- on a measured profile: each step kind's scale (plain, speculative) moves `BLEND` of the way toward
  observed / predicted, within [1/5, 5] of the profile; a window with one kind only moves both alike
  (`cost.profile.refine`);
- on the roofline: BW_eff / FLOPS_eff / t_fixed are refitted, blended with the previous fit and
  bounded to a sane range of the prior.

Either way the model's `calibration` then says `online`, the profile it started from (if any), and the
refined cost's relative RMS error against the steps just observed. The service model (`capacity.
ServiceModel`) and the window (`control.window`) are read through the protocols below, so this layer
imports neither.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol, Sequence, TypeVar

from specfleet.operator.cost.interface import StepCost
from specfleet.operator.cost.observed import ObservedStep, fit_error
from specfleet.operator.cost.profile import ProfileCost, refine
from specfleet.operator.cost.roofline import Calibration, step_bytes, token_flops
from specfleet.operator.cost.shapes import Architecture
from specfleet.operator.cost.source import ONLINE, CostSource

MIN_STEPS = 20          # steps per bucket before a bucket counts as evidence
BLEND = 0.5             # weight of a new fit against the previous calibration
BOUND = 5.0             # a fit stays within [prior / BOUND, prior x BOUND]


@dataclass(frozen=True)
class StepSample:
    """One observed engine step, the input of `fit_calibration`."""

    batch: int
    ctx: int
    q: int
    seconds: float


class StepStatLike(Protocol):
    """A window's mean step of one batch bucket (`control.window.StepStat`)."""

    batch: float
    seconds: float
    speculating: bool
    steps: float
    tokens: float | None


class WindowLike(Protocol):
    """What `recalibrate_from` reads of a window (`control.window.Window`)."""

    steps: tuple[StepStatLike, ...]
    num_speculative_tokens: int | None
    draft_share: float | None


class CostedModel(Protocol):
    """A dataclass holding a service's cost (`capacity.ServiceModel`)."""

    shape: Architecture
    cal: Calibration
    prior: Calibration
    ctx: int
    profile: ProfileCost | None
    calibration: CostSource

    @property
    def cost(self) -> StepCost: ...


M = TypeVar("M", bound=CostedModel)


def recalibrate_from(model: M, window: WindowLike, k: int) -> M:
    """`recalibrate` on a window's steps at the depth and draft share the window measured (`k`, the
    controller's depth, where it did not)."""
    return recalibrate(model, window.steps, window.num_speculative_tokens or k, window.draft_share)


def recalibrate(model: M, steps: Sequence[StepStatLike], k: int, draft_share: float | None = None) -> M:
    """The model with its cost refined toward observed step times (unchanged without evidence).
    `draft_share`: the window's share of decoding sequence-steps that drafted (None: every one did)."""
    evidence = [s for s in steps if s.steps >= MIN_STEPS and s.seconds > 0]
    share = 1.0 if draft_share is None else draft_share
    if model.profile is not None:
        return _refine_profile(model, evidence, k, share)
    return _refit_roofline(model, evidence, k, share)


def _refine_profile(model: M, evidence: list[StepStatLike], k: int, share: float) -> M:
    observed = [_observed(s, k, share) for s in evidence]
    if not observed:
        return model
    refined = refine(model.profile, observed, model.ctx, BLEND)
    return replace(model, profile=refined, calibration=_online(model, refined, observed))


def _refit_roofline(model: M, evidence: list[StepStatLike], k: int, share: float) -> M:
    samples = [StepSample(max(1, round(s.batch)), model.ctx, _q(s, k), s.seconds) for s in evidence]
    if len({s.batch for s in samples}) < 2:
        return model
    fit = fit_calibration(samples, model.shape, model.cal)
    blended = Calibration(bw_eff=_mix(model.cal.bw_eff, fit.bw_eff, model.prior.bw_eff),
                          flops_eff=_mix(model.cal.flops_eff, fit.flops_eff, model.prior.flops_eff),
                          t_fixed=max(0.0, (1 - BLEND) * model.cal.t_fixed + BLEND * fit.t_fixed))
    refined = replace(model, cal=blended)
    return replace(refined, calibration=_online(model, refined.cost, [_observed(s, k, share) for s in evidence]))


def _online(model: CostedModel, cost: StepCost, observed: list[ObservedStep]) -> CostSource:
    seen = model.calibration.samples if model.calibration.source == ONLINE else 0
    scales = (cost.decode_scale, cost.verify_scale) if isinstance(cost, ProfileCost) else None
    return CostSource(ONLINE, model.calibration.profile, fit_error(cost, observed, model.ctx),
                      seen + round(sum(s.weight for s in observed)), model.calibration.reason, scales)


def _observed(s: StepStatLike, k: int, share: float = 1.0) -> ObservedStep:
    """A bucket's mean step: its sequences' tokens (1 + share x k while speculating: only the sequences
    with a draft verify k more) and the prompt tokens beyond. Counting k + 1 for every sequence would
    price drafts that were never made and take the prompt tokens for them."""
    batch = max(1, round(s.batch))
    q = 1 + share * k if s.speculating and k > 0 else 1
    extra = max(0, round(s.tokens - batch * q)) if s.tokens else 0
    return ObservedStep(batch, q, extra, s.seconds, s.steps)


def _q(s: StepStatLike, k: int) -> int:
    """Tokens per sequence in a step: from the step-token counter when known, else 1 or k + 1."""
    if s.tokens:
        return max(1, round(s.tokens / max(s.batch, 1)))
    return (k + 1) if s.speculating else 1


def _mix(old: float, new: float, prior: float) -> float:
    value = math.exp((1 - BLEND) * math.log(old) + BLEND * math.log(max(new, 1e-9)))
    return min(max(value, prior / BOUND), prior * BOUND)


def fit_calibration(samples: Sequence[StepSample], model: Architecture, prior: Calibration) -> Calibration:
    """Fit t = t_fixed + bytes / BW_eff + FLOP / FLOPS_eff to observed step times (least squares).

    At one context and depth the bytes and the FLOP of a step both grow with the batch, so only samples
    that vary the depth (verify steps) or the context tell the two rates apart. Without them, or where
    the joint fit gives a rate that is not positive, FLOPS_eff keeps the prior's value and BW_eff and
    t_fixed are fitted to the time compute leaves. Where that fails too (one batch; or steps of one
    token budget, all as long whatever their batch), the prior is scaled to the samples' mean time."""
    rows = [(step_bytes(model, s.batch, s.ctx), s.batch * s.q * token_flops(model, s.ctx), s.seconds)
            for s in samples]
    return _fit_both(rows) or _fit_bandwidth(rows, prior) or _fit_scale(rows, prior) or prior


def _fit_both(rows: list[tuple[float, float, float]]) -> Calibration | None:
    """Both rates and t_fixed, or None where bytes and FLOP move together (|correlation| ~ 1)."""
    if len(rows) < 3:
        return None
    n = len(rows)
    mb, mf, mt = (sum(r[i] for r in rows) / n for i in range(3))
    sbb = sum((b - mb) ** 2 for b, _, _ in rows)
    sff = sum((f - mf) ** 2 for _, f, _ in rows)
    sbf = sum((b - mb) * (f - mf) for b, f, _ in rows)
    det = sbb * sff - sbf ** 2
    if sbb <= 0 or sff <= 0 or det <= 1e-6 * sbb * sff:
        return None
    sbt = sum((b - mb) * (t - mt) for b, _, t in rows)
    sft = sum((f - mf) * (t - mt) for _, f, t in rows)
    per_byte, per_flop = (sff * sbt - sbf * sft) / det, (sbb * sft - sbf * sbt) / det
    if per_byte <= 0 or per_flop <= 0:
        return None
    t_fixed = max(0.0, mt - per_byte * mb - per_flop * mf)
    return Calibration(bw_eff=1 / per_byte, flops_eff=1 / per_flop, t_fixed=t_fixed)


def _fit_bandwidth(rows: list[tuple[float, float, float]], cal: Calibration) -> Calibration | None:
    """BW_eff and t_fixed at `cal`'s FLOPS_eff, or None without two distinct byte counts or a positive slope."""
    xs = [b for b, _, _ in rows]
    if len(set(xs)) < 2:
        return None
    slope, intercept = _least_squares(xs, [t - f / cal.flops_eff for _, f, t in rows])
    if slope <= 0:
        return None
    return Calibration(bw_eff=1 / slope, flops_eff=cal.flops_eff, t_fixed=max(intercept, 0.0))


def _fit_scale(rows: list[tuple[float, float, float]], cal: Calibration) -> Calibration | None:
    """`cal` with every step `observed / predicted` as long (all three parameters alike), or None."""
    predicted = sum(cal.t_fixed + b / cal.bw_eff + f / cal.flops_eff for b, f, _ in rows)
    observed = sum(t for _, _, t in rows)
    if predicted <= 0 or observed <= 0:
        return None
    ratio = observed / predicted
    return Calibration(bw_eff=cal.bw_eff / ratio, flops_eff=cal.flops_eff / ratio, t_fixed=cal.t_fixed * ratio)


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    return slope, my - slope * mx
