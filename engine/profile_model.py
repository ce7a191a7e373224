"""Engine cost profile: the step-time fit (numpy, no torch) over the points `specfleet engine profile` measures.

The format and T(batch, context, q) from fitted coefficients are pure Python in `profile_format`
(re-exported here): that is all the operator imports, so its image needs no numpy. Per step kind
(decode, verify, prefill) the fit is

    T = a + (s + sc * context) * batch + b * tokens + b2 * max(tokens - knee, 0) + c * tokens * context
                                                              tokens: computed per step (batch * q)

by least squares on the relative error, which it reports as the relative RMS error on the points of its
kind. Decode and verification are fitted together: they share the per-sequence cost s (host work per
sequence: scheduling, sampling or verification, advancing it, its text), the per-token cost b and the
attention costs, and differ in their fixed cost a. Attention costs c per query token per context token
(computing the scores: what bounds it on a CPU) and sc per sequence per context token (reading the
sequence's KV once, whatever its q: what bounds it where memory does, a GPU's decode). A decode step
alone cannot tell s from b, or sc from c (tokens = batch); the verification points, computing q tokens
per sequence, can. The per-token cost may change at a knee (b2 != 0): on a CPU a step of few rows runs
the few-row linear kernel and a larger one oneDNN's GEMM, whose cost per row differs; the knee is the
measured token count that fits best, and none unless it fits visibly better. Prefill chunks (one
sequence) are fitted alone, s = sc = 0, no knee. A fit needs more points than parameters (with as many,
it passes through every point and reports an error of 0) and points that tell its parameters apart:
otherwise it raises ValueError with the counts, rather than return lstsq's silent minimum-norm split.
"""
from __future__ import annotations

import math

import numpy as np

from specfleet.engine.profile_format import (PROFILE_VERSION, STEP_KINDS, Acceptance, Profile, StepFit, StepPoint,
                                             from_json, load, save)

__all__ = ["PROFILE_VERSION", "STEP_KINDS", "Acceptance", "Profile", "StepFit", "StepPoint", "fit_decode_and_verify",
           "fit_profile", "fit_steps", "from_json", "left_out", "load", "points_needed", "save"]

MIN_KNEE_GAIN = 0.005        # relative RMS error a knee must remove to be kept: a visible bend, not noise
STEP_PARAMETERS = 3          # a fit of one kind: a, b, c
JOINT_PARAMETERS = 6         # decode and verify together: a per kind, s, b, c, sc (a knee adds b2 and its place)
MIN_PER_KIND = 3             # points of each kind the joint fit takes (its fixed cost per kind, s apart from b)


def fit_steps(points: list[StepPoint]) -> StepFit:
    """Least-squares a, b, c over the points of one kind; the error is relative RMS of the prediction.
    ValueError when the points cannot determine the fit (`_check_points`)."""
    kind = points[0].kind if points else "step"
    _check_points(f"a {kind} fit", STEP_PARAMETERS, len(points))
    tokens, context, measured = _columns(points)
    design = np.column_stack([np.ones_like(tokens), tokens, tokens * context])
    _check_rank(f"the {len(points)} {kind} points", design, "a, b, c",
                "measure at least two token counts and two contexts")
    coef = _relative_lstsq(design, measured)
    return StepFit(float(coef[0]), float(coef[1]), float(coef[2]), _error(design @ coef, measured), len(points))


def points_needed(parameters: int) -> int:
    """Points a fit of `parameters` needs: one more, or it passes through every point and its error is 0
    whatever the machine did (a fit that says nothing, priced as a perfect one)."""
    return parameters + 1


def _check_points(what: str, parameters: int, count: int) -> None:
    if count < points_needed(parameters):
        raise ValueError(f"{what} has {parameters} parameters and needs at least {points_needed(parameters)} "
                         f"points, got {count}")


def _check_rank(what: str, design: np.ndarray, names: str, remedy: str) -> None:
    """A design that cannot tell its coefficients apart gets a minimum-norm answer from lstsq, silently: its
    split between them (per token or per context token?) is arbitrary, and so is every price off the points."""
    rank = _rank(design)
    if rank < design.shape[1]:
        raise ValueError(f"{what} do not tell the fit's {design.shape[1]} parameters ({names}) apart (rank {rank}): "
                         f"{remedy}")


def _rank(design: np.ndarray) -> int:
    """The rank with each column scaled to unit norm: a per-token column (~100) beside a per-token-per-context
    one (~1e5) must not look dependent for its scale alone."""
    norms = np.linalg.norm(design, axis=0)
    return int(np.linalg.matrix_rank(design / np.where(norms > 0, norms, 1.0)))


