"""prepare_model: what the engine calls for a model that runs on CPU (packed linears, the C++ attention and
the fused elementwise steps from the same extension)."""
from __future__ import annotations

from torch import nn

from specfleet.engine.cpu import attention
from specfleet.engine.cpu.linear import calibrate_small_rows, pack_linears
from specfleet.engine.cpu.row_limits import RowLimitStore


def prepare_model(model: nn.Module, backend: str) -> None:
    """Packs the linears and, unless the torch reference path was asked for, installs the C++ extension:
    paged attention, the decoder's fused elementwise steps and the few-row linear (its row limits measured
    once on this machine)."""
    if backend == "torch":
        pack_linears(model)
        return
    kernel = attention.load_kernel()
    pack_linears(model, kernel)
    if kernel is not None:
        calibrate_small_rows(model, RowLimitStore.for_this_machine())
        model.set_attention_backend(attention.CpuPagedAttention)
        model.set_elementwise(kernel)
    elif backend == "cpu":
        raise RuntimeError("attention backend 'cpu' requested but its kernel does not build; see the log")
