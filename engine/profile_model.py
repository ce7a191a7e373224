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
sequence) are fitted alone, s = sc = 0, no knee.
"""
from __future__ import annotations

import math

import numpy as np

from specfleet.engine.profile_format import (PROFILE_VERSION, STEP_KINDS, Acceptance, Profile, StepFit, StepPoint,
                                             from_json, load, save)

__all__ = ["PROFILE_VERSION", "STEP_KINDS", "Acceptance", "Profile", "StepFit", "StepPoint", "fit_decode_and_verify",
           "fit_profile", "fit_steps", "from_json", "load", "save"]

MIN_KNEE_GAIN = 0.005        # relative RMS error a knee must remove to be kept: a visible bend, not noise


def fit_steps(points: list[StepPoint]) -> StepFit:
    """Least-squares a, b, c over the points of one kind; the error is relative RMS of the prediction."""
    if len(points) < 3:
        raise ValueError(f"a fit needs at least 3 points, got {len(points)}")
    tokens, context, measured = _columns(points)
    design = np.column_stack([np.ones_like(tokens), tokens, tokens * context])
    coef = _relative_lstsq(design, measured)
    return StepFit(float(coef[0]), float(coef[1]), float(coef[2]), _error(design @ coef, measured), len(points))


def fit_decode_and_verify(decode: list[StepPoint], verify: list[StepPoint]) -> dict[str, StepFit]:
    """One least-squares fit over both kinds: shared s, sc, b, c and knee; a fixed cost per kind. Each measured
    token count with two others on either side is tried as the knee; the fit with the lowest relative
    RMS error over all points wins if it is MIN_KNEE_GAIN below the fit without a knee."""
    if len(decode) < 3 or len(verify) < 3:
        raise ValueError(f"a joint fit needs at least 3 points of each kind, got {len(decode)} and {len(verify)}")
    def error(fit: dict[str, StepFit]) -> float:
        return math.sqrt((fit["decode"].rel_rms_error ** 2 * len(decode)
                          + fit["verify"].rel_rms_error ** 2 * len(verify)) / (len(decode) + len(verify)))

    counts = sorted(set(_columns(decode + verify)[0].tolist()))
    straight = _joint_fit(decode, verify, None)
    bent = min((_joint_fit(decode, verify, knee) for knee in counts[2:-2]), key=error, default=straight)
    return bent if error(bent) < error(straight) - MIN_KNEE_GAIN else straight


def _joint_fit(decode: list[StepPoint], verify: list[StepPoint], knee: float | None) -> dict[str, StepFit]:
    points = decode + verify
    tokens, context, measured = _columns(points)
    batch = np.array([p.batch for p in points], dtype=float)
    is_verify = np.array([0.0] * len(decode) + [1.0] * len(verify))
    past_knee = np.maximum(tokens - knee, 0.0) if knee is not None else np.zeros_like(tokens)
    design = np.column_stack([1 - is_verify, is_verify, batch, tokens, tokens * context, past_knee, batch * context])
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
    by_kind = {kind: [p for p in points if p.kind == kind] for kind in STEP_KINDS}
    if len(by_kind["decode"]) >= 3 and len(by_kind["verify"]) >= 3:
        fits = fit_decode_and_verify(by_kind["decode"], by_kind["verify"])
    else:
        fits = {kind: fit_steps(by_kind[kind]) for kind in ("decode", "verify") if len(by_kind[kind]) >= 3}
    if len(by_kind["prefill"]) >= 3:
        fits["prefill"] = fit_steps(by_kind["prefill"])
    return fits
