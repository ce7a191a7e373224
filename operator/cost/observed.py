"""Observed engine steps against a cost: what a step cost predicts for one, and how far off it is."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from specfleet.operator.cost.interface import StepCost


@dataclass(frozen=True)
class ObservedStep:
    """The mean step of one batch bucket: `batch` sequences of `q` tokens, `extra` prompt tokens."""

    batch: int
    q: float                             # tokens per sequence: 1 + draft share x k while speculating
    extra: int
    seconds: float
    weight: float                        # steps behind the mean


def predicted(cost: StepCost, s: ObservedStep, ctx: int, base: float | None = None) -> float:
    """The cost's time of an observed step: its decode/verify part (`base` if given) plus its prompt tokens."""
    base = cost.step(s.batch, ctx, s.q) if base is None else base
    if s.extra <= 0:
        return base
    return base + cost.mixed(s.batch, ctx, s.batch + s.extra) - cost.step(s.batch, ctx, 1)


def fit_error(cost: StepCost, steps: Sequence[ObservedStep], ctx: int) -> float | None:
    """Relative RMS of the cost against observed steps, weighted by their counts (None: no steps)."""
    total = sum(s.weight for s in steps)
    if total <= 0:
        return None
    square = sum(s.weight * ((predicted(cost, s, ctx) - s.seconds) / s.seconds) ** 2 for s in steps)
    return math.sqrt(square / total)
