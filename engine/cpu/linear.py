"""Linear layers with oneDNN-prepacked weights: the CPU path for the model's projections and LM head.

MKL's sgemm (what `F.linear` runs on CPU) is slow on the tall, narrow LM head; oneDNN takes the weight
in its blocked layout, packed once here (`benchmarks/cpu_backend.py` measures both). Only fp32 weights are
packed; anything else keeps `nn.Linear`. For the few rows of a small decode step, oneDNN's ~30 us fixed
cost per call outweighs the arithmetic, so those go to the extension's `linear_small` over the plain
weight, which is kept for it (`benchmarks/cpu_decode_ops.py` measures where each wins).
"""
from __future__ import annotations

import torch
from torch import nn


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def small_rows_limit(in_features: int) -> int:
    """The most rows for which `linear_small` beats the packed GEMM: 8 while 8 weight rows fit in L1, else 4
    (SmolLM2's shapes on an AVX2 core, `benchmarks/cpu_decode_ops.py`)."""
    return 8 if in_features <= 1024 else 4


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W held in oneDNN's layout; with a `kernel` (the CPU extension) the plain weight
    is kept too, for steps of few rows. Without one the original weight is dropped unless shared."""

    def __init__(self, linear: nn.Linear, kernel=None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
                             persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.kernel = kernel
        self.weight = linear.weight.detach() if kernel is not None else None
        self.small_rows = small_rows_limit(self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.kernel is not None and rows.shape[0] <= self.small_rows:
            out = self.kernel.linear_small(rows.contiguous(), self.weight, self.bias)
        else:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module, kernel=None) -> int:
    """Swap every fp32 `nn.Linear` of `model` for a `PackedLinear` (see there for `kernel`); returns how
    many were swapped."""
    if not packing_available():
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child, kernel))
                swapped += 1
    return swapped
