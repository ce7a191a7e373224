"""The simulated engines' true step cost: a measured (or labelled, derived) engine profile.

The simulator's pods run steps of the length a `specfleet.engine.profile_model.Profile` predicts for
the service's (model, accelerator), never the length of the controller's roofline: a controller
tested against its own formula learns nothing. `find_profile` looks the profile up by name
(`<model>--<accelerator>.json`, or given a CPU's host key the one measured on it) in the operator's
shipped profiles (`operator/catalogs/profiles/`, measured) and then in the simulator's own
(`sim/profiles/`, derived from published figures and labelled so in their `derived` field).

Step kinds as the engine runs them: a decode step (k = 0) costs the profile's decode fit at `batch`
tokens, a speculative step its verify fit at `batch x (1 + share x k)` tokens, where `share` is the share
of the sequences that draft k tokens (n-gram drafting finds a match only for some; the others decode one
token). A step in which no sequence has a draft runs as a decode step, so a speculative step is, in
expectation, a verify step carrying all the drafts with probability 1 - (1 - share)^batch and a decode
step otherwise (the share stands for the chance that a sequence drafts at all); a step that also prefills
costs at least the prefill fit of a full chunk (the token budget) at the service's mean context.
A verify or prefill fit that misses its own points by more than `FIT_LIMIT` (relative RMS) is not
used: that step is priced by the decode fit at the same number of tokens (one forward pass over them),
and `notes` says so, in every result that carries the truth.

A measured step is not always as long: `step_sigma` is the relative spread of one step around its
point's median that the profile saw (each point's max - min over its repeats, read as a normal's
range), which the fleet draws each pod's step time from. A derived profile (one repeat) has none.
"""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from specfleet.engine import profile_model as prof
from specfleet.engine.profile_format import host_key
from specfleet.operator.cost import (Architecture, Calibration, StepSample, alpha_from_acceptance, fit_calibration,
                                     verifying_share)

PROFILE_DIRS = (Path(resources.files("specfleet.operator.catalogs") / "profiles"),
                Path(resources.files("specfleet.sim") / "profiles"))
FIT_LIMIT = 0.5


def profile_name(model: str, accelerator: str) -> str:
    return f"{model.lower()}--{accelerator.lower()}.json"


def find_profile(model: str, accelerator: str, dirs: tuple[Path, ...] = PROFILE_DIRS, host: str = "") -> Path | None:
    """The first profile file for (model, accelerator) in `dirs`, or None. With `host` (a
    `profile_format.host_key`), the pair's file measured on that CPU (`<model>--<accelerator>--*.json`)
    comes first, as the control loop picks it for engines that report that CPU."""
    stem = profile_name(model, accelerator).removesuffix(".json")
    for d in dirs if host else ():
        for path in sorted(Path(d).glob(f"{stem}--*.json")):
            if host_key(json.loads(path.read_text()).get("host") or {}) == host:
                return path
    for d in dirs:
        path = Path(d) / profile_name(model, accelerator)
        if path.is_file():
            return path
    return None


def load_labelled(path: Path) -> tuple[prof.Profile, str]:
    """A profile and its provenance: "measured" or the file's `derived` label."""
    data = json.loads(Path(path).read_text())
    return prof.from_json(data), data.get("derived") or "measured"


@dataclass(frozen=True)
class ProfileTruth:
    """Vectorized step times of one replica from a profile, at the service's mean context and token budget."""

    profile: prof.Profile
    ctx: int
    chunk: int
    source: str = "measured"

    def __post_init__(self) -> None:
        if "decode" not in self.profile.fit:
            raise ValueError(f"profile of {self.profile.model} on {self.profile.device} has no decode fit")

    def fit(self, kind: str) -> prof.StepFit:
        """The fit a step kind is priced with: its own, or the decode fit where its own is missing or
        misses its points by more than FIT_LIMIT."""
        own = self.profile.fit.get(kind)
        return own if own is not None and own.rel_rms_error <= FIT_LIMIT else self.profile.fit["decode"]

    @property
    def step_sigma(self) -> float:
        """Relative standard deviation of one decode or verify step's time: the median over the profile's
        points of (max - min) / median, over the expected range of that many normal draws."""
        spreads = [p.spread_s / p.median_s / expected_range(p.repeats) for p in self.profile.points
                   if p.kind in ("decode", "verify") and p.repeats >= 2 and p.median_s > 0]
        return statistics.median(spreads) if spreads else 0.0

    @property
    def notes(self) -> list[str]:
        """Which step kinds are priced by the decode fit instead of their own, and why."""
        out = []
        for kind in ("verify", "prefill"):
            f = self.profile.fit.get(kind)
            if f is None or f.rel_rms_error > FIT_LIMIT:
                why = "missing" if f is None else f"error {f.rel_rms_error:.0%} > {FIT_LIMIT:.0%}"
                out.append(f"{kind} fit {why}: {kind} steps priced by the decode fit over the same tokens")
        return out

    def step(self, batch: np.ndarray, k: np.ndarray, prefilling: np.ndarray,
             share: float | np.ndarray = 1.0, pending: np.ndarray | None = None) -> np.ndarray:
        """Seconds per step for each pod: `batch` running sequences, depth `k` (0: off), prefilling or not,
        a `share` of the sequences drafting k tokens (1 + share x k tokens computed per sequence).
        A prefilling pod's step computes its sequences' tokens plus the `pending` prompt tokens it holds,
        up to the token budget (None: a full budget), priced by the prefill fit over that many tokens."""
        batch, k, share = np.asarray(batch, float), np.asarray(k, int), np.asarray(share, float)
        running = batch * (1 + share * k)
        decode = self.profile.fit["decode"].seconds(batch, self.ctx, 1)
        verifying = verifying_share(np.clip(share, 0.0, 1.0), np.maximum(batch, 1.0))
        q_verify = 1 + share * k / np.maximum(verifying, 1e-12)
        verify = verifying * self.fit("verify").seconds(batch, self.ctx, q_verify) + (1 - verifying) * decode
        step = np.where(k > 0, verify, decode)
        tokens = self.chunk if pending is None else np.minimum(self.chunk, running + np.asarray(pending, float))
        mixed = self.fit("prefill").seconds(1, self.ctx, tokens)
        return np.where(prefilling, np.maximum(step, mixed), step)

    def calibration(self, shape: Architecture, prior: Calibration) -> Calibration:
        """The roofline calibration closest to this truth (for baselines that size from the true capacity):
        `fit_calibration` over decode and verify steps at batches 1..512."""
        samples = [StepSample(b, self.ctx, q, float(self.step(np.array([b]), np.array([q - 1]),
                                                              np.array([False]))[0]))
                   for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) for q in (1, 3, 5)]
        return fit_calibration(samples, shape, prior)


