"""Engine cost profile: the versioned JSON format, the step-time fit, and T(batch, context, q).

Pure (numpy only, no torch): the operator can load a profile written by `specfleet engine profile`
(engine/profiler.py) without importing the engine. Per step kind (decode, verify, prefill) the fit is

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

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

PROFILE_VERSION = 1
STEP_KINDS = ("decode", "verify", "prefill")
MIN_KNEE_GAIN = 0.005        # relative RMS error a knee must remove to be kept: a visible bend, not noise


@dataclass(frozen=True)
class StepPoint:
    """One measured step: `batch` sequences, each computing `q` tokens at `context` tokens of KV."""
    kind: str
    batch: int
    context: int
    q: int
    median_s: float
    spread_s: float          # max - min over the repeats
    repeats: int
    tokens: float | None = None   # mean tokens the timed steps computed (None: batch * q)

    @property
    def computed(self) -> float:
        return self.tokens if self.tokens is not None else self.batch * self.q


@dataclass(frozen=True)
class StepFit:
    a: float                 # seconds per step
    b: float                 # seconds per token
    c: float                 # seconds per token per context token (attention)
    rel_rms_error: float
    num_points: int
    s: float = 0.0           # seconds per sequence, whatever its q
    knee: float = 0.0        # tokens per step past which each token costs b + b2
    b2: float = 0.0
    sc: float = 0.0          # seconds per sequence per context token: its KV read once, whatever its q

    def seconds(self, batch: float, context: float, q: float) -> float:
        """q may be fractional: the mean tokens per sequence of a step where only some sequences draft."""
        tokens = batch * q
        past = np.maximum(tokens - self.knee, 0.0) if isinstance(tokens, np.ndarray) else max(tokens - self.knee, 0.0)
        bend = self.b2 * past if self.b2 else 0.0          # arrays (the simulator) stay arrays, floats floats
        return self.a + (self.s + self.sc * context) * batch + self.b * tokens + bend + self.c * tokens * context

    @property
    def b_past_knee(self) -> float:
        """Seconds per token in a step of many tokens (a prompt chunk's)."""
        return self.b + self.b2


@dataclass(frozen=True)
class Acceptance:
    """n-gram speculation on one prompt set: accepted / drafted tokens at depth k."""
    workload: str
    k: int
    draft_tokens: int
    accepted_tokens: int
    drafts: int | None = None             # sequence-steps that verified a draft
    decode_seq_steps: int | None = None   # sequence-steps that decoded or verified

    @property
    def rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def draft_share(self) -> float | None:
        """Drafted tokens per k decoding sequence-steps: n-gram drafts only where the context has a match,
        and then maybe fewer than k tokens (None: not measured)."""
        if not self.decode_seq_steps:
            return None
        return self.draft_tokens / (self.k * self.decode_seq_steps)


@dataclass
class Profile:
    model: str
    device: str
    dtype: str
    host: dict
    engine_commit: str
    created: str
    points: list[StepPoint]
    fit: dict[str, StepFit]
    acceptance: list[Acceptance] = field(default_factory=list)
    version: int = PROFILE_VERSION

    def step_seconds(self, batch: int, context: int, q: int = 1) -> float:
        """Predicted decode (q = 1) or verification (q = k + 1) step time."""
        kind = "decode" if q == 1 else "verify"
        if kind not in self.fit:
            raise KeyError(f"the profile has no fit for {kind} steps")
        return self.fit[kind].seconds(batch, context, q)

    def prefill_seconds(self, chunk_tokens: int, context: int) -> float:
        return self.fit["prefill"].seconds(1, context, chunk_tokens)

    def to_json(self) -> dict:
        out = {"version": self.version, "model": self.model, "device": self.device, "dtype": self.dtype,
               "host": self.host, "engine_commit": self.engine_commit, "created": self.created,
               "points": [asdict(p) for p in self.points],
               "fit": {kind: asdict(f) for kind, f in self.fit.items()},
               "acceptance": [dict(asdict(a), rate=a.rate, draft_share=a.draft_share) for a in self.acceptance]}
        return out


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


def from_json(data: dict) -> Profile:
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise ValueError(f"profile version {version!r} is not supported (expected {PROFILE_VERSION})")
    try:
        return Profile(
            model=data["model"], device=data["device"], dtype=data["dtype"], host=data["host"],
            engine_commit=data["engine_commit"], created=data["created"],
            points=[StepPoint(**p) for p in data["points"]],
            fit={kind: StepFit(**f) for kind, f in data["fit"].items()},
            acceptance=[Acceptance(a["workload"], a["k"], a["draft_tokens"], a["accepted_tokens"], a.get("drafts"),
                                   a.get("decode_seq_steps"))
                        for a in data.get("acceptance", [])])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed profile: {exc}") from exc


def load(path: str | Path) -> Profile:
    return from_json(json.loads(Path(path).read_text()))


def save(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_json(), indent=2) + "\n")
