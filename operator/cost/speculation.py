"""What speculation gains at a step cost: tokens per step, goodput, the best depth, the break-even batch.

    E[tokens|a, k] = (1 - a^(k+1)) / (1 - a)          (every sequence drafts k tokens)
    goodput(k, B)  = B . E / (T(B, ctx, 1 + share.k) + T_draft(B, k))
    T_draft(B, k)  = t_fixed . (1 + (k - 1) . L_draft / L) + k . T(draft; B, ctx_draft, 1, no t_fixed)

n-gram drafting finds a match only for some sequence-steps (the draft `share`, which may fall with
the depth) and costs nothing; a draft model's phase (`draft_time_fn`) is one more engine round trip
(t_fixed), then each further forward pays the share of it its depth launches (per-layer kernels and
collectives): about one t_fixed for a one-layer EAGLE head, k of them for a full-depth draft.
`alpha_from_acceptance` turns a measured acceptance rate into the per-token probability a.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

from specfleet.operator.cost.interface import StepCost
from specfleet.operator.cost.roofline import Calibration, step_time
from specfleet.operator.cost.shapes import Architecture
from specfleet.operator.cost.sizing import bisect_last

Share = float | Sequence[float]   # one draft share, or the share at each depth 1, 2, ... (n-gram)
DraftTime = Callable[[float, int], float]   # (batch, k) -> seconds to draft k tokens for every sequence


def share_at(share: Share, k: int) -> float:
    """The draft share at depth `k`: drafted tokens per k decoding sequence-steps. An n-gram proposal is
    often shorter than k, so the share falls with k (E[min(L, k)] / k for proposal length L). Past the
    deepest measured depth D the proposals are taken to stop at D (share x D / k)."""
    if isinstance(share, (int, float)):
        return float(share)
    if k <= 0 or not share:
        return 1.0 if not share else float(share[0])
    return float(share[k - 1]) if k <= len(share) else float(share[-1]) * len(share) / k


def share_per_step(share_per_token: float, alpha: float, k: int) -> float:
    """The draft share per decoding sequence-step while speculating, from the share per token while not.

    Off, the engine proposes after every token, so its share counts token positions. On, a step at a
    position with a draft advances E[tokens | alpha, k] tokens and one without advances one: the
    positions with drafts are passed through in fewer steps, so they are a smaller share of the steps
    (s / g) / (s / g + 1 - s), g = E[tokens | alpha, k]."""
    if k <= 0 or share_per_token <= 0:
        return share_per_token
    drafted = share_per_token / expected_tokens(alpha, k)
    return drafted / (drafted + 1.0 - share_per_token)


def share_per_token(share_per_step: float, alpha: float, k: int) -> float:
    """The inverse of `share_per_step`: what the engine counts while off for a share per step while on."""
    if k <= 0 or share_per_step <= 0:
        return share_per_step
    gain = expected_tokens(alpha, k)
    return share_per_step * gain / (1.0 - share_per_step + share_per_step * gain)


def expected_tokens(alpha: float, k: int, share: Share = 1.0) -> float:
    """E[tokens per sequence-step] with acceptance `alpha` and depth `k` (k = 0: exactly one token) when
    a `share` of the sequence-steps draft (n-gram drafting finds a match only for some; the others
    decode one token)."""
    if k <= 0:
        return 1.0
    share = share_at(share, k)
    if alpha >= 1.0:
        return 1.0 + share * k
    return 1.0 + share * ((1.0 - alpha ** (k + 1)) / (1.0 - alpha) - 1.0)


def alpha_from_acceptance(rate: float, k: int) -> float:
    """Per-token acceptance probability a whose geometric process accepts `rate` of k drafted tokens.

    accepted per draft = a (1 - a^k) / (1 - a); rate = that / k. Inverted by bisection.
    """
    if k <= 0 or rate <= 0:
        return 0.0
    if rate >= 1:
        return 1.0
    target = rate * k
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        accepted = mid * k if mid >= 1 else mid * (1 - mid ** k) / (1 - mid)
        lo, hi = (mid, hi) if accepted < target else (lo, mid)
    return (lo + hi) / 2


def no_draft_cost(_batch: float, _k: int) -> float:
    """n-gram drafting runs on the host, overlapped with the step: free in this model."""
    return 0.0


def draft_time_fn(draft: Architecture, target: Architecture, cal: Calibration, ctx: int) -> DraftTime:
    """T_draft(B, k) of a draft model sharing the target's hardware (module docstring)."""
    depth = draft.num_layers / target.num_layers
    return lambda batch, k: (cal.t_fixed * (1 + (k - 1) * depth) + k * step_time(draft, cal, batch, ctx, 1, fixed=False)
                             if k > 0 else 0.0)


