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

    write_kv = staticmethod(write_kv)      # each backend brings its own cache write

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
        keys, values = _gather_context(k_cache, group), _gather_context(v_cache, group)   # [n, L, kv, d]
        mask = _causal_context_mask(group.context_lens, t, keys.shape[1])
        queries = q.view(n, t, *q.shape[1:])
        attend = _short_query_attention if t <= SHORT_QUERY else _sdpa_attention
        return attend(queries, keys, values, mask, self.scale).reshape(n * t, *q.shape[1:])


SHORT_QUERY = 16     # decodes and verifications: batched matmuls beat SDPA's flash kernel on CPU


def _gather_context(cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = int((group.context_lens.max().item() + block_size - 1) // block_size)
    tables = group.block_tables[:, :num_blocks].reshape(-1)
    rows = cache.view(cache.shape[0], -1).index_select(0, tables)
    return rows.view(group.num_seqs, num_blocks * block_size, *cache.shape[2:])


def _short_query_attention(q, k, v, mask, scale) -> torch.Tensor:
    """q [n, t, hq, d], k/v [n, L, hkv, d] -> [n, t, hq, d] with GQA by reshaping, not repeating."""
    n, t, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.view(n, t, hkv, hq // hkv, d).permute(0, 2, 1, 3, 4).reshape(n, hkv, t * (hq // hkv), d)
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale                    # [n, hkv, t*g, L]
    visible = mask.view(n, 1, t, 1, -1).expand(n, 1, t, hq // hkv, mask.shape[-1]).reshape(n, 1, -1, mask.shape[-1])
    probs = scores.masked_fill_(~visible, float("-inf")).softmax(dim=-1)
    out = torch.matmul(probs, v.transpose(1, 2))                                  # [n, hkv, t*g, d]
    return out.view(n, hkv, t, hq // hkv, d).permute(0, 2, 1, 3, 4)


def _sdpa_attention(q, k, v, mask, scale) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)
