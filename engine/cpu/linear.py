"""Linear layers with oneDNN-prepacked weights: the CPU path for the model's projections and LM head.

MKL's sgemm (what `F.linear` runs on CPU) is slow on the tall, narrow LM head; oneDNN takes the weight
in its blocked layout, packed once here (`benchmarks/cpu_backend.py` measures both). Only fp32 weights are packed; anything else keeps `nn.Linear`.
"""
from __future__ import annotations

import torch
from torch import nn


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W held in oneDNN's layout; the original weight is dropped unless shared."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
                             persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Swap every fp32 `nn.Linear` of `model` for a `PackedLinear`; returns how many were swapped."""
    if not packing_available():
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    return swapped
