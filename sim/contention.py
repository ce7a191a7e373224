"""Contention: how much slower a simulated engine steps than its profile while clients share its machine.

A profile is measured with nothing else running; under `specfleet up` the engine shares the cores with
the gateway, the control plane and the load generator's clients. `benchmarks/contention.py` measures the
engine's mean step time against what the profile predicts for the same steps at fixed client counts;
`Contention` holds that slowdown factor per client count (per speculation state where measured) and
gives it at any number of clients in flight: linear between measured counts, clamped outside them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BASES = ("step_factor", "period_factor")


@dataclass(frozen=True)
class Contention:
    """Slowdown factors at ascending client counts: `off` for decode steps, `on` for verifying ones."""

    clients: tuple[float, ...]
    off: tuple[float, ...]
    on: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.clients or not len(self.clients) == len(self.off) == len(self.on):
            raise ValueError("contention needs one factor per client count for each speculation state")
        if any(b <= a for a, b in zip(self.clients, self.clients[1:])):
            raise ValueError(f"contention client counts must ascend, got {self.clients}")
        if min(self.off + self.on) <= 0:
            raise ValueError("contention factors must be > 0")

    def factor(self, clients: float | np.ndarray, speculating: bool | np.ndarray = False) -> np.ndarray:
        """The slowdown at `clients` in flight (linear between measured counts, clamped outside)."""
        off = np.interp(clients, self.clients, self.off)
        on = np.interp(clients, self.clients, self.on)
        return np.where(speculating, on, off)


def from_result(data: dict, basis: str = "step_factor", source: str = "") -> Contention:
    """The contention `benchmarks/contention.py` wrote (its `factors`): a state it did not run takes the
    other's factors; client counts only one state measured are left out."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
    states = {s: {int(c): f[basis] for c, f in v.items() if f.get(basis)} for s, v in data["factors"].items()}
    off, on = states.get("off") or states.get("on"), states.get("on") or states.get("off")
    if not off:
        raise ValueError("the contention result has no factors")
    counts = sorted(set(off) & set(on))
    return Contention(tuple(float(c) for c in counts), tuple(off[c] for c in counts), tuple(on[c] for c in counts),
                      source)


def load(path: Path | str, basis: str = "step_factor") -> Contention:
    """`from_result` of a results file."""
    return from_result(json.loads(Path(path).read_text()), basis, str(path))
