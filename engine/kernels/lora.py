"""Triton multi-LoRA: each token row gets its own adapter's B A x in two launches (Punica's SGMV idea).

The step's rows are grouped by slot once (`lora_segments`: a stable sort, base rows of slot -1 left out);
both kernels run a grid of (row tile, slot[, output tile]). A program takes up to BLOCK_M rows of one
slot's segment, so all of its rows share one adapter's weights and each product is a tile GEMM (tl.dot),
for a long prefill chunk as for a decode batch spread over many adapters:

    shrink: xa[rows, :R]   = x[rows] @ A[slot]^T               (fp32, R = the slot tensors' padded rank)
    expand: y[rows, cols] += xa[rows] @ B^T[slot][:, cols]      (scaling already folded into B^T)

Tiles past a slot's segment exit at once, so the grid never needs the segment sizes on the host (no sync).
Each (row, column) of y is written by exactly one program: no atomics. Zero-padded rank rows (an adapter of
rank below the maximum) add zeros. `TritonLoRAOps` has `engine/lora/layers.py`'s ops contract.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specfleet.engine.kernels.paged_attention import check_device, interpreting


@dataclass(frozen=True)
class LoRASegments:
    """The step's token rows grouped by slot: slot s owns order[starts[s] : starts[s] + counts[s]]."""
    order: torch.Tensor      # [tokens] int32 row indices, sorted by slot (base rows last, in no segment)
    starts: torch.Tensor     # [slots] int32
    counts: torch.Tensor     # [slots] int32
    num_tokens: int


def lora_segments(token_slots: torch.Tensor, num_slots: int) -> LoRASegments:
    """token_slots: [tokens] slot per row, -1 for the base model."""
    key = torch.where(token_slots >= 0, token_slots, num_slots).long()
    order = torch.argsort(key, stable=True).to(torch.int32)
    counts = torch.bincount(key, minlength=num_slots + 1)[:num_slots]
    starts = torch.cumsum(counts, 0) - counts
    return LoRASegments(order, starts.to(torch.int32), counts.to(torch.int32), token_slots.shape[0])


@triton.jit
def _segment_rows(order_ptr, starts_ptr, counts_ptr, slot, tile, BLOCK_M: tl.constexpr):
    """The token rows of this program (int64) and which of its BLOCK_M lanes hold one."""
    count = tl.load(counts_ptr + slot)
    start = tl.load(starts_ptr + slot)
    lane = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = lane < count
    rows = tl.load(order_ptr + start + lane, mask=ok, other=0).to(tl.int64)
    return rows, ok


