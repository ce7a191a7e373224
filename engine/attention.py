"""Paged attention over the block-table KV cache: step metadata and the plain-torch backend.

The model runner orders a step's sequences so that those computing the same number of tokens are
contiguous; each such group attends in one batched call. A query at position i of a group attends to
its sequence's cached context plus the tokens before it in the same step (causal), all read through the
block table. Backends (torch here, triton on CUDA) share `AttentionMetadata` and the cache layout
`[num_blocks, block_size, num_kv_heads, head_dim]`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    start: int                    # first token of the group in the step's flat token order
    num_seqs: int
    query_len: int                # tokens per sequence in this group
    context_lens: torch.Tensor    # [num_seqs] cached + new tokens, i.e. keys visible to the last query
    block_tables: torch.Tensor    # [num_seqs, max_blocks]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor    # [num_tokens] cache slot of each new token's K/V
    groups: list[AttentionGroup]
    # Flat per-sequence view used by kernels that handle ragged queries in one launch.
    query_start_loc: torch.Tensor   # [num_seqs + 1]
    context_lens: torch.Tensor      # [num_seqs]
    block_tables: torch.Tensor      # [num_seqs, max_blocks]
    max_query_len: int


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new K/V ([num_tokens, kv_heads, head_dim]) into their cache slots."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def _causal_context_mask(context_lens: torch.Tensor, query_len: int, num_keys: int) -> torch.Tensor:
    """[num_seqs, 1, query_len, num_keys]: query i sees keys j <= context_len - query_len + i."""
    device = context_lens.device
    last_visible = context_lens[:, None] - query_len + torch.arange(query_len, device=device)[None, :]
    keys = torch.arange(num_keys, device=device)
    return (keys[None, None, :] <= last_visible[:, :, None]).unsqueeze(1)


class TorchPagedAttention:
    """Reference paged attention in plain torch: the CPU path and the kernels' test oracle."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        out = torch.empty_like(q)                                  # [num_tokens, q_heads, head_dim]
        for group in meta.groups:
            end = group.start + group.num_seqs * group.query_len
            out[group.start:end] = self._group(q[group.start:end], k_cache, v_cache, group)
        return out

    def _group(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               group: AttentionGroup) -> torch.Tensor:
        n, t = group.num_seqs, group.query_len
        max_blocks = int((group.context_lens.max().item() + k_cache.shape[1] - 1) // k_cache.shape[1])
        tables = group.block_tables[:, :max_blocks]
        keys = k_cache[tables].flatten(1, 2).transpose(1, 2)       # [n, kv_heads, keys, head_dim]
        values = v_cache[tables].flatten(1, 2).transpose(1, 2)
        queries = q.view(n, t, *q.shape[1:]).transpose(1, 2)       # [n, q_heads, t, head_dim]
        mask = _causal_context_mask(group.context_lens, t, keys.shape[2])
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=self.scale,
                                             enable_gqa=queries.shape[1] != keys.shape[1])
        return out.transpose(1, 2).reshape(n * t, *q.shape[1:])
