"""The batched multi-LoRA forward: slot tensors per projection and one op that applies each row's adapter.

`LoRASlots(model, ...)` wraps the model's seven projections (fused as qkv_proj, o_proj, gate_up_proj,
down_proj) in `LoRALinear`, which keeps for every slot A [slots, parts * r_max, in] and B^T [slots, parts * r_max, out]
(B stored transposed, scaling folded in, zero-padded to r_max). A fused projection's parts stack along
the rank: part i (q, k, v or gate, up) owns rank rows [i * r_max, i * r_max + r) of A and writes only its
own output columns through B^T, so the fused LoRA is block-diagonal and exactly the sum of the parts.

Each step `LoRABatch.set` hands the per-token slot indices (-1: base) to the ops object's `prepare` once;
every projection's `add_lora` then reads that state. On CPU (`TorchLoRAOps`) the state groups the adapter
rows by slot, padded to the longest group (`RowGroups`), and a projection costs one gather, two batched
GEMMs over the slots in use (x_g @ A[slot]^T, then @ B^T[slot]) and a gather back added into y: close to the ideal
LoRA FLOPs for a decode batch spread over adapters, never more than one GEMM over every slot per row, and
no per-adapter Python loop. Where the CPU backend installed its C++ extension (the projections' `kernel`),
`KernelLoRAOps` runs the whole op as one call of its `lora_add` (`engine/cpu/lora.cpp`): torch's bmm runs
one small GEMM per slot and part, some 30 per projection, which with the gathers around them cost a decode
step of SmolLM2 with 8 adapters more time than reading the adapters' bytes. On CUDA `engine/kernels/lora.py`
(Punica's SGMV idea in triton) does the same per slot segment. Steps where no row has an adapter skip the
op; an engine without LoRA wraps nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

import torch
from torch import nn

from specfleet.engine.lora.adapter import LoRAAdapter, projection_dims
from specfleet.engine.model.llama import LlamaForCausalLM

# fused module -> (parent, the unfused projections it stacks, in order)
FUSED_PARTS = {"qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")), "o_proj": ("self_attn", ("o_proj",)),
               "gate_up_proj": ("mlp", ("gate_proj", "up_proj")), "down_proj": ("mlp", ("down_proj",))}


@dataclass(frozen=True)
class RowGroups:
    """A step's adapter rows grouped by slot, each group padded to the longest: group g is slot lo + g."""
    lo: int
    hi: int                     # slots lo..hi-1 (a contiguous view of the slot tensors, no copy)
    length: int                 # rows per group
    rows: torch.Tensor          # [(hi - lo) * length] token row of each grouped row; padding reads row 0
    valid: torch.Tensor         # [hi - lo, length, 1] 1 for a real row, 0 for padding
    inverse: torch.Tensor       # [tokens] each token's grouped row; a base row's is a padding row (all zero)


