"""The triton paged-attention kernel equals the torch reference on ragged steps of every kind."""
from __future__ import annotations

import pytest
import torch

from specfleet.engine.attention import TorchPagedAttention
from specfleet.engine.kernels.backend import TritonPagedAttention
from specfleet.engine.kernels.paged_attention import paged_attention

# (block_size, kv_heads, queries per kv head, head_dim, query_lens, context_lens)
CASES = {
    "decode-batch-mha": (16, 2, 1, 16, [1, 1, 1, 1], [1, 17, 40, 64]),
    "decode-gqa4-page4": (4, 1, 4, 32, [1, 1, 1], [3, 9, 30]),
    "prefill-from-empty": (8, 2, 2, 16, [13, 24], [13, 24]),
    "prefill-chunk-after-prefix-hit": (8, 1, 2, 16, [5, 12], [37, 28]),
    "verification-k4-gqa2": (16, 2, 2, 16, [5, 5, 5], [6, 21, 48]),
    "mixed-decode-verify-chunk-gqa3": (32, 1, 3, 16, [1, 3, 20, 1], [50, 9, 70, 2]),
    "odd-head-dim-page1": (1, 2, 2, 24, [2, 1], [5, 3]),
}


def random_cache(num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype, device, meta):
    """K/V filled with noise, and NaN in every block no sequence owns: reading one poisons the output."""
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=device).to(dtype)
    owned = torch.zeros(num_blocks, dtype=torch.bool, device=device)
    owned[meta.block_tables.long().flatten()] = True
    k[~owned] = float("nan")
    v[~owned] = float("nan")
    return k, v


def run_case(case, dtype, device, build_step, seed=0):
    block_size, kv_heads, group, head_dim, qlens, ctx = case
    torch.manual_seed(seed)
    num_blocks = sum(-(-c // block_size) for c in ctx) + 3
    meta = build_step(qlens, ctx, block_size, num_blocks, device, seed)
    k_cache, v_cache = random_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, meta)
    q = torch.randn(sum(qlens), kv_heads * group, head_dim, device=device).to(dtype)
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))                           # every element must be written
    paged_attention(q, k_cache, v_cache, meta, scale, out=out)
    ref = TorchPagedAttention(scale)(q.float(), k_cache.float(), v_cache.float(), meta)
    return out, ref


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_torch_reference_fp32(name, device, build_step):
    out, ref = run_case(CASES[name], torch.float32, device, build_step)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_accumulate_in_fp32(dtype, device, build_step):
    out, ref = run_case(CASES["mixed-decode-verify-chunk-gqa3"], dtype, device, build_step, seed=1)
    assert out.dtype == dtype and not out.isnan().any()
    tol = 1e-2 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_random_ragged_steps_match(device, build_step):
    gen = torch.Generator().manual_seed(7)
    for trial in range(3):
        block_size = [2, 8, 16][trial]
        num_seqs = int(torch.randint(1, 5, (1,), generator=gen))
        qlens = torch.randint(1, 9, (num_seqs,), generator=gen).tolist()
        ctx = [q + int(torch.randint(0, 40, (1,), generator=gen)) for q in qlens]
        case = (block_size, 2, [1, 2, 4][trial], 16, qlens, ctx)
        out, ref = run_case(case, torch.float32, device, build_step, seed=trial)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4, msg=f"trial {trial}: {case}")


def test_backend_object_has_the_torch_backend_contract(device, build_step):
    block_size, kv_heads, group, head_dim, qlens, ctx = CASES["verification-k4-gqa2"]
    meta = build_step(qlens, ctx, block_size, 16, device)
    k_cache, v_cache = random_cache(16, block_size, kv_heads, head_dim, torch.float32, device, meta)
    q = torch.randn(sum(qlens), kv_heads * group, head_dim, device=device)
    torch.testing.assert_close(TritonPagedAttention(0.3)(q, k_cache, v_cache, meta),
                               TorchPagedAttention(0.3)(q, k_cache, v_cache, meta), atol=2e-5, rtol=1e-4)
