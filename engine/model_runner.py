"""ModelRunner: owns the weights and the KV pool, turns a scheduled step into logits.

It lays the step's tokens out flat, grouped by how many tokens each sequence computes (decodes
together, each prefill chunk or verification group together), maps every token to its cache slot
through the block table, runs the model once, and returns logits only for the positions that are
sampled: the last token of a finished prefill or decode, or all k+1 positions of a verification.
With LoRA, every token also gets its sequence's adapter slot (-1: base), which the model's LoRA layers
read from the shared `LoRABatch`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfleet.engine.attention import AttentionMetadata, build_metadata
from specfleet.engine.lora.layers import LoRABatch
from specfleet.engine.model.llama import LlamaForCausalLM
from specfleet.engine.scheduler import SchedulerOutput
from specfleet.engine.sequence import Sequence


@dataclass
class SampleRows:
    seq: Sequence
    first_row: int      # row of this sequence's first sampled position in the logits
    num_rows: int       # 1, or k+1 when verifying k draft tokens


@dataclass
class StepInputs:
    input_ids: torch.Tensor        # [num_tokens]
    positions: torch.Tensor        # [num_tokens]
    meta: AttentionMetadata
    logit_indices: torch.Tensor    # [num_rows] token index of each sampled position
    rows: list[SampleRows]
    token_slots: torch.Tensor | None = None    # [num_tokens] LoRA slot per token; None: no adapter this step


def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    s = model.shape
    return 2 * s.num_layers * block_size * s.num_kv_heads * s.head_dim * torch.finfo(dtype).bits // 8


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, lora_batch: LoRABatch | None = None) -> None:
        self.model = model
        self.dtype = dtype
        self.lora_batch = lora_batch
        self.block_size = block_size
        self.device = device
        s = model.shape
        shape = (num_blocks, block_size, s.num_kv_heads, s.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(s.num_layers)]

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, lora_slots: dict[int, int] | None = None
                ) -> tuple[torch.Tensor, list[SampleRows]]:
        """`lora_slots`: adapter int id -> slot for the step's sequences with an adapter."""
        inputs = self.prepare(step, lora_slots)
        if self.lora_batch is not None:
            self.lora_batch.set(inputs.token_slots, self.dtype)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        logits = self.model.compute_logits(hidden[inputs.logit_indices]) if inputs.rows else hidden.new_empty(0)
        return logits, inputs.rows

    def prepare(self, step: SchedulerOutput, lora_slots: dict[int, int] | None = None) -> StepInputs:
        order = sorted(range(len(step.seqs)), key=lambda i: step.num_new_tokens[i])
        ids, positions, logit_idx, rows, slots = [], [], [], [], []
        qlens, ctx_lens, tables = [], [], []
        for i in order:
            seq, n = step.seqs[i], step.num_new_tokens[i]
            start = seq.num_computed_tokens
            tokens = seq.token_ids[start:start + n]                 # no copy of the whole sequence
            tokens += seq.spec_token_ids[:n - len(tokens)]
            span = range(start, start + n)
            first = len(ids)
            ids += tokens
            positions += span
            qlens.append(n)
            ctx_lens.append(start + n)
            tables.append(seq.block_table)
            if lora_slots:
                slots += [lora_slots.get(seq.lora_id, -1)] * n
            if start + n == seq.num_tokens + len(seq.spec_token_ids):     # reaches the end: sample
                num_rows = 1 + len(seq.spec_token_ids)
                rows.append(SampleRows(seq, len(logit_idx), num_rows))
                logit_idx += range(first + n - num_rows, first + n)
        meta = build_metadata(qlens, ctx_lens, tables, self.block_size, self.device)
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        return StepInputs(as_long(ids), as_long(positions), meta, as_long(logit_idx), rows,
                          as_long(slots) if slots else None)
