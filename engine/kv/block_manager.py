"""Paged KV-cache bookkeeping: ref-counted blocks, on-demand allocation, and prefix caching.

A full block of computed tokens is published under a chained hash (hash of the previous block's hash
and this block's token ids; the first block chains from the sequence's LoRA adapter, so one adapter's
KV never serves another's or the base model's). A later sequence whose prompt starts with the same
tokens takes those blocks instead of recomputing them; a hit is verified against the stored token ids,
so a hash collision costs a miss, never a wrong answer. Freed blocks that carry a hash stay findable
until the pool needs them, least recently freed first; blocks without a hash are handed out before them.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from specfleet.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class PrefixCacheStats:
    queried_tokens: int = 0
    hit_tokens: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 watermark: float = 0.01) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = max(1, int(watermark * num_blocks)) if num_blocks > 4 else 0
        self._free_plain: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()   # LRU: oldest first
        self._hash_to_block: dict[int, int] = {}
        self._seq_hashes: dict[str, list[int]] = {}                 # request_id -> published hashes
        self.prefix_stats = PrefixCacheStats()

    # ---- pool state -------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def reserve(self, num_blocks: int) -> list[int]:
        """Take blocks out of the pool for good (no sequence owns them): scratch space for a profiler."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot reserve {num_blocks} blocks, {self.num_free_blocks} are free")
        return [self._allocate() for _ in range(num_blocks)]

    # ---- admission ----------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks covering the longest prefix of `seq`, never including its last token."""
        if not self.enable_prefix_caching:
            return []
        hits, prev = [], _root(seq)
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            prev = hash((prev, tokens))
            block_id = self._hash_to_block.get(prev)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    def try_admit(self, seq: Sequence, max_new_tokens: int) -> int:
        """Give a waiting sequence its cached prefix and blocks for its first chunk.

        Returns the chunk size scheduled (0: not admitted, nothing changed). Admission keeps the
        watermark of free blocks so that running sequences can still grow.
        """
        hits = self.match_prefix(seq)
        num_cached = len(hits) * self.block_size
        chunk = min(seq.num_tokens - num_cached, max_new_tokens)
        if chunk <= 0:
            return 0
        new_blocks = self.blocks_for(num_cached + chunk) - len(hits)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if self.num_free_blocks - new_blocks - revived < self.watermark_blocks:
            return 0
        for block_id in hits:
            self._take(block_id)
        seq.block_table = hits + [self._allocate() for _ in range(new_blocks)]
        seq.num_computed_tokens = seq.num_cached_tokens = num_cached
        self._seq_hashes[seq.request_id] = self._chain(seq, len(hits))
        self.prefix_stats.queried_tokens += seq.num_tokens
        self.prefix_stats.hit_tokens += num_cached
        return chunk

    # ---- growth, publication, release -----------------------------------------------------
    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self._missing_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room in `seq`'s block table for its next `num_new_tokens` KV entries."""
        for _ in range(self._missing_blocks(seq, num_new_tokens)):
            seq.block_table.append(self._allocate())

    def publish(self, seq: Sequence) -> None:
        """Register the hashes of blocks that became full of computed KV since the last call."""
        if not self.enable_prefix_caching:
            return
        hashes = self._seq_hashes.setdefault(seq.request_id, [])
        for i in range(len(hashes), seq.num_computed_tokens // self.block_size):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            h = hash((hashes[-1] if hashes else _root(seq), tokens))
            hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = h, tokens
            self._hash_to_block.setdefault(h, block.block_id)

    def trim(self, seq: Sequence) -> None:
        """Free blocks past `seq.num_computed_tokens` (KV of rejected speculative tokens)."""
        keep = self.blocks_for(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; the tail goes first so shared prefixes stay cached longest."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        self._seq_hashes.pop(seq.request_id, None)

    # ---- internals ----------------------------------------------------------------------------
    def _missing_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def _chain(self, seq: Sequence, num_blocks: int) -> list[int]:
        return [self.blocks[b].hash for b in seq.block_table[:num_blocks]]

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._free_cached.pop(block_id)
        block.ref_count += 1

    def _allocate(self) -> int:
        if self._free_plain:
            block_id = self._free_plain.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self._hash_to_block.get(block.hash) == block_id:
            del self._hash_to_block[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        if block.hash is not None and self._hash_to_block.get(block.hash) == block_id:
            self._free_cached[block_id] = None
        else:
            block.hash, block.token_ids = None, ()
            self._free_plain.append(block_id)


def _root(seq: Sequence) -> tuple[str, int] | None:
    """What the first block's hash chains from: None for the base model (hashes as before), else the adapter."""
    return ("lora", seq.lora_id) if seq.lora_id else None
