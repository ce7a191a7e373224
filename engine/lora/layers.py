"""The batched multi-LoRA forward: slot tensors per projection and one op that applies each row's adapter.

`LoRASlots(model, ...)` wraps the model's seven projections (fused as qkv_proj, o_proj, gate_up_proj,
down_proj) in `LoRALinear`, which keeps for every slot A [slots, parts * r_max, in] and B^T [slots, parts * r_max, out]
(B stored transposed, scaling folded in, zero-padded to r_max). A fused projection's parts stack along
the rank: part i (q, k, v or gate, up) owns rank rows [i * r_max, i * r_max + r) of A and writes only its
own output columns through B^T, so the fused LoRA is block-diagonal and exactly the sum of the parts.

Each step `LoRABatch.set` turns the per-token slot indices (-1: base) into a one-hot [tokens, slots];
`TorchLoRAOps.add_lora` then computes y += mask(x @ A_all^T) @ B^T_all: two GEMMs over all slots, no
gather, no host sync and the same shapes whichever adapters the rows use. It does `slots` times the ideal
LoRA FLOPs (small: slots * r_max is a few percent of a projection's width); a segmented kernel (Punica's
SGMV / BGMV in triton) is the later GPU step and plugs in as another `ops` object with the same
`add_lora`. Steps where no row has an adapter skip the op; an engine without LoRA never wraps anything.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specfleet.engine.lora.adapter import LoRAAdapter, projection_dims
from specfleet.engine.model.llama import LlamaForCausalLM

# fused module -> (parent, the unfused projections it stacks, in order)
FUSED_PARTS = {"qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")), "o_proj": ("self_attn", ("o_proj",)),
               "gate_up_proj": ("mlp", ("gate_proj", "up_proj")), "down_proj": ("mlp", ("down_proj",))}


class TorchLoRAOps:
    """The reference LoRA op in plain torch; a GPU kernel is another object with the same `add_lora`."""

    @staticmethod
    def add_lora(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
                 onehot: torch.Tensor) -> torch.Tensor:
        """y += B[slot] @ A[slot] @ x per row. lora_a: [slots, R, in], lora_bt: [slots, R, out],
        onehot: [tokens, slots] (a zero row: the base model)."""
        slots, rank, fan_in = lora_a.shape
        xa = (x @ lora_a.view(slots * rank, fan_in).T).view(-1, slots, rank) * onehot.unsqueeze(-1)
        return y.addmm_(xa.view(-1, slots * rank), lora_bt.view(slots * rank, -1))


@dataclass
class LoRABatch:
    """The step's rows -> slots, shared by every LoRALinear of the model."""
    num_slots: int
    ops: type = TorchLoRAOps
    onehot: torch.Tensor | None = None      # [tokens, slots]; None: no row uses an adapter this step

    def set(self, token_slots: torch.Tensor | None, dtype: torch.dtype) -> None:
        if token_slots is None:
            self.onehot = None
            return
        slots = torch.arange(self.num_slots, device=token_slots.device)
        self.onehot = (token_slots.unsqueeze(1) == slots).to(dtype)


class LoRALinear(nn.Module):
    """base(x) plus each row's adapter; `base` is whatever the backend made of the projection."""

    def __init__(self, base: nn.Module, batch: LoRABatch, rank: int, fan_in: int, fan_out: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.batch = batch
        self.register_buffer("lora_a", torch.zeros(batch.num_slots, rank, fan_in, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("lora_bt", torch.zeros(batch.num_slots, rank, fan_out, dtype=dtype, device=device),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.batch.onehot is None:
            return y
        return self.batch.ops.add_lora(y, x, self.lora_a, self.lora_bt, self.batch.onehot)


class LoRASlots:
    """The model's LoRALinears and how to write one adapter into one slot of all of them."""

    def __init__(self, model: LlamaForCausalLM, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.batch = LoRABatch(num_slots)
        self.max_rank = max_rank
        self.dtype, self.device = dtype, device
        self.dims = projection_dims(model.shape)
        self.layers: list[dict[str, LoRALinear]] = [self._wrap(layer) for layer in model.model.layers]

    def _wrap(self, layer: nn.Module) -> dict[str, LoRALinear]:
        wrapped = {}
        for fused, (parent_name, parts) in FUSED_PARTS.items():
            parent = getattr(layer, parent_name)
            base = getattr(parent, fused)
            fan_out = sum(self.dims[p][1] for p in parts)
            module = LoRALinear(base, self.batch, len(parts) * self.max_rank, self.dims[parts[0]][0], fan_out,
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