def spec_step_time(cost: StepCost, batch: int, ctx: int, k: int, draft: DraftTime = no_draft_cost,
                   share: Share = 1.0) -> float:
    """Wall time of one speculative step: k draft tokens, then one verify pass. A `share` of the sequences
    verify k drafts, the others decode: 1 + share x k tokens each on average (k = 0: a decode step). The
    share at depth 1 is the chance that a sequence drafts at all (a proposal of any length), which the
    cost needs to know how many steps verify."""
    if k <= 0:
        return cost.step(batch, ctx, 1)
    return cost.step(batch, ctx, 1 + share_at(share, k) * k, share_at(share, 1)) + draft(batch, k)


def goodput(cost: StepCost, batch: int, ctx: int, alpha: float, k: int, draft: DraftTime = no_draft_cost,
            share: Share = 1.0) -> float:
    """Accepted tokens per second of a replica at batch `batch` (k = 0: speculation off)."""
    return batch * expected_tokens(alpha, k, share) / spec_step_time(cost, batch, ctx, k, draft, share)


def goodputs(cost: StepCost, batch: int, ctx: int, alpha: float, max_k: int, draft: DraftTime = no_draft_cost,
             share: Share = 1.0) -> list[float]:
    """Goodput at each depth 0 (off), 1, ..., max_k."""
    return [goodput(cost, batch, ctx, alpha, k, draft, share) for k in range(max_k + 1)]


def best_k(cost: StepCost, batch: int, ctx: int, alpha: float, max_k: int, draft: DraftTime = no_draft_cost,
           share: Share = 1.0, margin: float = 0.0) -> int:
    """k* maximising goodput at `batch`; 0 unless it beats plain decoding by more than `margin` (a share
    of the plain goodput; negative: speculation may cost up to that share)."""
    rates = goodputs(cost, batch, ctx, alpha, max_k, draft, share)
    best = max(range(1, len(rates)), key=lambda k: (rates[k], -k), default=0)
    return best if best and rates[best] > rates[0] * (1 + margin + 1e-9) else 0


def max_batch_for_speculation(cost: StepCost, ctx: int, alpha: float, max_k: int, limit: int = 4096,
                              draft: DraftTime = no_draft_cost, share: Share = 1.0, margin: float = 0.0) -> int:
    """The largest batch at which speculation pays (k* > 0), up to `limit`; 0 where it never does. With
    a `margin`, the largest at which its goodput exceeds plain decoding's by that share (the edges of a
    dead band around break-even: `control.speculation`).

    The speculative/plain goodput ratio falls with the batch (the verify pass turns compute bound), but
    not always monotonically: a measured cost with a knee (few-row kernels below it, `profile_model`)
    can leave a gap of batches just below the knee where verification's extra rows cost more per token,
    with speculation paying again past it (SmolLM2's CPU profile at a = 0.5: batches 1-6 and 13-17). A
    search that stopped at the first crossing reported 6 there. So the batches are scanned on a grid
    (each one up to 32, then 1/16 apart) and the last paying one is refined by bisection."""
    def pays(b: int) -> bool:
        return best_k(cost, b, ctx, alpha, max_k, draft, share, margin) > 0

    if max_k <= 0:
        return 0
    grid = _batch_grid(limit)
    last = next((i for i in range(len(grid) - 1, -1, -1) if pays(grid[i])), None)
    if last is None:
        return 0
    return grid[last] if last == len(grid) - 1 else bisect_last(pays, grid[last], grid[last + 1])


@lru_cache(maxsize=8)
def _batch_grid(limit: int) -> tuple[int, ...]:
    grid = list(range(1, min(32, limit) + 1))
    while grid[-1] < limit:
        grid.append(min(limit, max(grid[-1] + 1, round(grid[-1] * 1.0625))))
    return tuple(grid)


def break_even_batch(cost: StepCost, ctx: int, alpha: float, k: int, limit: float = 4096.0,
                     draft: DraftTime = no_draft_cost, share: Share = 1.0) -> float:
    """The (fractional) batch at which speculating at a fixed depth k stops beating not speculating:
    0 when it never pays, `limit` when it still pays there. What a benchmark's measured crossover is
    compared with."""
    def pays(b: float) -> bool:
        return goodput(cost, b, ctx, alpha, k, draft, share) > goodput(cost, b, ctx, alpha, 0, draft)

    if k <= 0 or not pays(1.0):
        return 0.0
    if pays(limit):
        return limit
    lo, hi = 1.0, limit
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo
