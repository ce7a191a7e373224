"""What a model is to the cost model: its architecture, and the bytes per element it runs in.

`Architecture` is also the CRD's `spec.model.architecture` (`api` re-exports it); a catalog or a
CR-declared architecture is bf16-sized until `with_dtype` sets the dtype the engine runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (`bfloat16` -> 2); raises KeyError on unknown names."""
    return DTYPE_BYTES[dtype.lower()]


@dataclass(frozen=True)
class Architecture:
    """A Llama-family model's shape: what it contributes to memory and compute."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    parameters: float
    dtype_bytes: int = 2         # weights and activations
    kv_dtype_bytes: int = 2      # the KV cache

    def with_dtype(self, dtype: str) -> Architecture:
        """The same model run in `dtype` (weights and KV cache alike)."""
        size = dtype_bytes(dtype)
        return replace(self, dtype_bytes=size, kv_dtype_bytes=size)
