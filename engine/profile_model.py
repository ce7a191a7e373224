"""Engine cost profile: the versioned JSON format, the step-time fit, and T(batch, context, q).

Pure (numpy only, no torch): the operator can load a profile written by `specfleet engine profile`
(engine/profiler.py) without importing the engine. Per step kind (decode, verify, prefill) the fit is

    T = a + b * tokens + c * tokens * context        tokens = batch * q

by least squares, with its relative RMS error on the points it was fitted on.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

PROFILE_VERSION = 1
STEP_KINDS = ("decode", "verify", "prefill")


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


@dataclass(frozen=True)
class StepFit:
    a: float                 # seconds per step
    b: float                 # seconds per token
    c: float                 # seconds per token per context token (attention)
    rel_rms_error: float
    num_points: int

    def seconds(self, batch: int, context: int, q: int) -> float:
        tokens = batch * q
        return self.a + self.b * tokens + self.c * tokens * context


@dataclass(frozen=True)
class Acceptance:
    """n-gram speculation on one prompt set: accepted / drafted tokens at depth k."""
    workload: str
    k: int
    draft_tokens: int
    accepted_tokens: int

    @property
    def rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


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
               "acceptance": [dict(asdict(a), rate=a.rate) for a in self.acceptance]}
        return out


def fit_steps(points: list[StepPoint]) -> StepFit:
    """Least-squares a, b, c over the points; the error is relative RMS of the prediction."""
    if len(points) < 3:
        raise ValueError(f"a fit needs at least 3 points, got {len(points)}")
    tokens = np.array([p.batch * p.q for p in points], dtype=float)
    context = np.array([p.context for p in points], dtype=float)
    measured = np.array([p.median_s for p in points], dtype=float)
    design = np.column_stack([np.ones_like(tokens), tokens, tokens * context])
    coef, *_ = np.linalg.lstsq(design, measured, rcond=None)
    relative = (design @ coef - measured) / measured
    return StepFit(float(coef[0]), float(coef[1]), float(coef[2]),
                   float(math.sqrt(np.mean(relative ** 2))), len(points))


def fit_profile(points: list[StepPoint]) -> dict[str, StepFit]:
    by_kind = {kind: [p for p in points if p.kind == kind] for kind in STEP_KINDS}
    return {kind: fit_steps(pts) for kind, pts in by_kind.items() if len(pts) >= 3}


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
            acceptance=[Acceptance(a["workload"], a["k"], a["draft_tokens"], a["accepted_tokens"])
                        for a in data.get("acceptance", [])])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed profile: {exc}") from exc


def load(path: str | Path) -> Profile:
    return from_json(json.loads(Path(path).read_text()))


def save(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_json(), indent=2) + "\n")