class TorchLoRAOps:
    """The LoRA op in plain torch (CPU); `engine/kernels/lora.py`'s `TritonLoRAOps` is the CUDA one.

    An ops object has `prepare(token_slots, num_slots, dtype)`, run once per step, whose result every
    projection's `add_lora(y, x, lora_a, lora_bt, state)` reads."""

    @staticmethod
    def prepare(token_slots: torch.Tensor, num_slots: int, dtype: torch.dtype) -> RowGroups | None:
        """None when no row has an adapter (the op is skipped)."""
        ids = torch.nonzero(token_slots >= 0).squeeze(1)
        if ids.numel() == 0:
            return None
        slots = token_slots[ids]
        order = torch.argsort(slots, stable=True)
        ids, slots = ids[order], slots[order]
        lo, hi = int(slots[0]), int(slots[-1]) + 1
        counts = torch.bincount(slots - lo, minlength=hi - lo)
        length = int(counts.max())
        if len(ids) < len(token_slots) and (hi - lo) * length == len(ids):
            length += 1                             # base rows need a padding row to read their zero from
        starts = torch.cumsum(counts, 0) - counts
        flat = (slots - lo) * length + torch.arange(len(ids), device=ids.device) - starts[slots - lo]
        return TorchLoRAOps._groups(lo, hi, length, ids, flat, len(token_slots), dtype)

    @staticmethod
    def _groups(lo: int, hi: int, length: int, ids: torch.Tensor, flat: torch.Tensor, tokens: int,
                dtype: torch.dtype) -> RowGroups:
        rows = torch.zeros((hi - lo) * length, dtype=torch.long, device=ids.device).index_put_((flat,), ids)
        valid = torch.zeros((hi - lo) * length, dtype=dtype, device=ids.device)
        valid[flat] = 1
        padding = torch.nonzero(valid == 0)
        inverse = torch.full((tokens,), int(padding[0]) if len(padding) else 0, dtype=torch.long, device=ids.device)
        inverse[ids] = flat
        return RowGroups(lo, hi, length, rows, valid.view(hi - lo, length, 1), inverse)

    @staticmethod
    def add_lora(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
                 groups: RowGroups, parts: tuple[int, ...] | None = None) -> torch.Tensor:
        """y += B[slot] @ A[slot] @ x per adapter row, in place. lora_a: [slots, R, in], lora_bt: [slots, R, out];
        `parts`: the output widths of a fused projection's parts, each owning an equal share of R (None: one).
        Each part reads only its own block of B^T: on CPU the slot tensors' bytes, not the FLOPs, are the cost.
        Every row of y gets its grouped row's delta added, a base row an exact zero, so its value is kept.
        (A gather back and a dense add: index_add_ into y costs several times more on CPU.)"""
        g, length = groups.hi - groups.lo, groups.length
        xg = x.index_select(0, groups.rows).view(g, length, -1)
        xa = torch.bmm(xg, lora_a[groups.lo:groups.hi].transpose(1, 2)).mul_(groups.valid)
        parts = parts or (lora_bt.shape[2],)
        rank, column = lora_a.shape[1] // len(parts), 0
        for i, width in enumerate(parts):
            bt = lora_bt[groups.lo:groups.hi, i * rank:(i + 1) * rank, column:column + width]
            delta = torch.bmm(xa[:, :, i * rank:(i + 1) * rank], bt).view(g * length, width)
            y[:, column:column + width].add_(delta.index_select(0, groups.inverse))
            column += width
        return y


@dataclass(frozen=True)
class SlotRows:
    """A step's adapter rows grouped by slot for `KernelLoRAOps`: group g is rows ids[offsets[g]:offsets[g + 1]],
    all on slot slots[g]."""
    ids: torch.Tensor           # token rows in slot order (base rows left out)
    offsets: torch.Tensor       # [groups + 1]
    slots: torch.Tensor         # [groups]
    token_slots: torch.Tensor
    num_slots: int
    dtype: torch.dtype

    @cached_property
    def groups(self) -> RowGroups:
        """The torch op's state, built only for a projection the kernel does not take."""
        return TorchLoRAOps.prepare(self.token_slots, self.num_slots, self.dtype)


class KernelLoRAOps:
    """The LoRA op as one call of the CPU extension's `lora_add` per projection; the torch op where that
    does not apply (not float32, a fan-in that is no multiple of 8, fewer than 8 rank rows: max_lora_rank < 8)."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    @staticmethod
    def prepare(token_slots: torch.Tensor, num_slots: int, dtype: torch.dtype) -> SlotRows | None:
        """Grouped on the Python side: a step's few slots, where torch's argsort and bincount cost more."""
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(token_slots.tolist()):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(row)
        if not by_slot:
            return None
        order = sorted(by_slot)
        ids = [row for slot in order for row in by_slot[slot]]
        offsets = list(accumulate((len(by_slot[slot]) for slot in order), initial=0))
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        return SlotRows(as_long(ids), as_long(offsets), as_long(order), token_slots, num_slots, dtype)

    def add_lora(self, y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
                 rows: SlotRows, parts: tuple[int, ...] | None = None) -> torch.Tensor:
        """As `TorchLoRAOps.add_lora`; each row's sums in one fixed order, whatever else is in the batch."""
        parts = parts or (lora_bt.shape[2],)
        if self.kernel.lora_add(y, x, lora_a, lora_bt, rows.ids, rows.offsets, rows.slots, list(parts)):
            return y
        return TorchLoRAOps.add_lora(y, x, lora_a, lora_bt, rows.groups, parts)


