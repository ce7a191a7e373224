"""The triton K/V write lands each new token in its slot, skips slot -1, and touches nothing else."""
from __future__ import annotations

import pytest
import torch

from specfleet.engine.attention import write_kv
from specfleet.engine.kernels.reshape_and_cache import reshape_and_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size, kv_heads, head_dim", [(16, 2, 16), (4, 3, 24)])
def test_new_kv_lands_in_its_slots_and_padding_slots_are_skipped(dtype, block_size, kv_heads, head_dim, device):
    num_tokens = 37
    num_blocks = -(-2 * num_tokens // block_size)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[::5] = -1                                                      # padding tokens
    # k and v as the model has them: non-contiguous views into one fused projection
    fused = torch.randn(num_tokens, 4 * kv_heads * head_dim, device=device).to(dtype)
    k = fused[:, kv_heads * head_dim:2 * kv_heads * head_dim].view(num_tokens, kv_heads, head_dim)
    v = fused[:, 3 * kv_heads * head_dim:].view(num_tokens, kv_heads, head_dim)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device).to(dtype)
    v_cache = torch.randn(shape, device=device).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    write_kv(k_ref, v_ref, k[keep], v[keep], slots[keep])

    reshape_and_cache(k_cache, v_cache, k, v, slots)

    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
