"""Triton paged attention: prefill chunks, decodes and k+1-token verification in one launch.

One program serves one (sequence, kv head, block of query tokens). Its rows are the block's query
tokens times the query heads that share the kv head (GQA), so every K/V tile it reads through the
block table serves the whole group. Keys stream in tiles of `BLOCK_N` with an online softmax in fp32;
query i of a sequence with q new tokens sees keys j <= context_len - q + i (cached context plus its
causal prefix), which covers decode (q = 1), verification (q = k + 1) and prefill chunks alike.

The cache layout is the engine's: `[num_blocks, block_size, num_kv_heads, head_dim]`, K and V apart.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specfleet.engine.attention import AttentionMetadata


@triton.jit
def _paged_attention_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, query_start_loc_ptr, context_lens_ptr,
        qk_scale_log2,                                   # softmax scale * log2(e): exp2 in the loop
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_table,
        PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_block = tl.program_id(2)
    q_begin = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    if q_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)                          # row = (query token, head within group)
    q_pos = q_block * BLOCK_Q + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (q_pos < q_len) & (rows % GROUP_PAD < GROUP) & (rows < BLOCK_Q * GROUP_PAD)
    last_key = ctx_len - q_len + q_pos                     # [BLOCK_M] last key each row may see
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM

    q_offs = (q_begin + q_pos)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if FP32_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    num_keys = ctx_len - q_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < num_keys
        page = tl.load(block_tables_ptr + seq * stride_table + keys // PAGE, mask=key_ok, other=0).to(tl.int64)
        in_page = keys % PAGE
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + (page * stride_kb + in_page * stride_ks + kv_head * stride_kh)[:, None]
                    + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + (page * stride_vb + in_page * stride_vs + kv_head * stride_vh)[:, None]
                    + dims[None, :], mask=kv_mask, other=0.0)
        if FP32_DOT:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = (keys[None, :] <= last_key[:, None]) & key_ok[None, :]
        s = tl.where(visible, s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)     # padding rows see no key at all
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_offs = (q_begin + q_pos)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def interpreting() -> bool:
    """Whether these kernels were built for the interpreter (TRITON_INTERPRET=1 at first import)."""
    return not isinstance(_paged_attention_kernel, triton.runtime.JITFunction)


def check_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda" and not interpreting():
        raise RuntimeError("the triton attention backend needs CUDA tensors, or TRITON_INTERPRET=1 set before "
                           "specfleet.engine.kernels is first imported (CPU, for tests only)")


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def launch_config(max_query_len: int, group: int, head_dim: int) -> dict:
    """Tile sizes: rows = query tokens x heads of a group (at least 16 for tl.dot), BLOCK_N keys a tile.

    The interpreter pays per loop iteration, not per element, so it takes large key tiles.
    """
    group_pad = _pow2(group)
    block_q = min(_pow2(max_query_len), max(1, 64 // group_pad))
    return dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, _pow2(head_dim)), GROUP=group, GROUP_PAD=group_pad,
                BLOCK_Q=block_q, BLOCK_M=max(16, block_q * group_pad),
                BLOCK_N=128 if interpreting() else 64)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """q: [num_tokens, q_heads, head_dim] -> [num_tokens, q_heads, head_dim], attending through the cache."""
    check_device(q)
    num_tokens, q_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert q_heads % kv_heads == 0, "query heads must be a multiple of kv heads"
    out = torch.empty_like(q) if out is None else out
    num_seqs = meta.context_lens.shape[0]
    config = launch_config(meta.max_query_len, q_heads // kv_heads, head_dim)
    grid = (num_seqs, kv_heads, triton.cdiv(meta.max_query_len, config["BLOCK_Q"]))
    fp32_dot = k_cache.dtype == torch.float32 or interpreting()
    _paged_attention_kernel[grid](
        out, q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.context_lens,
        scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), meta.block_tables.stride(0),
        PAGE=page, FP32_DOT=fp32_dot, num_warps=4, **config)
    return out
