"""TritonPagedAttention: the attention backend that runs the triton kernels (CUDA, or CPU under the interpreter).

It has the same call contract as `attention.TorchPagedAttention` and brings its own `write_kv` (the
triton reshape-and-cache), so `LlamaForCausalLM.set_attention_backend` swaps it in as a whole.
"""
from __future__ import annotations

import torch

from specfleet.engine.attention import AttentionMetadata
from specfleet.engine.kernels.paged_attention import paged_attention
from specfleet.engine.kernels.reshape_and_cache import reshape_and_cache


class TritonPagedAttention:
    """Paged attention backend running the triton kernels."""

    write_kv = staticmethod(reshape_and_cache)

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta, self.scale)
