"""Triton kernels for the paged KV cache: the attention backend engine pods run on CUDA.

`TritonPagedAttention(scale)` has the same call contract as `attention.TorchPagedAttention` and also
brings its own `write_kv` (the triton reshape-and-cache). Under `TRITON_INTERPRET=1` (set before this
package is first imported) the same kernels run on CPU tensors, which is how the tests check them.
"""
from __future__ import annotations

import torch

from specfleet.engine.attention import AttentionMetadata
from specfleet.engine.kernels.paged_attention import interpreting, paged_attention
from specfleet.engine.kernels.reshape_and_cache import reshape_and_cache

__all__ = ["TritonPagedAttention", "interpreting", "paged_attention", "reshape_and_cache"]


class TritonPagedAttention:
    """Paged attention backend running the triton kernels (CUDA, or CPU under the interpreter)."""

    write_kv = staticmethod(reshape_and_cache)

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta, self.scale)