def expected_range(n: int) -> float:
    """Expected max - min of n standard normal draws (Blom's approximation of the expected maximum, x 2)."""
    return 2 * statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def truth_for(model: str, accelerator: str, ctx: int, chunk: int,
              profile: prof.Profile | Path | None = None) -> ProfileTruth:
    """The truth for a service: `profile` when given (a Profile or a file), else the shipped one."""
    if isinstance(profile, prof.Profile):
        return ProfileTruth(profile, ctx, chunk, "given")
    path = Path(profile) if profile is not None else find_profile(model, accelerator)
    if path is None:
        raise FileNotFoundError(f"no engine profile for {model} on {accelerator} in "
                                f"{', '.join(str(d) for d in PROFILE_DIRS)}; measure one with "
                                f"`specfleet engine profile` or derive one (benchmarks/derive_gpu_profile.py)")
    p, source = load_labelled(path)
    return ProfileTruth(p, ctx, chunk, source)


def acceptance_alpha(profile: prof.Profile, workload: str, k: int | None = None) -> float:
    """Per-token acceptance probability of the profile's n-gram measurement for `workload` (the
    speculation model's alpha, from accepted / drafted tokens) at depth `k`, else at the deepest measured."""
    a = _acceptance(profile, workload, k)
    return alpha_from_acceptance(a.rate, a.k)


def acceptance_alphas(profile: prof.Profile, workload: str, max_k: int) -> tuple[float, ...] | float:
    """The acceptance alpha at each depth 1, 2, ... the profile measured for `workload` without a gap, up
    to `max_k`, each from its own depth's rate: a pod at depth k accepts as the measurement at k did, not as
    one alpha fitted at the deepest depth says. Without depth 1 measured, the one alpha `acceptance_alpha`
    gives at `max_k`."""
    alphas = _per_depth(profile, workload, max_k, lambda a: alpha_from_acceptance(a.rate, a.k))
    return alphas or acceptance_alpha(profile, workload, max_k)


def acceptance_share(profile: prof.Profile, workload: str, k: int | None = None) -> float:
    """Draft share of the profile's n-gram measurement for `workload` (drafted tokens per k decoding
    sequence-steps) at depth `k`, else at the deepest measured; 1.0 (every sequence-step drafts) for a
    profile too old to have measured it."""
    share = _acceptance(profile, workload, k).draft_share
    return 1.0 if share is None else share


def acceptance_shares(profile: prof.Profile, workload: str, max_k: int) -> tuple[float, ...] | float:
    """The draft share at each depth 1, 2, ... the profile measured for `workload` without a gap, up to
    `max_k` (the share falls with k: n-gram proposals are often shorter than k); without depth 1
    measured, the one share `acceptance_share` gives."""
    return _per_depth(profile, workload, max_k, lambda a: a.draft_share) or acceptance_share(profile, workload, max_k)


def _per_depth(profile: prof.Profile, workload: str, max_k: int, value) -> tuple[float, ...]:
    """`value` of the measurement at each depth 1, 2, ... up to `max_k`, up to the first depth not measured
    (or whose value is None); () without depth 1."""
    measured = {a.k: value(a) for a in profile.acceptance if a.workload == workload}
    return tuple(itertools.takewhile(lambda v: v is not None, (measured.get(j) for j in range(1, max_k + 1))))


def _acceptance(profile: prof.Profile, workload: str, k: int | None) -> prof.Acceptance:
    """The measurement for `workload` at depth `k`, else at the deepest measured."""
    found = sorted((a for a in profile.acceptance if a.workload == workload), key=lambda a: a.k)
    if not found:
        raise KeyError(f"the profile has no acceptance for workload {workload!r}; it has "
                       f"{', '.join(sorted({a.workload for a in profile.acceptance})) or 'none'}")
    return next((x for x in found if x.k == k), found[-1])