@triton.jit
def _lora_shrink_kernel(
        x_ptr, a_ptr, xa_ptr, order_ptr, starts_ptr, counts_ptr, fan_in, rank,
        stride_xt, stride_as, stride_ar, stride_xat,
        BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr):
    tile = tl.program_id(0)
    slot = tl.program_id(1)
    if tile * BLOCK_M >= tl.load(counts_ptr + slot):
        return
    rows, row_ok = _segment_rows(order_ptr, starts_ptr, counts_ptr, slot, tile, BLOCK_M)
    r = tl.arange(0, BLOCK_R)
    r_ok = r < rank
    a_slot = a_ptr + slot.to(tl.int64) * stride_as
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for k0 in range(0, fan_in, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < fan_in
        x = tl.load(x_ptr + rows[:, None] * stride_xt + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a = tl.load(a_slot + r[None, :] * stride_ar + k[:, None], mask=k_ok[:, None] & r_ok[None, :], other=0.0)
        if FP32_DOT:
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, a)
    tl.store(xa_ptr + rows[:, None] * stride_xat + r[None, :], acc, mask=row_ok[:, None] & r_ok[None, :])


@triton.jit
def _lora_expand_kernel(
        y_ptr, xa_ptr, bt_ptr, order_ptr, starts_ptr, counts_ptr, fan_out, rank,
        stride_yt, stride_xat, stride_bs, stride_br,
        BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
    tile = tl.program_id(0)
    slot = tl.program_id(1)
    if tile * BLOCK_M >= tl.load(counts_ptr + slot):
        return
    rows, row_ok = _segment_rows(order_ptr, starts_ptr, counts_ptr, slot, tile, BLOCK_M)
    r = tl.arange(0, BLOCK_R)
    r_ok = r < rank
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ok = cols < fan_out
    xa = tl.load(xa_ptr + rows[:, None] * stride_xat + r[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
    bt = tl.load(bt_ptr + slot.to(tl.int64) * stride_bs + r[:, None] * stride_br + cols[None, :],
                 mask=r_ok[:, None] & c_ok[None, :], other=0.0)
    if FP32_DOT:
        delta = tl.dot(xa, bt.to(tl.float32), input_precision="ieee")
    else:
        delta = tl.dot(xa.to(bt.dtype), bt)
    y_ptrs = y_ptr + rows[:, None] * stride_yt + cols[None, :]
    mask = row_ok[:, None] & c_ok[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=mask)


def _tiles(rank: int) -> dict:
    # tl.dot needs every dimension >= 16; the interpreter pays per program and loop step, so it takes wide tiles
    return dict(BLOCK_M=16, BLOCK_R=max(16, triton.next_power_of_2(rank)),
                BLOCK_K=128 if interpreting() else 64, BLOCK_N=128 if interpreting() else 64)


def add_lora(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
             segments: LoRASegments, parts: tuple[int, ...] | None = None) -> torch.Tensor:
    """y += B[slot] @ A[slot] @ x per row, in place. y: [tokens, out], x: [tokens, in],
    lora_a: [slots, R, in], lora_bt: [slots, R, out]; rows in no segment are left as they are. `parts` (a
    fused projection's output widths) is not needed: the expand runs over all R, the other parts' rows of B^T
    being zero."""
    check_device(x)
    slots, rank, fan_in = lora_a.shape
    fan_out = lora_bt.shape[2]
    if segments.num_tokens == 0:
        return y
    x = x if x.stride(-1) == 1 else x.contiguous()
    assert y.stride(-1) == 1 and lora_a.is_contiguous() and lora_bt.is_contiguous()
    tiles = _tiles(rank)
    fp32_dot = lora_a.dtype == torch.float32 or interpreting()
    xa = torch.empty(segments.num_tokens, rank, dtype=torch.float32, device=x.device)
    row_tiles = triton.cdiv(segments.num_tokens, tiles["BLOCK_M"])
    common = (segments.order, segments.starts, segments.counts)
    _lora_shrink_kernel[(row_tiles, slots)](
        x, lora_a, xa, *common, fan_in, rank, x.stride(0), lora_a.stride(0), lora_a.stride(1), xa.stride(0),
        BLOCK_M=tiles["BLOCK_M"], BLOCK_R=tiles["BLOCK_R"], BLOCK_K=tiles["BLOCK_K"], FP32_DOT=fp32_dot)
    _lora_expand_kernel[(row_tiles, slots, triton.cdiv(fan_out, tiles["BLOCK_N"]))](
        y, xa, lora_bt, *common, fan_out, rank, y.stride(0), xa.stride(0), lora_bt.stride(0), lora_bt.stride(1),
        BLOCK_M=tiles["BLOCK_M"], BLOCK_R=tiles["BLOCK_R"], BLOCK_N=tiles["BLOCK_N"], FP32_DOT=fp32_dot)
    return y


class TritonLoRAOps:
    """`layers.py`'s ops contract on the kernels above: the step's state is its `LoRASegments`."""

    @staticmethod
    def prepare(token_slots: torch.Tensor, num_slots: int, dtype: torch.dtype) -> LoRASegments:
        return lora_segments(token_slots, num_slots)

    add_lora = staticmethod(add_lora)
