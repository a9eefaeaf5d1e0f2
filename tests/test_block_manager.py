"""The block manager: KV memory as fixed-size blocks, reference counts, and prefix caching by chain hashes."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.serving import BlockManager, EngineSpec, Sequence


def compute_all(bm: BlockManager, s: Sequence) -> None:
    """As a step would: every token's KV is now computed; full blocks become cacheable."""
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    """Ref counts equal table occurrences; the free queue is exactly the unreferenced blocks."""
    owners = Counter(b for s in live for b in s.block_table)
    for s in live:
        assert len(set(s.block_table)) == len(s.block_table), "a block appears twice in one table"
    for block in bm.blocks:
        assert block.ref_count == owners[block.block_id]
        assert (block.ref_count == 0) == (block.block_id in bm.free_queue)
        if owners[block.block_id] > 1:
            assert block.block_hash is not None, "only prefix-cached blocks may be shared"
    assert bm.stats().used + bm.stats().free == bm.num_blocks
    assert bm.num_cached_free == sum(1 for b in bm.blocks if b.ref_count == 0 and b.block_hash is not None)
    for h, block_id in bm.hash_to_block.items():
        assert bm.blocks[block_id].block_hash == h
    # Tokens held, counted block by block (shared blocks once) against the incremental formula.
    fill: dict[int, int] = {}
    for s in live:
        for i, b in enumerate(s.block_table):
            n = min(max(s.num_computed_tokens - i * bm.block_size, 0), bm.block_size)
            fill[b] = max(fill.get(b, 0), n)
    assert bm.num_tokens_held(live) == sum(fill.values())


def test_blocks_per_budget_follow_the_memory_formula():
    cfg = kvlab.tiny_llama()  # 2 layers x 2 kv heads x head_dim 16
    per_token = 2 * 2 * 2 * 16 * 4  # K and V x layers x kv_heads x head_dim x fp32 bytes = 512
    spec = EngineSpec(block_size=16)
    assert spec.block_bytes(cfg) == 16 * per_token
    assert spec.num_blocks(cfg, 100_000) == 100_000 // (16 * per_token)  # 12 whole blocks
    assert spec.block_bytes(cfg, torch.float16) == 16 * per_token // 2
    assert spec.replace(kv_dtype=torch.float16).block_bytes(cfg) == 16 * per_token // 2
    assert spec.with_blocks(cfg, 12).kv_budget_bytes == 12 * 16 * per_token


def test_a_budget_smaller_than_one_block_is_a_clear_error():
    with pytest.raises(ValueError, match=r"holds no block.*8,192 B.*raise kv_budget_bytes"):
        EngineSpec(block_size=16).num_blocks(kvlab.tiny_llama(), 8000)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


def test_allocate_append_and_free_give_every_block_back(make_sequence):
    bm = BlockManager(8, block_size=4)
    a = make_sequence(0, range(10))
    assert bm.can_allocate(a)
    bm.allocate(a)
    assert len(a.block_table) == 3 and a.num_computed_tokens == 0  # ceil(10 / 4)
    compute_all(bm, a)
    a.append_token(99)  # 11 tokens: still fits the third block
    assert bm.can_append(a)
    bm.append_slot(a)
    assert len(a.block_table) == 3
    a.num_computed_tokens = 11
    a.append_token(98)
    a.append_token(97)  # 13 tokens: needs a fourth block
    bm.append_slot(a)
    assert len(a.block_table) == 4
    check_invariants(bm, [a])
    bm.free(a)
    assert a.block_table == [] and bm.stats().free == 8
    check_invariants(bm, [])


def test_allocation_refuses_when_the_pool_is_short(make_sequence):
    bm = BlockManager(3, block_size=4, enable_prefix_caching=False)
    a, b = make_sequence(0, range(8)), make_sequence(1, range(100, 108))
    bm.allocate(a)
    assert bm.stats().free == 1 and not bm.can_allocate(b)
    with pytest.raises(RuntimeError, match="can_allocate"):
        bm.allocate(b)


def test_a_shared_prefix_is_computed_once_and_shared_by_reference(make_sequence):
    bm = BlockManager(16, block_size=4)
    system = list(range(50, 58))  # two full blocks of shared system prompt
    a = make_sequence(0, system + [1, 2, 3])
    bm.allocate(a)
    compute_all(bm, a)  # registers blocks 0 and 1 (block 2 is not full)
    b = make_sequence(1, system + [7, 8, 9, 10, 11])
    assert bm.match_prefix(b) == a.block_table[:2]
    bm.allocate(b)
    assert b.num_cached_tokens == b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    check_invariants(bm, [a, b])
    assert bm.num_tokens_held([a, b]) == 11  # b's 8 computed tokens are a's, stored once
    compute_all(bm, b)
    assert bm.num_tokens_held([a, b]) == 11 + 13 - 8
    assert bm.stats().prefix_hit_tokens == 8 and bm.stats().prefix_queries_tokens == 11 + 13


