"""The measured step cost: an engine profile's fits, scaled by what the engines were since seen to take.

`ProfileCost` prices steps with the fits T = a + b.tokens + c.tokens.context (and the per-sequence and
knee terms) per step kind of a profile that `specfleet engine profile` wrote, read as plain data with
`specfleet.engine.profile_format` (the standard library only: the operator's image has no numpy; the
fit itself is `specfleet.engine.profile_model`'s). `refine` moves its per-kind scales toward observed
step times (`cost.calibration` calls it each interval).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from specfleet.engine.profile_format import Profile, StepFit, host_key
from specfleet.operator.cost.observed import ObservedStep, predicted

SCALE_BOUND = 5.0       # an online scale stays within [1 / bound, bound] of the measured profile
MAX_FIT_ERROR = 0.25    # a step kind's fit with a larger relative RMS error over its own points is not used
MIN_SECONDS = 1e-6      # a fit's floor: a least-squares intercept may dip below zero


@dataclass(frozen=True)
class ProfileCost:
    """Step times from a measured profile's fits, scaled by what the engines were since seen to take."""

    name: str
    decode: StepFit
    verify: StepFit | None = None
    prefill: StepFit | None = None
    fit_error: float = 0.0               # the profile's own relative RMS over the points of the fits used
    num_points: int = 0
    refused: str = ""                    # fits left out for their error, and what prices those steps instead
    dtype: str = ""                      # what the engine ran while measured ("": not recorded)
    model: str = ""                      # the model it was measured on, as `--model` named it ("": not recorded)
    device: str = ""                     # "cpu" or the GPU's name as torch reports it ("": not recorded)
    host: str = ""                       # a CPU profile's host (`profile_format.host_key`; "": not recorded)
    decode_scale: float = 1.0            # online: observed / profile for plain (decode and mixed) steps
    verify_scale: float = 1.0            # online: the same for speculative steps

    def step(self, batch: float, ctx: int, q: float = 1, drafting: float | None = None) -> float:
        """q may be fractional (only some sequences draft). `drafting`: the share of the sequences that
        draft (None: all that verify, as the profile measured its verify points). A step in which none of
        the `batch` sequences has a draft runs as a decode step, so a step is a verify step only with the
        probability `verifying_share`, which then carries all the drafts; the verify fit's fixed cost is
        paid by those steps alone. A step that verifies is never priced below what the decode fit, at its
        scale, says a forward pass over the same tokens costs: the two fits' online scales move apart, and
        speculation that looks cheap because one of them is stale is how a controller flaps."""
        if q <= 1:
            return self._plain(batch, ctx, 1)
        verifying = 1.0 if drafting is None else verifying_share(min(max(drafting, 0.0), 1.0), max(batch, 1.0))
        if verifying <= 0:
            return self._plain(batch, ctx, 1)
        q_verify = 1 + (q - 1) / verifying
        spec = max(self.verified(batch, ctx, q_verify), self._plain(batch, ctx, q_verify))
        return verifying * spec + (1 - verifying) * self._plain(batch, ctx, 1) if verifying < 1 else spec

    def _plain(self, batch: float, ctx: int, q: float) -> float:
        return self.decode_scale * max(self.decode.seconds(batch, ctx, q), MIN_SECONDS)

    def verified(self, batch: float, ctx: int, q: float) -> float:
        """The verify fit alone at its scale (the decode fit's where there is none): what the verify scale
        is refined against, so that it tracks the verify steps even while the decode floor prices them."""
        fit = self.verify if self.verify is not None else self.decode
        return self.verify_scale * max(fit.seconds(batch, ctx, q), MIN_SECONDS)

    def mixed(self, batch: int, ctx: int, tokens: int) -> float:
        """The decodes' step plus the prompt tokens' share of a prefill step. A prompt chunk attends to
        the prompt before it: half of the decode context on average."""
        prompt = max(tokens - batch, 0)
        fit = self.prefill or self.decode
        extra = fit.b_past_knee * prompt + fit.c * prompt * (ctx // 2)
        return self.step(batch, ctx, 1) + self.decode_scale * max(extra, 0.0)


def verifying_share(drafting, batch):
    """Share of steps in which at least one of `batch` sequences has a draft, when each drafts with
    probability `drafting` (0..1) independently of the others. Floats or numpy arrays alike (the
    simulator's truth prices every pod's step with it)."""
    return 1.0 - (1.0 - drafting) ** batch


def profile_cost(profile: Profile, name: str) -> ProfileCost:
    """The cost of a loaded profile; ValueError when it cannot price a decode step. A verify or prefill
    fit whose own error exceeds MAX_FIT_ERROR (noisy points: a busy machine), or fitted on no more points
    than it has parameters (it passes through them all, error 0, whatever the machine did), is left out,
    and the decode fit prices those steps by their tokens."""
    if "decode" not in profile.fit:
        raise ValueError(f"profile {name!r} has no decode fit (kinds: {', '.join(sorted(profile.fit)) or 'none'})")
    decode = profile.fit["decode"]
    thin = {kind: _too_few_points(kind, profile.fit) for kind in profile.fit}
    if thin["decode"]:
        raise ValueError(f"profile {name!r}: too few points for its decode fit: {thin['decode']}; a fit needs more "
                         "points than parameters")
    if decode.rel_rms_error > MAX_FIT_ERROR:
        raise ValueError(f"profile {name!r}: its decode fit is off by {decode.rel_rms_error:.0%} (relative RMS) "
                         f"over its own points, above {MAX_FIT_ERROR:.0%}")
    fits = {kind: f for kind, f in profile.fit.items() if f.rel_rms_error <= MAX_FIT_ERROR and not thin[kind]}
    noisy = [f"{kind} ({f.rel_rms_error:.0%})" for kind, f in sorted(profile.fit.items())
             if f.rel_rms_error > MAX_FIT_ERROR]
    points = sum(f.num_points for f in fits.values())
    error = math.sqrt(sum(f.rel_rms_error ** 2 * f.num_points for f in fits.values()) / max(points, 1))
    few = [note for _, note in sorted(thin.items()) if note]
    notes = ([f"fits with a relative RMS error above {MAX_FIT_ERROR:.0%} not used, their steps priced by the "
              f"decode fit: {', '.join(noisy)}"] if noisy else [])
    notes += ([f"fits with no more points than parameters not used, their steps priced by the decode fit: "
               f"{', '.join(few)}"] if few else [])
    return ProfileCost(name, decode, fits.get("verify"), fits.get("prefill"), fit_error=error, num_points=points,
                       refused="; ".join(notes), dtype=profile.dtype, model=profile.model, device=profile.device,
                       host=host_key(profile.host or {}) if profile.device == "cpu" else "")


def _too_few_points(kind: str, fits: dict[str, StepFit]) -> str:
    """"" when the fit of `kind` had more points than parameters, else what it had. Decode and verify fitted
    together (every coefficient shared but their fixed costs) count their points and parameters together."""
    fit = fits[kind]
    points, parameters = fit.num_points, fit.parameters
    partner = fits.get({"decode": "verify", "verify": "decode"}.get(kind, ""))
    if partner is not None and _fitted_together(fit, partner):
        points, parameters = points + partner.num_points, parameters + 1
    return "" if points > parameters else f"{kind} ({parameters} parameters fitted on {points} points)"


def _fitted_together(one: StepFit, other: StepFit) -> bool:
    return (one.s, one.b, one.c, one.sc, one.knee, one.b2) == (other.s, other.b, other.c, other.sc, other.knee,
                                                               other.b2)


def refine(cost: ProfileCost, steps: Sequence[ObservedStep], ctx: int, blend: float) -> ProfileCost:
    """The profile with its per-kind scales moved `blend` of the way (in log space) toward the ratio of
    observed to predicted step time, bounded to [1 / SCALE_BOUND, SCALE_BOUND].

    A window with steps of one kind only (speculation on, or off, throughout) says how much slower than
    the profile the engine runs, not which kind is slower: the other kind's scale moves by the same
    factor, and the two keep the ratio they last had when both were seen. Moving only the observed kind
    made the state in force look dearer than the one out of it whenever the engines ran slower than the
    profile (a busy host, a batch past the profile's points): off at a priced 0.90 with the verify scale
    fresh, back on at 1.06 at a larger batch with the decode scale fresh, in the closed loop of
    docs/control.md. Speculative steps are compared with the verify fit alone (`ProfileCost.verified`),
    not with the decode floor `step` may price them at: against the floor, the verify scale would move
    without changing any price, until it jumped past the floor (a threshold of 53 one interval, 5 the
    next)."""
    plain = _ratio(cost, [s for s in steps if s.q <= 1], ctx, cost.step)
    speculative = _ratio(cost, [s for s in steps if s.q > 1], ctx, cost.verified)
    plain, speculative = (plain or speculative), (speculative or plain)
    return replace(cost, decode_scale=_moved(cost.decode_scale, plain, blend),
                   verify_scale=_moved(cost.verify_scale, speculative, blend))


def _ratio(cost: ProfileCost, steps: Sequence[ObservedStep], ctx: int, base) -> float | None:
    """Weighted geometric mean of observed / predicted, the decode/verify part priced by `base(batch, ctx,
    q)` (None: no evidence)."""
    total = sum(s.weight for s in steps)
    if total <= 0:
        return None
    logs = sum(s.weight * math.log(s.seconds / predicted(cost, s, ctx, base(s.batch, ctx, s.q))) for s in steps)
    return math.exp(logs / total)


def _moved(scale: float, ratio: float | None, blend: float) -> float:
    if ratio is None:
        return scale
    value = scale * ratio ** blend
    return min(max(value, 1 / SCALE_BOUND), SCALE_BOUND)
