"""Block manager: allocation on demand, prefix hashes verified on hit, LRU reuse, watermark."""
from __future__ import annotations

from specfleet.engine.kv.block_manager import BlockManager
from specfleet.engine.sampling_params import SamplingParams
from specfleet.engine.sequence import Sequence


def seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, list(tokens), len(tokens), SamplingParams())


def run_prefill(bm: BlockManager, s: Sequence) -> None:
    chunk = bm.try_admit(s, 10_000)
    assert chunk > 0
    s.num_computed_tokens += chunk
    bm.publish(s)


def test_allocates_blocks_on_demand_as_the_sequence_grows():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False, watermark=0)
    s = seq("a", range(6))
    assert bm.try_admit(s, 100) == 6 and len(s.block_table) == 2
    s.num_computed_tokens = 6
    s.token_ids += [1, 2, 3]
    bm.append(s, 3)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7


def test_prefix_hit_reuses_blocks_but_never_the_last_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq("a", range(12))
    run_prefill(bm, a)
    b = seq("b", range(12))
    assert bm.try_admit(b, 100) == 4                     # 8 tokens hit; the last block is recomputed
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2


def test_hash_collision_is_a_miss_not_a_wrong_hit():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq("a", range(8))
    run_prefill(bm, a)
    bm.blocks[a.block_table[0]].token_ids = (9, 9, 9, 9)      # stored tokens no longer match the hash
    assert bm.match_prefix(seq("b", range(9))) == []


def test_freed_cached_blocks_are_found_again_until_reused_least_recent_first():
    bm = BlockManager(num_blocks=4, block_size=2, watermark=0)
    a = seq("a", [1, 2, 3, 4, 5])
    run_prefill(bm, a)
    first_two = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = seq("b", [1, 2, 3, 4, 9])
    run_prefill(bm, b)
    assert b.block_table[:2] == first_two and b.num_cached_tokens == 4
    bm.free(b)
    c = seq("c", [7, 7, 7, 7, 7, 7, 7])                       # needs all 4 blocks: evicts the cache
    run_prefill(bm, c)
    assert bm.match_prefix(seq("d", [1, 2, 3, 4, 5])) == []


def test_admission_keeps_the_watermark_free():
    bm = BlockManager(num_blocks=100, block_size=4, watermark=0.1)
    s = seq("a", range(4 * 91))
    assert bm.try_admit(s, 10_000) == 0 and bm.num_free_blocks == 100
    assert bm.try_admit(seq("b", range(4 * 90)), 10_000) == 360


def test_trim_frees_blocks_past_the_computed_tokens():
    bm = BlockManager(num_blocks=10, block_size=4, watermark=0)
    s = seq("a", range(5))
    bm.try_admit(s, 100)
    s.num_computed_tokens = 5
    bm.append(s, 8)                                           # room for a 7-token verification
    assert len(s.block_table) == 4
    s.num_computed_tokens = 7
    bm.trim(s)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 8