def fit_decode_and_verify(decode: list[StepPoint], verify: list[StepPoint]) -> dict[str, StepFit]:
    """One least-squares fit over both kinds: shared s, sc, b, c and knee; a fixed cost per kind. Each measured
    token count with two others on either side is tried as the knee (where the points outnumber the two
    more parameters it brings); the fit with the lowest relative RMS error over all points wins if it is
    MIN_KNEE_GAIN below the fit without a knee."""
    if len(decode) < MIN_PER_KIND or len(verify) < MIN_PER_KIND:
        raise ValueError(f"the joint decode/verify fit needs at least {MIN_PER_KIND} points of each kind, got "
                         f"{len(decode)} decode and {len(verify)} verify")
    _check_points("the joint decode/verify fit", JOINT_PARAMETERS, len(decode) + len(verify))

    def error(fit: dict[str, StepFit]) -> float:
        return math.sqrt((fit["decode"].rel_rms_error ** 2 * len(decode)
                          + fit["verify"].rel_rms_error ** 2 * len(verify)) / (len(decode) + len(verify)))

    counts = sorted(set(_columns(decode + verify)[0].tolist()))
    knees = counts[2:-2] if len(decode) + len(verify) >= points_needed(JOINT_PARAMETERS + 2) else []
    straight = _joint_fit(decode, verify, None)
    bent = min((f for f in (_joint_fit(decode, verify, knee) for knee in knees) if f is not None), key=error,
               default=straight)
    return bent if error(bent) < error(straight) - MIN_KNEE_GAIN else straight


def _joint_fit(decode: list[StepPoint], verify: list[StepPoint], knee: float | None) -> dict[str, StepFit] | None:
    """The joint fit with a knee at `knee` tokens (None: no knee; ValueError if the points cannot determine
    it). None for a knee the points cannot place."""
    points = decode + verify
    tokens, context, measured = _columns(points)
    batch = np.array([p.batch for p in points], dtype=float)
    is_verify = np.array([0.0] * len(decode) + [1.0] * len(verify))
    past_knee = np.maximum(tokens - knee, 0.0) if knee is not None else np.zeros_like(tokens)
    design = np.column_stack([1 - is_verify, is_verify, batch, tokens, tokens * context, past_knee, batch * context])
    if knee is None:
        _check_rank(f"the {len(decode)} decode and {len(verify)} verify points", np.delete(design, 5, axis=1),
                    "a per kind, s, b, c, sc", "measure at least two batches, two contexts and two depths")
    elif _rank(design) < design.shape[1]:
        return None
    coef = _relative_lstsq(design, measured)
    predicted = design @ coef
    n = len(decode)
    shared = dict(b=float(coef[3]), c=float(coef[4]), s=float(coef[2]), knee=float(knee or 0.0),
                  b2=float(coef[5]) if knee is not None else 0.0, sc=float(coef[6]))
    return {"decode": StepFit(float(coef[0]), rel_rms_error=_error(predicted[:n], measured[:n]), num_points=n,
                              **shared),
            "verify": StepFit(float(coef[1]), rel_rms_error=_error(predicted[n:], measured[n:]),
                              num_points=len(verify), **shared)}


def _columns(points: list[StepPoint]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.array([p.computed for p in points], dtype=float)
    context = np.array([p.context for p in points], dtype=float)
    return tokens, context, np.array([p.median_s for p in points], dtype=float)


def _relative_lstsq(design: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Coefficients that minimize the relative error the fit reports: each point's row divided by its
    measured time. Plain least squares lets the slowest steps decide, and steps that cost a tenth of
    them come out tens of percent off."""
    coef, *_ = np.linalg.lstsq(design / measured[:, None], np.ones_like(measured), rcond=None)
    return coef


def _error(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(math.sqrt(np.mean(((predicted - measured) / measured) ** 2)))


def fit_profile(points: list[StepPoint]) -> dict[str, StepFit]:
    """The fits of a profile's points: decode and verify together where both kinds have the points for it,
    each alone otherwise, prefill alone. ValueError when the decode steps cannot be fitted (a profile that
    cannot price a decode step prices nothing); a verify or prefill kind with too few points is left out
    (`left_out` says why)."""
    by_kind = {kind: [p for p in points if p.kind == kind] for kind in STEP_KINDS}
    decode, verify, prefill = by_kind["decode"], by_kind["verify"], by_kind["prefill"]
    alone = points_needed(STEP_PARAMETERS)
    if _joint_possible(len(decode), len(verify)):
        fits = fit_decode_and_verify(decode, verify)
    elif len(decode) < alone:
        raise ValueError(
            f"cannot fit the decode steps: {len(decode)} decode and {len(verify)} verify points; a decode fit alone "
            f"has {STEP_PARAMETERS} parameters (a, b, c) and needs at least {alone} points, one with the verify "
            f"steps has {JOINT_PARAMETERS} and needs at least {MIN_PER_KIND} of each kind and "
            f"{points_needed(JOINT_PARAMETERS)} in all")
    else:
        fits = {"decode": fit_steps(decode)}
        if len(verify) >= alone:
            fits["verify"] = fit_steps(verify)
    if len(prefill) >= alone:
        fits["prefill"] = fit_steps(prefill)
    return fits


def _joint_possible(decode: int, verify: int) -> bool:
    return min(decode, verify) >= MIN_PER_KIND and decode + verify >= points_needed(JOINT_PARAMETERS)


def left_out(points: list[StepPoint], fits: dict[str, StepFit]) -> list[str]:
    """Why each measured kind `fit_profile` did not fit is missing: its points against what a fit needs."""
    counts = {kind: sum(p.kind == kind for p in points) for kind in STEP_KINDS}
    return [f"{kind}: not fitted, {counts[kind]} points; a {kind} fit has {STEP_PARAMETERS} parameters and needs "
            f"at least {points_needed(STEP_PARAMETERS)}" for kind in STEP_KINDS if counts[kind] and kind not in fits]