def lora_ops(device: torch.device, kernel=None):
    """The triton kernels for CUDA tensors; on CPU the extension's op where the backend installed it (`kernel`,
    the one the projections got), else plain torch."""
    if torch.device(device).type == "cuda":
        from specfleet.engine.kernels.lora import TritonLoRAOps

        return TritonLoRAOps
    if hasattr(kernel, "lora_add"):
        return KernelLoRAOps(kernel)
    return TorchLoRAOps


@dataclass
class LoRABatch:
    """The step's rows -> slots, shared by every LoRALinear of the model."""
    num_slots: int
    ops: object = TorchLoRAOps  # prepare and add_lora: TorchLoRAOps, KernelLoRAOps(kernel) or TritonLoRAOps
    state: object = None        # ops.prepare's result; None: no row uses an adapter this step

    def set(self, token_slots: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.state = None if token_slots is None else self.ops.prepare(token_slots, self.num_slots, dtype)


class LoRALinear(nn.Module):
    """base(x) plus each row's adapter; `base` is whatever the backend made of the projection."""

    def __init__(self, base: nn.Module, batch: LoRABatch, rank: int, fan_in: int, parts: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.batch = batch
        self.parts = parts                  # output widths of the fused parts, each owning rank / len(parts)
        fan_out = sum(parts)
        self.register_buffer("lora_a", torch.zeros(batch.num_slots, rank, fan_in, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("lora_bt", torch.zeros(batch.num_slots, rank, fan_out, dtype=dtype, device=device),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.batch.state is None:
            return y
        return self.batch.ops.add_lora(y, x, self.lora_a, self.lora_bt, self.batch.state, self.parts)


class LoRASlots:
    """The model's LoRALinears and how to write one adapter into one slot of all of them."""

    def __init__(self, model: LlamaForCausalLM, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        kernel = getattr(model.model.layers[0].self_attn.qkv_proj, "kernel", None)    # PackedLinear's extension
        self.batch = LoRABatch(num_slots, lora_ops(device, kernel))
        self.max_rank = max_rank
        self.dtype, self.device = dtype, device
        self.dims = projection_dims(model.shape)
        self.layers: list[dict[str, LoRALinear]] = [self._wrap(layer) for layer in model.model.layers]

    def _wrap(self, layer: nn.Module) -> dict[str, LoRALinear]:
        wrapped = {}
        for fused, (parent_name, parts) in FUSED_PARTS.items():
            parent = getattr(layer, parent_name)
            base = getattr(parent, fused)
            widths = tuple(self.dims[p][1] for p in parts)
            module = LoRALinear(base, self.batch, len(parts) * self.max_rank, self.dims[parts[0]][0], widths,
                                self.dtype, self.device)
            setattr(parent, fused, module)
            wrapped[fused] = module
        return wrapped

    def write(self, slot: int, adapter: LoRAAdapter) -> None:
        """Put `adapter` in `slot` of every projection (what it does not adapt stays zero)."""
        r_max = self.max_rank
        for index, modules in enumerate(self.layers):
            for fused, (_, parts) in FUSED_PARTS.items():
                module = modules[fused]
                module.lora_a[slot].zero_()
                module.lora_bt[slot].zero_()
                column = 0
                for i, part in enumerate(parts):
                    pair = adapter.weights.get((index, part))
                    fan_out = self.dims[part][1]
                    if pair is not None:
                        a, b = pair
                        r = a.shape[0]
                        module.lora_a[slot, i * r_max:i * r_max + r] = a
                        module.lora_bt[slot, i * r_max:i * r_max + r, column:column + fan_out] = b.T
                    column += fan_out
