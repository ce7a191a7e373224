"""The CPU backend: a C++ paged-attention kernel, oneDNN-packed linear layers, allocator tuning.

`prepare_model(model, backend)` is what the engine calls for a model that runs on CPU.
"""
from __future__ import annotations

from torch import nn

from specfleet.engine.cpu import attention
from specfleet.engine.cpu.linear import pack_linears


def prepare_model(model: nn.Module, backend: str) -> None:
    """Packs the linears and, unless the torch reference path was asked for, installs the C++ attention."""
    pack_linears(model)
    if backend == "torch":
        return
    if attention.available():
        model.set_attention_backend(attention.CpuPagedAttention)
    elif backend == "cpu":
        raise RuntimeError("attention backend 'cpu' requested but its kernel does not build; see the log")
