"""The performance model: memory, step time and speculation goodput of one engine replica.

Plain arithmetic over plain dataclasses (docs/design.md), shared by the planner, the control loop
and the fleet simulator. Nothing here knows about Kubernetes, catalogs or YAML.

Units: bytes, seconds, FLOP/s; token counts are ints.

    weights        = parameters x bytes(dtype)
    kv_per_token   = 2 x layers x kv_heads x head_dim x bytes(kv_dtype)
    KV pool        = GPU memory x utilization x TP - weights - activation reserve
    T(B, ctx, q)   = max((weights + B.ctx.kv_per_token) / BW_eff, 2.params.B.q / FLOPS_eff) + t_fixed
    E[tokens|a, k] = (1 - a^(k+1)) / (1 - a)
    goodput(k, B)  = B . E / (T(B, ctx, k+1) + k . T_draft(B))

`Calibration` (BW_eff, FLOPS_eff, t_fixed) is the only thing an online fit of the roofline changes;
`fit_calibration` fits it from observed step times.

The sizing questions (goodput, k*, maxBatchForSpeculation, the ITL batch, the token budget, prefill
time) are asked of a `StepCost`: anything that gives the time of a decode/verify step and of a
mixed (chunked-prefill) step. `Roofline` is the formula above; a measured engine profile is the
other one (`specfleet.operator.step_cost`). The `(model, cal, ...)` functions are the roofline's
shorthand for the `*_of(cost, ...)` ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Protocol, Sequence

GiB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (`bfloat16` -> 2); raises KeyError on unknown names."""
    return DTYPE_BYTES[dtype.lower()]


@dataclass(frozen=True)
class ModelShape:
    """What the model contributes to memory and compute."""

    parameters: float
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 2


@dataclass(frozen=True)
class Calibration:
    """Effective (achieved, not peak) numbers of one replica, all its GPUs together."""

    bw_eff: float      # bytes/s of weights + KV streamed per decode step
    flops_eff: float   # FLOP/s
    t_fixed: float     # s per step: launch, sampling, scheduling


@dataclass(frozen=True)
class StepSample:
    """One observed engine step, the input of `fit_calibration`."""

    batch: int
    ctx: int
    q: int
    seconds: float


def weights_bytes(model: ModelShape) -> float:
    return model.parameters * model.dtype_bytes


def kv_bytes_per_token(model: ModelShape) -> int:
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.kv_dtype_bytes


def activation_reserve_bytes(model: ModelShape, tp: int, per_gpu_overhead: float = 1 * GiB,
                             token_budget: int = 8192) -> float:
    """Memory kept out of the KV pool: runtime overhead per GPU plus activations of one full step."""
    per_token = (2 * model.hidden_size + model.intermediate_size) * model.dtype_bytes
    logits = 4 * model.vocab_size * 256
    return tp * per_gpu_overhead + token_budget * per_token + logits


def kv_pool_bytes(model: ModelShape, gpu_memory: float, utilization: float, tp: int,
                  reserve: float | None = None) -> float:
    """KV cache pool of a replica of `tp` GPUs; negative when the weights do not fit."""
    reserve = activation_reserve_bytes(model, tp) if reserve is None else reserve
    return gpu_memory * utilization * tp - weights_bytes(model) - reserve


