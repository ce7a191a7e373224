"""Paged attention over the block-table KV cache: step metadata and the plain-torch backend.

The model runner orders a step's sequences so that those computing the same number of tokens are
contiguous; each such group attends in one batched call. A query at position i of a group attends to
its sequence's cached context plus the tokens before it in the same step (causal), all read through the
block table. Backends (torch here, triton on CUDA) share `AttentionMetadata` and the cache layout
`[num_blocks, block_size, num_kv_heads, head_dim]`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    start: int                    # first token of the group in the step's flat token order
    num_seqs: int
    query_len: int                # tokens per sequence in this group
    context_lens: torch.Tensor    # [num_seqs] cached + new tokens, i.e. keys visible to the last query
    block_tables: torch.Tensor    # [num_seqs, max_blocks]
    max_context_len: int = 0
    _mask: torch.Tensor | None = field(default=None, repr=False)
    _bias: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.max_context_len = self.max_context_len or int(self.context_lens.max().item())

    def mask(self, num_keys: int) -> torch.Tensor:
        """Visibility mask shared by all layers of the step, built on first use."""
        if self._mask is None:
            self._mask = _causal_context_mask(self.context_lens, self.query_len, num_keys)
        return self._mask

    def bias(self, heads_per_kv: int, num_keys: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [num_seqs, 1, heads_per_kv * query_len, num_keys] (0 or -inf), built on first use."""
        if self._bias is None:
            visible = self.mask(num_keys)
            bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
            self._bias = bias.repeat(1, 1, heads_per_kv, 1)
        return self._bias


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor    # [num_tokens] cache slot of each new token's K/V
    groups: list[AttentionGroup]
    # Flat per-sequence view used by kernels that handle ragged queries in one launch.
    query_start_loc: torch.Tensor   # [num_seqs + 1]
    context_lens: torch.Tensor      # [num_seqs]
    block_tables: torch.Tensor      # [num_seqs, max_blocks]
    max_query_len: int


def build_metadata(query_lens: list[int], context_lens: list[int], block_tables: list[list[int]], block_size: int,
                   device: torch.device | str) -> AttentionMetadata:
    """Metadata for a step laid out as the model runner does it: sequences ordered by query length, each
    computing its last `query_lens[i]` of `context_lens[i]` tokens, whose slots its block table gives."""
    width = max(len(t) for t in block_tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32, device=device)
    ctx = torch.tensor(context_lens, dtype=torch.int32, device=device)
    groups, start, i = [], 0, 0
    while i < len(query_lens):
        j = i
        while j < len(query_lens) and query_lens[j] == query_lens[i]:
            j += 1
        groups.append(AttentionGroup(start, j - i, query_lens[i], ctx[i:j], table[i:j], max(context_lens[i:j])))
        start += (j - i) * query_lens[i]
        i = j
    slots = [t[p // block_size] * block_size + p % block_size
             for t, q, c in zip(block_tables, query_lens, context_lens) for p in range(c - q, c)]
    starts = torch.tensor([0] + query_lens, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    return AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=device), groups, starts, ctx, table,
                             max(query_lens))


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
        if len(meta.groups) == 1:                                  # all decodes, say: no scatter into `out`
            return self._group(q, k_cache, v_cache, meta.groups[0]).contiguous()
        out = torch.empty_like(q)                                  # [num_tokens, q_heads, head_dim]
        for group in meta.groups:
            end = group.start + group.num_seqs * group.query_len
            out[group.start:end] = self._group(q[group.start:end], k_cache, v_cache, group)
        return out

    def _group(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               group: AttentionGroup) -> torch.Tensor:
        n, t = group.num_seqs, group.query_len
        keys, values = _gather_context(k_cache, group), _gather_context(v_cache, group)   # [n, L, kv, d]
        queries = q.view(n, t, *q.shape[1:])
        if t <= SHORT_QUERY:
            out = _short_query_attention(queries, keys, values, group, self.scale)
        else:
            out = _sdpa_attention(queries, keys, values, group.mask(keys.shape[1]), self.scale)
        return out.reshape(n * t, *q.shape[1:])


SHORT_QUERY = 16     # decodes and verifications: batched matmuls beat SDPA's flash kernel on CPU


def _gather_context(cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = (group.max_context_len + block_size - 1) // block_size
    tables = group.block_tables[:, :num_blocks].reshape(-1)
    rows = cache.view(cache.shape[0], -1).index_select(0, tables)
    return rows.view(group.num_seqs, num_blocks * block_size, *cache.shape[2:])


def _short_query_attention(q, k, v, group: AttentionGroup, scale: float) -> torch.Tensor:
    """q [n, t, hq, d], k/v [n, L, hkv, d] -> [n, t, hq, d]; GQA by grouping query heads, not repeating K/V."""
    n, t, hq, d = q.shape
    hkv, g = k.shape[2], hq // k.shape[2]
    grouped = q.view(n, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * t, d)
    scores = torch.matmul(grouped, k.permute(0, 2, 3, 1))                       # [n, hkv, g*t, L]
    scores.mul_(scale).add_(group.bias(g, k.shape[1], scores.dtype))
    out = torch.matmul(scores.softmax(dim=-1), v.transpose(1, 2))                # [n, hkv, g*t, d]
    return out.view(n, hkv, g, t, d).permute(0, 3, 1, 2, 4)


def _sdpa_attention(q, k, v, mask, scale) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)
