"""Triton write of a step's new K/V into their cache slots; a slot of -1 (a padding token) is skipped.

One program copies `BLOCK_T` tokens, each as one flat row of `num_kv_heads * head_dim` values, to
`slot // block_size, slot % block_size` of the `[num_blocks, block_size, num_kv_heads, head_dim]` caches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specfleet.engine.kernels.paged_attention import check_device, interpreting


@triton.jit
def _reshape_and_cache_kernel(
        k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
        stride_kt, stride_kh, stride_vt, stride_vh,
        stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch,
        PAGE: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
        WIDTH: tl.constexpr, BLOCK_T: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slots = tl.load(slot_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    cols = tl.arange(0, WIDTH)                           # col = head * HEAD_DIM_PAD + dim
    head = cols // HEAD_DIM_PAD
    dim = cols % HEAD_DIM_PAD
    mask = (slots >= 0)[:, None] & ((head < HEADS) & (dim < HEAD_DIM))[None, :]
    block = slots // PAGE
    in_block = slots % PAGE
    k = tl.load(k_ptr + tokens[:, None] * stride_kt + (head * stride_kh + dim)[None, :], mask=mask)
    v = tl.load(v_ptr + tokens[:, None] * stride_vt + (head * stride_vh + dim)[None, :], mask=mask)
    k_dst = (block * stride_cb + in_block * stride_cs)[:, None] + (head * stride_ch + dim)[None, :]
    v_dst = (block * stride_vcb + in_block * stride_vcs)[:, None] + (head * stride_vch + dim)[None, :]
    tl.store(k_cache_ptr + k_dst, k, mask=mask)
    tl.store(v_cache_ptr + v_dst, v, mask=mask)


def reshape_and_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Same contract as `attention.write_kv`: k, v [num_tokens, kv_heads, head_dim] -> their slots."""
    check_device(k)
    num_tokens, heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    head_dim_pad = triton.next_power_of_2(head_dim)
    block_t = 32 if interpreting() else 4
    _reshape_and_cache_kernel[(triton.cdiv(num_tokens, block_t),)](
        k, v, k_cache, v_cache, slot_mapping, num_tokens,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        PAGE=k_cache.shape[1], HEADS=heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        WIDTH=triton.next_power_of_2(heads) * head_dim_pad, BLOCK_T=block_t)