def kv_blocks(pool_bytes: float, block_size: int, kv_per_token: int) -> int:
    """Whole KV blocks in a pool (0 when the pool is empty or negative)."""
    return max(0, int(pool_bytes // (block_size * kv_per_token)))


def step_time(model: ModelShape, cal: Calibration, batch: float, ctx: int, q: float = 1) -> float:
    """Roofline time of one decode step: `batch` sequences at context `ctx`, `q` tokens each."""
    memory = (weights_bytes(model) + batch * ctx * kv_bytes_per_token(model)) / cal.bw_eff
    compute = 2 * model.parameters * batch * q / cal.flops_eff
    return max(memory, compute) + cal.t_fixed


def mixed_step_time(model: ModelShape, cal: Calibration, batch: int, ctx: int, tokens: int) -> float:
    """A chunked-prefill step: `batch` decodes at `ctx` plus prefill, `tokens` in all."""
    memory = (weights_bytes(model) + batch * ctx * kv_bytes_per_token(model)) / cal.bw_eff
    compute = 2 * model.parameters * max(tokens, batch) / cal.flops_eff
    return max(memory, compute) + cal.t_fixed


class StepCost(Protocol):
    """Seconds of one engine step of a replica."""

    def step(self, batch: float, ctx: int, q: float = 1) -> float:
        """`batch` sequences at context `ctx`, `q` tokens each (q = 1 decode, q = k + 1 verify)."""

    def mixed(self, batch: int, ctx: int, tokens: int) -> float:
        """`batch` decodes at `ctx` plus prefill, `tokens` in all (a chunked-prefill step)."""


@dataclass(frozen=True)
class Roofline:
    """The roofline `StepCost` of a model on a calibrated replica."""

    shape: ModelShape
    cal: Calibration

    def step(self, batch: float, ctx: int, q: float = 1) -> float:
        return step_time(self.shape, self.cal, batch, ctx, q)

    def mixed(self, batch: int, ctx: int, tokens: int) -> float:
        return mixed_step_time(self.shape, self.cal, batch, ctx, tokens)


Share = float | Sequence[float]   # one draft share, or the share at each depth 1, 2, ... (n-gram)


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


DraftTime = Callable[[int], float]   # batch -> seconds for one draft token of every sequence


def no_draft_cost(_batch: int) -> float:
    """n-gram drafting runs on the host, overlapped with the step: free in this model."""
    return 0.0


def draft_time_fn(draft: ModelShape, cal: Calibration, ctx: int) -> DraftTime:
    """T_draft(B) of a small draft model sharing the target's hardware."""
    return lambda batch: step_time(draft, cal, batch, ctx, 1)


def spec_step_time(model: ModelShape, cal: Calibration, batch: int, ctx: int, k: int,
                   draft: DraftTime = no_draft_cost) -> float:
    """Wall time of one speculative step: k draft tokens, then one verify pass of k+1 tokens."""
    return spec_step_time_of(Roofline(model, cal), batch, ctx, k, draft)


def spec_step_time_of(cost: StepCost, batch: int, ctx: int, k: int, draft: DraftTime = no_draft_cost,
                      share: Share = 1.0) -> float:
    """A `share` of the sequences verify k drafts, the others decode: 1 + share x k tokens each on average."""
    if k <= 0:
        return cost.step(batch, ctx, 1)
    return cost.step(batch, ctx, 1 + share_at(share, k) * k) + k * draft(batch)


def goodput(model: ModelShape, cal: Calibration, batch: int, ctx: int, alpha: float, k: int,
            draft: DraftTime = no_draft_cost) -> float:
    """Accepted tokens per second of a replica at batch `batch` (k = 0: speculation off)."""
    return goodput_of(Roofline(model, cal), batch, ctx, alpha, k, draft)


def goodput_of(cost: StepCost, batch: int, ctx: int, alpha: float, k: int, draft: DraftTime = no_draft_cost,
               share: Share = 1.0) -> float:
    return batch * expected_tokens(alpha, k, share) / spec_step_time_of(cost, batch, ctx, k, draft, share)


def goodputs_of(cost: StepCost, batch: int, ctx: int, alpha: float, max_k: int, draft: DraftTime = no_draft_cost,
                share: Share = 1.0) -> list[float]:
    """Goodput at each depth 0 (off), 1, ..., max_k."""
    return [goodput_of(cost, batch, ctx, alpha, k, draft, share) for k in range(max_k + 1)]


def best_k(model: ModelShape, cal: Calibration, batch: int, ctx: int, alpha: float, max_k: int,
           draft: DraftTime = no_draft_cost) -> int:
    """k* maximising goodput at `batch`; 0 when speculation does not pay."""
    return best_k_of(Roofline(model, cal), batch, ctx, alpha, max_k, draft)


def best_k_of(cost: StepCost, batch: int, ctx: int, alpha: float, max_k: int, draft: DraftTime = no_draft_cost,
              share: Share = 1.0, margin: float = 0.0) -> int:
    """k* maximising goodput at `batch`; 0 unless it beats plain decoding by more than `margin` (a share
    of the plain goodput; negative: speculation may cost up to that share)."""
    rates = goodputs_of(cost, batch, ctx, alpha, max_k, draft, share)
    best = max(range(1, len(rates)), key=lambda k: (rates[k], -k), default=0)
    return best if best and rates[best] > rates[0] * (1 + margin + 1e-9) else 0


def max_batch_for_speculation(model: ModelShape, cal: Calibration, ctx: int, alpha: float,
                              max_k: int, limit: int = 4096, draft: DraftTime = no_draft_cost) -> int:
    """Largest batch at which k* > 0 (0 when speculation never pays), searched up to `limit`."""
    return max_batch_for_speculation_of(Roofline(model, cal), ctx, alpha, max_k, limit, draft)


def max_batch_for_speculation_of(cost: StepCost, ctx: int, alpha: float, max_k: int, limit: int = 4096,
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
        return best_k_of(cost, b, ctx, alpha, max_k, draft, share, margin) > 0

    if max_k <= 0:
        return 0
    grid = _batch_grid(limit)
    last = next((i for i in range(len(grid) - 1, -1, -1) if pays(grid[i])), None)
    if last is None:
        return 0
    return grid[last] if last == len(grid) - 1 else _bisect(pays, grid[last], grid[last + 1])


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
        return goodput_of(cost, b, ctx, alpha, k, draft, share) > goodput_of(cost, b, ctx, alpha, 0, draft)

    if k <= 0 or not pays(1.0):
        return 0.0
    if pays(limit):
        return limit
    lo, hi = 1.0, limit
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo


def _bisect(pays: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest b in [lo, hi) with pays(b), given pays(lo) and not pays(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo


def max_num_seqs(model: ModelShape, cal: Calibration, ctx: int, itl_s: float, pool_bytes: float,
                 limit: int = 1024) -> int:
    """Largest B with T(B, ctx, 1) <= ITL and B.ctx.kv_per_token within the pool (0: none)."""
    return max_num_seqs_of(Roofline(model, cal), kv_bytes_per_token(model), ctx, itl_s, pool_bytes, limit)


def max_num_seqs_of(cost: StepCost, kv_per_token: int, ctx: int, itl_s: float, pool_bytes: float,
                    limit: int = 1024) -> int:
    by_memory = int(max(pool_bytes, 0) // (ctx * kv_per_token))
    cap = min(by_memory, limit)
    if cap < 1 or cost.step(1, ctx) > itl_s:
        return 0
    fits = lambda b: cost.step(b, ctx) <= itl_s  # noqa: E731
    return cap if fits(cap) else _bisect(fits, 1, cap)


def prefill_time(model: ModelShape, cal: Calibration, prompt: int, chunk: int, batch: int, ctx: int) -> float:
    """Time to prefill `prompt` tokens in chunks of `chunk` tokens, each step also decoding `batch`."""
    return prefill_time_of(Roofline(model, cal), prompt, chunk, batch, ctx)


def prefill_time_of(cost: StepCost, prompt: int, chunk: int, batch: int, ctx: int) -> float:
    room = max(chunk - batch, 1)
    return math.ceil(prompt / room) * cost.mixed(batch, ctx, chunk)


def token_budget(model: ModelShape, cal: Calibration, batch: int, ctx: int, prompt: int,
                 itl_s: float, ttft_s: float, limit: int = 16384) -> int:
    """Largest chunk C (a multiple of 16, >= batch + 16) keeping a mixed step within the ITL target.

    Returns 0 when no chunk keeps the ITL target, or when even the largest one misses the TTFT target.
    """
    return token_budget_of(Roofline(model, cal), batch, ctx, prompt, itl_s, ttft_s, limit)


def token_budget_of(cost: StepCost, batch: int, ctx: int, prompt: int, itl_s: float, ttft_s: float,
                    limit: int = 16384) -> int:
    floor = _round_up(batch + 16, 16)
    if cost.mixed(batch, ctx, floor) > itl_s:
        return 0
    fits = lambda c: cost.mixed(batch, ctx, c * 16) <= itl_s  # noqa: E731
    top = limit // 16
    chunk = 16 * (top if fits(top) else _bisect(fits, floor // 16, top))
    return chunk if prefill_time_of(cost, prompt, chunk, batch, ctx) <= ttft_s else 0


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def fit_calibration(samples: Sequence[StepSample], model: ModelShape, prior: Calibration,
                    rounds: int = 4) -> Calibration:
    """Fit BW_eff, FLOPS_eff and t_fixed to observed step times.

    Each round labels every sample memory- or compute-bound under the current fit, then solves
    t = t_fixed + bytes/BW (least squares) on the memory-bound ones and FLOPS from the compute-bound
    ones. Parameters without evidence keep the prior's value.
    """
    cal = prior
    for _ in range(rounds):
        memory, compute = _split_by_bound(samples, model, cal)
        cal = _fit_memory(memory, model, cal)
        cal = _fit_compute(compute, model, cal)
    return cal


def _bytes(model: ModelShape, s: StepSample) -> float:
    return weights_bytes(model) + s.batch * s.ctx * kv_bytes_per_token(model)


def _flops(model: ModelShape, s: StepSample) -> float:
    return 2 * model.parameters * s.batch * s.q


def _split_by_bound(samples: Iterable[StepSample], model: ModelShape, cal: Calibration):
    memory, compute = [], []
    for s in samples:
        bound = memory if _bytes(model, s) / cal.bw_eff >= _flops(model, s) / cal.flops_eff else compute
        bound.append(s)
    return memory, compute


def _fit_memory(samples: list[StepSample], model: ModelShape, cal: Calibration) -> Calibration:
    xs = [_bytes(model, s) for s in samples]
    ys = [s.seconds for s in samples]
    if len(set(xs)) < 2:
        return cal
    slope, intercept = _least_squares(xs, ys)
    if slope <= 0:
        return cal
    return Calibration(bw_eff=1 / slope, flops_eff=cal.flops_eff, t_fixed=max(intercept, 0.0))


def _fit_compute(samples: list[StepSample], model: ModelShape, cal: Calibration) -> Calibration:
    rates = [_flops(model, s) / (s.seconds - cal.t_fixed) for s in samples if s.seconds > cal.t_fixed]
    if not rates:
        return cal
    return Calibration(bw_eff=cal.bw_eff, flops_eff=sum(rates) / len(rates), t_fixed=cal.t_fixed)


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    return slope, my - slope * mx
