"""The one question every cost answers: how long one engine step of a replica takes.

Units: seconds; token counts are ints (q may be fractional: a mean over sequences of which only some
draft). Decode is `step(batch, ctx, 1)`, verification of k drafts `step(batch, ctx, k + 1)`, and a
prefill chunk rides in a mixed step next to the running decodes (`mixed`), as chunked prefill runs it.
"""
from __future__ import annotations

from typing import Protocol


class StepCost(Protocol):
    """Seconds of one engine step of a replica: `Roofline` (cost.roofline) or `ProfileCost` (cost.profile)."""

    def step(self, batch: float, ctx: int, q: float = 1, drafting: float | None = None) -> float:
        """`batch` sequences at context `ctx`, `q` tokens each (q = 1 decode, q = k + 1 verify); `drafting`:
        the share of the sequences that draft (None: every sequence, q tokens each)."""

    def mixed(self, batch: int, ctx: int, tokens: int) -> float:
        """`batch` decodes at `ctx` plus prefill, `tokens` in all (a chunked-prefill step)."""
