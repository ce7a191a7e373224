"""What a step cost says about a replica's engine limits: the batch that holds the ITL target, the
prefill chunk (token budget) that holds both targets, and how long a prompt takes to prefill.
"""
from __future__ import annotations

import math
from typing import Callable

from specfleet.operator.cost.interface import StepCost


def max_num_seqs(cost: StepCost, kv_per_token: int, ctx: int, itl_s: float, pool_bytes: float,
                 limit: int = 1024) -> int:
    """Largest B with T(B, ctx, 1) <= ITL and B.ctx.kv_per_token within the pool (0: none)."""
    by_memory = int(max(pool_bytes, 0) // (ctx * kv_per_token))
    cap = min(by_memory, limit)
    if cap < 1 or cost.step(1, ctx) > itl_s:
        return 0
    fits = lambda b: cost.step(b, ctx) <= itl_s  # noqa: E731
    return cap if fits(cap) else bisect_last(fits, 1, cap)


def prefill_time(cost: StepCost, prompt: int, chunk: int, batch: int, ctx: int) -> float:
    """Time to prefill `prompt` tokens in chunks of `chunk` tokens, each step also decoding `batch`."""
    room = max(chunk - batch, 1)
    return math.ceil(prompt / room) * cost.mixed(batch, ctx, chunk)


def token_budget(cost: StepCost, batch: int, ctx: int, prompt: int, itl_s: float, ttft_s: float,
                 limit: int = 16384) -> int:
    """Largest chunk C (a multiple of 16, >= batch + 16) keeping a mixed step within the ITL target.

    Returns 0 when no chunk keeps the ITL target, or when even the largest one misses the TTFT target.
    """
    floor = _round_up(batch + 16, 16)
    if cost.mixed(batch, ctx, floor) > itl_s:
        return 0
    fits = lambda c: cost.mixed(batch, ctx, c * 16) <= itl_s  # noqa: E731
    top = limit // 16
    chunk = 16 * (top if fits(top) else bisect_last(fits, floor // 16, top))
    return chunk if prefill_time(cost, prompt, chunk, batch, ctx) <= ttft_s else 0


def bisect_last(pays: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest b in [lo, hi) with pays(b), given pays(lo) and not pays(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m