def test_a_prefix_hit_always_leaves_a_token_to_compute(make_sequence):
    bm = BlockManager(8, block_size=4)
    a = make_sequence(0, range(8))
    bm.allocate(a)
    compute_all(bm, a)
    same = make_sequence(1, range(8))  # identical 8-token prompt: only the first block may be reused
    assert len(bm.match_prefix(same)) == 1


def test_hashes_chain_so_equal_blocks_after_different_prefixes_do_not_match(make_sequence):
    bm = BlockManager(8, block_size=4)
    a = make_sequence(0, [1, 2, 3, 4, 5, 6, 7, 8, 0])
    bm.allocate(a)
    compute_all(bm, a)
    b = make_sequence(1, [9, 9, 9, 9, 5, 6, 7, 8, 0])  # second block equal to a's, first one not
    assert bm.match_prefix(b) == []


def test_freed_prefix_blocks_stay_cached_until_evicted_least_recently_used_first(make_sequence):
    bm = BlockManager(4, block_size=2)
    a, b = make_sequence(0, [1, 2, 3]), make_sequence(1, [5, 6, 7])
    for s in (a, b):
        bm.allocate(s)
        compute_all(bm, s)
    a_first, b_first = a.block_table[0], b.block_table[0]
    bm.free(a)
    bm.free(b)  # both prefixes cached; a's freed earlier, so evicted first
    assert bm.stats().cached == 2 and bm.stats().free == 4
    assert bm.match_prefix(make_sequence(2, [1, 2, 0])) == [a_first]
    c = make_sequence(3, [9, 9, 9, 9, 9, 9, 9])  # needs all 4 blocks: 2 uncached, then a's, then b's
    bm.allocate(c)
    assert bm.stats().cached == 0
    assert bm.match_prefix(make_sequence(4, [1, 2, 0])) == []
    assert bm.match_prefix(make_sequence(5, [5, 6, 0])) == []
    bm.free(c)
    d = make_sequence(6, [9, 9, 9])
    bm.allocate(d)  # takes an uncached block: a and b are gone, but the pool is consistent
    check_invariants(bm, [d])

    # Eviction order, in a pool with room to spare: uncached blocks go first, then a's prefix (freed earlier).
    bm2 = BlockManager(5, block_size=2)
    a, b = make_sequence(0, [1, 2, 3]), make_sequence(1, [5, 6, 7])
    for s in (a, b):
        bm2.allocate(s)
        compute_all(bm2, s)
    b_first = b.block_table[0]
    bm2.free(a)
    bm2.free(b)
    e = make_sequence(2, [8] * 7)  # 4 blocks: the unused one, the two uncached tails, then a's prefix
    bm2.allocate(e)
    assert bm2.match_prefix(make_sequence(3, [1, 2, 0])) == []
    assert bm2.match_prefix(make_sequence(4, [5, 6, 0])) == [b_first]
    check_invariants(bm2, [e])


def test_prefix_caching_off_never_shares(make_sequence):
    bm = BlockManager(8, block_size=2, enable_prefix_caching=False)
    a = make_sequence(0, [1, 2, 3, 4, 5])
    bm.allocate(a)
    compute_all(bm, a)
    assert bm.match_prefix(make_sequence(1, [1, 2, 3, 4, 9])) == [] and not bm.hash_to_block


# -- properties: random operation sequences keep the books consistent ----------------------------------
ops = st.lists(st.tuples(st.sampled_from(["admit", "compute", "grow", "free"]),
                         st.integers(0, 7), st.integers(1, 12), st.integers(0, 2)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(4, 16), block_size=st.integers(1, 4), caching=st.booleans())
def test_random_operations_keep_ref_counts_tables_and_free_list_consistent(ops, num_blocks, block_size, caching,
                                                                            make_sequence):
    bm = BlockManager(num_blocks, block_size, caching)
    live: dict[int, Sequence] = {}
    prefixes = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9], [7, 7, 7, 7, 7, 7]]  # shared starts provoke hits
    next_id = 0
    for op, pick, length, prefix in ops:
        if op == "admit":
            s = make_sequence(next_id, prefixes[prefix][:length] + list(range(100, 100 + max(0, length - 6))))
            next_id += 1
            if bm.can_allocate(s):
                bm.allocate(s)
                assert s.num_computed_tokens < s.num_tokens and s.num_computed_tokens % block_size == 0
                live[s.request_id] = s
            else:
                with pytest.raises(RuntimeError):
                    bm.allocate(s)
        elif live:
            s = list(live.values())[pick % len(live)]
            if op == "compute":
                s.num_computed_tokens = min(s.num_tokens, s.num_computed_tokens + length)
                bm.cache_full_blocks(s)
            elif op == "grow" and s.num_computed_tokens == s.num_tokens:
                s.append_token(length)
                if bm.can_append(s):
                    bm.append_slot(s)
                else:
                    bm.free(s)  # what preemption does
                    del live[s.request_id]
            elif op == "free":
                bm.free(s)
                del live[s.request_id]
        check_invariants(bm, list(live.values()))
    for s in live.values():
        bm.free(s)
    check_invariants(bm, [])
    assert bm.stats().free == num_blocks and all(b.ref_count == 0 for b in bm.blocks)
