"""The roofline step cost: from the model's shape and a replica's effective bandwidth and FLOP/s.

    T(B, ctx, q)  = max((weights + B.ctx.kv_per_token) / BW_eff, 2.params.B.q / FLOPS_eff) + t_fixed
    mixed(B, C)   = the same with max(C, B) tokens computed (a chunked-prefill step of C tokens)

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


def step_time(model: Architecture, cal: Calibration, batch: float, ctx: int, q: float = 1) -> float:
    """Roofline time of one decode step: `batch` sequences at context `ctx`, `q` tokens each."""
    memory = (weights_bytes(model) + batch * ctx * kv_bytes_per_token(model)) / cal.bw_eff
    compute = 2 * model.parameters * batch * q / cal.flops_eff
    return max(memory, compute) + cal.t_fixed


def mixed_step_time(model: Architecture, cal: Calibration, batch: int, ctx: int, tokens: int) -> float:
    """A chunked-prefill step: `batch` decodes at `ctx` plus prefill, `tokens` in all."""
    memory = (weights_bytes(model) + batch * ctx * kv_bytes_per_token(model)) / cal.bw_eff
    compute = 2 * model.parameters * max(tokens, batch) / cal.flops_eff
    return max(memory, compute) + cal.t_fixed


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
