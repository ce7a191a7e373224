"""The roofline step cost: from the model's shape and a replica's effective bandwidth and FLOP/s.

    T(B, ctx, q)  = t_fixed + (weights + B.ctx.kv_per_token) / BW_eff + B.q.(2.params + attn(ctx)) / FLOPS_eff
    attn(ctx)     = 4.layers.heads.head_dim.ctx            (QK^T and PV of one token over ctx)
    mixed(B, C)   = the same with C tokens computed, the C - B prompt tokens' attention at ctx / 2 (chunked prefill)

Memory and compute add rather than overlap (`max`): a GEMM of a few rows runs far below peak and does not
hide behind the weight stream, so every token a step computes costs time from the first. Published
speculative-decoding speed-ups, which fall from the smallest batch on, say so (docs/speculation-gpu.md).

`Calibration` (BW_eff, FLOPS_eff, t_fixed) is all a fit of the roofline changes
(`cost.calibration.fit_calibration`); the GPU catalog gives the prior (`Gpu.calibration`). What every
accelerator without a measured profile plans with.
"""
from __future__ import annotations

from dataclasses import dataclass

from specfleet.operator.cost.memory import kv_bytes_per_token, weights_bytes
from specfleet.operator.cost.shapes import Architecture


@dataclass(frozen=True)
class Calibration:
    """Effective (achieved, not peak) numbers of one replica, all its GPUs together."""

    bw_eff: float      # bytes/s of weights + KV streamed per decode step
    flops_eff: float   # FLOP/s
    t_fixed: float     # s per step: launch, sampling, scheduling


def step_bytes(model: Architecture, batch: float, ctx: int) -> float:
    """Bytes one step streams: the weights once, and each sequence's KV."""
    return weights_bytes(model) + batch * ctx * kv_bytes_per_token(model)


def token_flops(model: Architecture, ctx: int) -> float:
    """FLOP of one token at context `ctx`: its matmuls through every weight and its attention over ctx."""
    return 2 * model.parameters + 4 * model.num_layers * model.num_attention_heads * model.head_dim * ctx


def step_time(model: Architecture, cal: Calibration, batch: float, ctx: int, q: float = 1,
              fixed: bool = True) -> float:
    """Roofline time of one decode step: `batch` sequences at context `ctx`, `q` tokens each (`fixed=False`:
    without the per-step overhead, as a draft forward inside a draft phase runs)."""
    memory = step_bytes(model, batch, ctx) / cal.bw_eff
    compute = batch * q * token_flops(model, ctx) / cal.flops_eff
    return memory + compute + (cal.t_fixed if fixed else 0.0)


def mixed_step_time(model: Architecture, cal: Calibration, batch: int, ctx: int, tokens: int) -> float:
    """A chunked-prefill step: `batch` decodes at `ctx` plus prefill, `tokens` in all. A prompt's tokens
    attend on average to half of it, so the prefill tokens' attention is priced at ctx / 2."""
    memory = step_bytes(model, batch, ctx) / cal.bw_eff
    prefill = max(0, tokens - batch)
    flops = batch * token_flops(model, ctx) + prefill * token_flops(model, ctx // 2)
    return memory + flops / cal.flops_eff + cal.t_fixed


@dataclass(frozen=True)
class Roofline:
    """The roofline `StepCost` of a model on a calibrated replica."""

    shape: Architecture
    cal: Calibration

    def step(self, batch: float, ctx: int, q: float = 1, drafting: float | None = None) -> float:
        """`drafting` changes nothing here: the roofline has no fixed cost of verification that a step
        without drafts would save, only the tokens it computes."""
        return step_time(self.shape, self.cal, batch, ctx, q)

    def mixed(self, batch: int, ctx: int, tokens: int) -> float:
        return mixed_step_time(self.shape, self.cal, batch, ctx, tokens)
