"""Engine cost profile, the data: the versioned JSON format and T(batch, context, q) from fitted coefficients.

Pure Python (the standard library only): the operator reads the profiles that `specfleet engine profile`
writes (engine/profiler.py) and prices steps with their fitted coefficients without numpy or torch, so its
image needs neither. The fit itself (least squares, numpy) is in `profile_model`, which re-exports every
name here. Per step kind (decode, verify, prefill) a fit is

    T = a + (s + sc * context) * batch + b * tokens + b2 * max(tokens - knee, 0) + c * tokens * context
                                                              tokens: computed per step (batch * q)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

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
        bend = self.b2 * _past(tokens - self.knee) if self.b2 else 0.0
        return self.a + (self.s + self.sc * context) * batch + self.b * tokens + bend + self.c * tokens * context

    @property
    def parameters(self) -> int:
        """Coefficients this fit uses: a, b, c, plus s and sc where fitted, plus b2 and the knee's place."""
        return 3 + (self.s != 0) + (self.sc != 0) + 2 * (self.b2 != 0)

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

    def to_json(self) -> dict:
        out = {"version": self.version, "model": self.model, "device": self.device, "dtype": self.dtype,
               "host": self.host, "engine_commit": self.engine_commit, "created": self.created,
               "points": [asdict(p) for p in self.points],
               "fit": {kind: asdict(f) for kind, f in self.fit.items()},
               "acceptance": acceptance_to_json(self.acceptance)}
        return out


def acceptance_to_json(measured: list[Acceptance]) -> list[dict]:
    return [dict(asdict(a), rate=a.rate, draft_share=a.draft_share) for a in measured]


def acceptance_from_json(entries: list[dict]) -> list[Acceptance]:
    """Acceptance entries as a profile (or benchmarks/acceptance.py) writes them; KeyError or TypeError when
    malformed."""
    return [Acceptance(a["workload"], a["k"], a["draft_tokens"], a["accepted_tokens"], a.get("drafts"),
                       a.get("decode_seq_steps")) for a in entries]


def from_json(data: dict) -> Profile:
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise ValueError(f"profile version {version!r} is not supported (expected {PROFILE_VERSION}): another "
                         f"specfleet wrote it; measure again with `specfleet engine profile`")
    try:
        return Profile(
            model=data["model"], device=data["device"], dtype=data["dtype"], host=data["host"],
            engine_commit=data["engine_commit"], created=data["created"],
            points=[StepPoint(**p) for p in data["points"]],
            fit={kind: StepFit(**f) for kind, f in data["fit"].items()},
            acceptance=acceptance_from_json(data.get("acceptance", [])))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed profile: {exc}") from exc


def host_key(host: Mapping) -> str:
    """A profile's or an engine's CPU as one comparable key: vendor, family/model and vector ISA
    ("Intel 6/207 AVX512"), or the CPU's name and ISA where no family/model was recorded ("" for none).
    Cores and threads are left out: a replica's step costs per its own threads, which the profile's
    command sets. Two CPUs of one family/model share a microarchitecture, so their steps cost alike
    per core whatever the SKU's name."""
    name, isa, family = (str(host.get(key) or "").strip() for key in ("cpu", "isa", "family_model"))
    vendor = next((v for v in ("AMD", "Intel") if v.lower() in name.lower()), name)
    return " ".join(part for part in ((vendor, family) if family else (name,)) + (isa,) if part)


def load(path: str | Path) -> Profile:
    return from_json(json.loads(Path(path).read_text()))


def save(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_json(), indent=2) + "\n")


def _past(excess):
    """max(excess, 0) for a float, and elementwise for the simulator's numpy arrays (which have `clip`)."""
    return excess.clip(min=0.0) if hasattr(excess, "clip") else max(excess, 0.0)
