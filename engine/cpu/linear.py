"""Linear layers with oneDNN-prepacked weights: the CPU path for the model's projections and LM head.

MKL's sgemm (what `F.linear` runs on CPU) is slow on the tall, narrow LM head; oneDNN takes the weight
in its blocked layout, packed once here (`benchmarks/kernels/cpu_backend.py` measures both). fp32 and bf16 weights
are packed (bf16 runs oneDNN's AVX512-BF16 / AMX kernels, so only on a CPU oneDNN has a bf16 path for:
AVX-512 or AVX-NE-CONVERT); anything else keeps `nn.Linear`. A decode step's few rows stream each weight once, and there oneDNN reaches about half of
what memory gives, so the extension keeps a second copy for them: output panels (`linear_panels.cpp`)
on AVX-512 CPUs, the plain weight for `linear_small` elsewhere (commit `e6490e9`'s `benchmarks/linear_panels.py`
measured the three). Up to how many rows that pays differs by CPU, kernel and shape, so `calibrate_small_rows`
times both on the model's own weights when it loads, once per machine: `RowLimitStore` keeps what it
measured for every later process.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from contextlib import nullcontext

import torch
from torch import nn

from specfleet.engine.cpu.row_limits import RowLimitStore

log = logging.getLogger(__name__)
CANDIDATE_ROWS = (1, 2, 4, 8, 16, 32, 64)
COLD_BYTES = 64 << 20        # more than a server CPU's L3: timed over this much weight, it comes from memory
TIMING_REPEATS = 3


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packed_dtypes() -> tuple[torch.dtype, ...]:
    """fp32, and bf16 where oneDNN can reorder and multiply bf16 weights on this CPU (on an AVX2-only one
    `_reorder_linear_weight` raises)."""
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def small_rows_limit(in_features: int) -> int:
    """The prior for the most rows at which `linear_small` beats the packed GEMM, until `calibrate_small_rows`
    measures it: 8 while 8 weight rows fit in L1, else 4 (SmolLM2's shapes on one EPYC's cores)."""
    return 8 if in_features <= 1024 else 4


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W held in oneDNN's layout; with a `kernel` (the CPU extension) a second copy is
    kept for steps of few rows: W in output panels where the kernel has them for this CPU and dtype, else
    the plain weight. Without one the original weight is dropped unless shared."""

    def __init__(self, linear: nn.Linear, kernel=None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
                             persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.kernel = kernel
        weight = linear.weight.detach()
        self.panels = kernel.pack_panels(weight) if hasattr(kernel, "pack_panels") else None
        self.weight = weight if kernel is not None and self.panels is None else None
        self.small_rows = small_rows_limit(self.in_features)
        self.dtype = weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        out = self.small(rows) if self.kernel is not None and rows.shape[0] <= self.small_rows else self.gemm(rows)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)

    def small(self, rows: torch.Tensor) -> torch.Tensor:
        if self.panels is not None:
            return self.kernel.linear_panels(rows, self.panels, self.out_features, self.bias)
        return self.kernel.linear_small(rows.contiguous(), self.weight, self.bias)

    def gemm(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module, kernel=None) -> int:
    """Swap every `nn.Linear` of `model` whose dtype `packed_dtypes` lists for a `PackedLinear` (see there for
    `kernel`); returns how many were swapped."""
    if not packing_available():
        return 0
    swapped, dtypes = 0, packed_dtypes()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype in dtypes and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child, kernel))
                swapped += 1
    return swapped


def calibrate_small_rows(model: nn.Module, store: RowLimitStore | None = None) -> dict[tuple[int, int], int]:
    """Sets each `PackedLinear`'s row limit to what its shape measures on this CPU (`small_rows_limit`
    before); returns {(in_features, out_features): limit}. Layers of one shape share one measurement. With
    a `store`, shapes it holds are not timed again and those measured are added to it."""
    by_shape: dict[tuple[int, int, torch.dtype], list[PackedLinear]] = defaultdict(list)
    for module in model.modules():
        if isinstance(module, PackedLinear) and module.kernel is not None:
            by_shape[(module.in_features, module.out_features, module.dtype)].append(module)
    if not by_shape:
        return {}
    start = time.perf_counter()
    with store.locked() if store else nullcontext():
        known = store.load() if store else {}
        measured = {}
        for shape, linears in by_shape.items():
            key = RowLimitStore.key(*shape)
            if key not in known:
                with torch.inference_mode():
                    measured[key] = measured_small_rows(cold_subset(linears))
            for linear in linears:
                linear.small_rows = measured.get(key, known.get(key))
        if store and measured:
            store.save(known | measured)
    limits = {(i, o): linears[0].small_rows for (i, o, _), linears in by_shape.items()}
    shown = ", ".join(f"{i}->{o}: {n}" for (i, o), n in limits.items())
    source = f"measured in {time.perf_counter() - start:.1f} s" if measured else f"read from {store.path}"
    log.info("few-row linear limits %s: %s", source, shown)
    return limits


def cold_subset(linears: list[PackedLinear]) -> list[PackedLinear]:
    """The first layers holding COLD_BYTES of weight between them (all if they hold less): run one after
    another, as a step runs them, each reads its weight from memory rather than from a warm cache."""
    chosen, held = [], 0
    for linear in linears:
        chosen.append(linear)
        held += linear.in_features * linear.out_features * linear.packed.element_size()
        if held >= COLD_BYTES:
            break
    return chosen


def measured_small_rows(linears: list[PackedLinear]) -> int:
    """The largest of CANDIDATE_ROWS up to which `linear_small` is faster than oneDNN at every candidate
    (0 if it loses at one row): both timed over the same layers, alternating which goes first."""
    limit = 0
    for rows in CANDIDATE_ROWS:
        x = torch.randn(rows, linears[0].in_features).to(linears[0].dtype)
        small, gemm = [], []
        for repeat in range(TIMING_REPEATS + 1):                # the first pass of each is a warm-up
            for kind, times in sorted([("small", small), ("gemm", gemm)], reverse=repeat % 2 == 1):
                start = time.perf_counter()
                for linear in linears:
                    getattr(linear, kind)(x)
                if repeat:
                    times.append(time.perf_counter() - start)
        if statistics.median(small) >= statistics.median(gemm):
            break
        limit = rows
    return limit
