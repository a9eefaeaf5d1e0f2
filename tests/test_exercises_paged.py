"""The build-it exercises of notebooks 07 and 08: attention over a paged cache, and a block table.

Notebook 07, "attention over a paged cache": a function that gathers K/V by block table, checked
against dense attention on the contiguous K/V, with as many K/V heads as query heads and with fewer
(grouped-query attention). Notebook 08, "write the block table": a block
allocator with prefix sharing, run side by side with kvlab's BlockManager. Every slip named in the
question gets its own message here; tests/test_course.py feeds each checker its solution and its
registered wrong answer.
"""
from __future__ import annotations

import functools

import pytest
import torch

from kvlab.cache.paged import PagedAttentionMetadata, PagedKVCache
from kvlab.lessons import EXERCISES
from kvlab.lessons.l08_prefix_and_chunks.exercises import check_block_table
from kvlab.lessons.l07_memory_is_capacity.exercises import check_paged_attention
from kvlab.lessons.l07_memory_is_capacity.exercises import (PAGED_SLIPS, _paged_attention_variant, _paged_cases,
                                                     dense_attention, solution_paged_attention)
from kvlab.lessons.l08_prefix_and_chunks.exercises import (BLOCK_TABLE_SCENARIOS, EngineBlockTable, FreesSharedBlocks,
                                                    SolutionBlockTable)

LESSONS = ("07", "08")  # the lessons these tests belong to: `pytest -m lNN`


def skeleton(name: str) -> dict:
    """The answer cell of exercise ``name`` as the notebook shows it, run without its last line (the check)."""
    namespace: dict = {}
    exec(EXERCISES[name].code.rsplit("\n", 1)[0], namespace)  # noqa: S102 - the course's own skeleton
    return namespace


# --- notebook 07: attention over a paged cache ----------------------------------------------------------

def test_the_cases_have_tables_out_of_order_and_a_partly_filled_last_block():
    cases = _paged_cases()
    assert any(c["block_table"] != sorted(c["block_table"]) for c in cases)
    assert any(c["seq_len"] % c["k_blocks"].shape[1] for c in cases)
    assert any(c["seq_len"] % c["k_blocks"].shape[1] == 0 for c in cases)  # a full last block too


def test_the_cases_end_with_grouped_query_attention_at_four_and_two_query_heads_per_kv_head():
    cases = _paged_cases()
    groups = [c["q"].shape[0] // c["k_blocks"].shape[2] for c in cases]
    assert all(c["q"].shape[0] % c["k_blocks"].shape[2] == 0 for c in cases)
    assert groups[0] == 1 and {4, 2} <= set(groups)
    assert groups == sorted(groups, key=lambda g: g > 1)  # equal heads first: a GQA slip passes them, then fails


def test_the_oracle_agrees_with_kvlabs_paged_cache():
    """Dense attention on contiguous K/V is what kvlab's PagedKVCache computes for one decode over the same blocks."""
    for case in _paged_cases():
        k_blocks, table, seq_len = case["k_blocks"], case["block_table"], case["seq_len"]
        num_blocks, block_size, kv_heads, head_dim = k_blocks.shape
        heads = case["q"].shape[0]  # a multiple of kv_heads: the model's attention groups them
        cache = PagedKVCache(1, kv_heads, head_dim, num_blocks=num_blocks, block_size=block_size)
        cache.key_cache[0].copy_(k_blocks)
        cache.value_cache[0].copy_(case["v_blocks"])
        last = seq_len - 1  # the decode writes the newest token's k/v (the sequence's own last token) again
        cache.metadata = PagedAttentionMetadata.build(cache, [1], [seq_len], [table])
        q = case["q"][None, :, None, :]  # (1, heads, 1, head_dim)
        k_new, v_new = case["k"][last][None, :, None, :], case["v"][last][None, :, None, :]
        y = cache.attend(0, q, k_new, v_new)[0, :, 0]  # (heads, head_dim)
        assert y.shape == (heads, head_dim)
        torch.testing.assert_close(y, dense_attention(case["q"], case["k"], case["v"]), rtol=1e-4, atol=1e-5)


def test_the_oracle_is_plain_softmax_attention_with_kv_heads_repeated_for_their_group():
    for case in _paged_cases():
        q, k, v = case["q"], case["k"], case["v"]  # (heads, hs), (seq_len, kv_heads, hs)
        group = q.shape[0] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (seq_len, heads, hs)
        weights = (torch.einsum("hd,shd->hs", q, k) / q.shape[1] ** 0.5).softmax(dim=-1)
        torch.testing.assert_close(dense_attention(case["q"], case["k"], case["v"]),
                                   torch.einsum("hs,shd->hd", weights, v), rtol=1e-4, atol=1e-5)


def test_the_reference_passes():
    feedback = check_paged_attention(solution_paged_attention)
    assert feedback.correct and "all 6 cases" in feedback.message


PAGED_MESSAGES = {
    "sorted": "in the order of their ids",
    "first": "the first blocks of the pool",
    "uncut": "forgot to cut at seq_len",
    "unscaled": "forgot the 1/sqrt(head_dim) scale",
    "by_dim": "divided the scores by head_dim",
    "softmax_heads": "softmax runs over the heads",
    "tiled_heads": "h % kv_heads",
}
PAGED_VARIANTS = dict(zip(PAGED_MESSAGES, (v for v, _ in PAGED_SLIPS)))


@pytest.mark.parametrize("slip", list(PAGED_MESSAGES))
def test_each_paged_attention_slip_gets_its_own_message(slip):
    feedback = check_paged_attention(functools.partial(_paged_attention_variant, **PAGED_VARIANTS[slip]))
    assert not feedback.correct
    assert PAGED_MESSAGES[slip] in feedback.message, feedback.message
    assert not any(m in feedback.message for s, m in PAGED_MESSAGES.items() if s != slip), feedback.message


def assumes_equal_heads(q, k_blocks, v_blocks, block_table, seq_len):
    """GQA-ignorant: reshapes the pool with the query heads, as if K/V had as many."""
    heads, head_dim = q.shape
    k = k_blocks[block_table].reshape(-1, heads, head_dim)[:seq_len]
    v = v_blocks[block_table].reshape(-1, heads, head_dim)[:seq_len]
    weights = (torch.einsum("hd,shd->hs", q, k) / head_dim ** 0.5).softmax(dim=-1)
    return torch.einsum("hs,shd->hd", weights, v)


def indexes_kv_with_the_query_head(q, k_blocks, v_blocks, block_table, seq_len):
    """GQA-ignorant: query head h reads K/V head h, which does not exist past kv_heads."""
    heads, head_dim = q.shape
    kv_heads = k_blocks.shape[2]
    k = k_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]
    v = v_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]
    return torch.stack([(k[:, h] @ q[h] / head_dim ** 0.5).softmax(dim=0) @ v[:, h] for h in range(heads)])


def one_output_per_kv_head(q, k_blocks, v_blocks, block_table, seq_len):
    """GQA-ignorant: takes the heads from the pool, and answers for kv_heads query heads only."""
    kv_heads, head_dim = k_blocks.shape[2], q.shape[1]
    k = k_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]
    v = v_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]
    weights = (torch.einsum("hd,shd->hs", q[:kv_heads], k) / head_dim ** 0.5).softmax(dim=-1)
    return torch.einsum("hs,shd->hd", weights, v)


@pytest.mark.parametrize("ignorant", [assumes_equal_heads, indexes_kv_with_the_query_head, one_output_per_kv_head],
                         ids=lambda f: f.__name__)
def test_a_solution_that_ignores_grouped_query_attention_is_refused_naming_the_grouped_case(ignorant):
    equal = [c for c in _paged_cases() if c["q"].shape[0] == c["k_blocks"].shape[2]]
    for case in equal:  # right wherever K/V heads are as many as query heads...
        args = {k: v for k, v in case.items() if k not in ("k", "v")}
        torch.testing.assert_close(ignorant(**args), dense_attention(case["q"], case["k"], case["v"]),
                                   rtol=1e-4, atol=1e-5)
    feedback = check_paged_attention(ignorant)  # ...and refused on the first grouped case
    assert not feedback.correct
    assert "with heads=8, kv_heads=2" in feedback.message and "grouped-query attention" in feedback.message
    assert "h // (heads // kv_heads)" in feedback.message, feedback.message


def test_a_wrong_shape_a_crash_and_the_skeleton_are_explained():
    flat = check_paged_attention(lambda q, k_blocks, v_blocks, block_table, seq_len: q.flatten())
    assert not flat.correct and "(heads, head_dim)" in flat.message
    crash = check_paged_attention(lambda q, k_blocks, v_blocks, block_table, seq_len: k_blocks[99])
    assert not crash.correct and "IndexError" in crash.message
    shown = check_paged_attention(skeleton("check_paged_attention")["paged_attention"])
    assert not shown.correct and "differs from dense attention" in shown.message
    assert "function itself" in check_paged_attention(3).message


# --- notebook 08: write the block table -----------------------------------------------------------------

def test_the_reference_and_the_engines_own_block_manager_pass():
    for cls in (SolutionBlockTable, EngineBlockTable):
        feedback = check_block_table(cls)
        assert feedback.correct, (cls.__name__, feedback)
        assert "match kvlab's BlockManager" in feedback.message


def test_the_scenarios_share_blocks_and_run_out_of_them():
    """The oracle's own run: the scenarios reach sharing, a block filled by append, and a full pool."""
    shared = ran_out = 0
    for _, num_blocks, bs, ops in BLOCK_TABLE_SCENARIOS:
        oracle = EngineBlockTable(num_blocks, bs)
        for kind, *args in ops:
            try:
                getattr(oracle, kind)(*args)
            except MemoryError:
                ran_out += 1
            tables = list(oracle.tables.values())
            shared = max(shared, sum(len(t) for t in tables) - len({b for t in tables for b in t}))
    assert shared >= 3 and ran_out >= 2


class FloorBlocks(SolutionBlockTable):
    """Slip: len(tokens) // block_size blocks for a prompt, forgetting the partly filled last one."""

    def allocate(self, seq_id, token_ids):
        super().allocate(seq_id, token_ids)
        table = self.tables[seq_id]
        if len(token_ids) % self.block_size and len(table) > len(token_ids) // self.block_size:
            block = table.pop()
            self.ref_count[block] = 0
            self.free_blocks.insert(0, block)


class ExtraBlockWhenFull(SolutionBlockTable):
    """Slip: len(tokens) // block_size + 1 blocks, one too many for a prompt that fills its blocks exactly."""

    def allocate(self, seq_id, token_ids):
        super().allocate(seq_id, token_ids)
        if len(token_ids) % self.block_size == 0:
            self.tables[seq_id].append(self._take())


class AppendEarly(SolutionBlockTable):
    """Slip: a new block when one slot of the last block is still free."""

    def append(self, seq_id, token_id):
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        if len(tokens) + 1 == len(table) * self.block_size:
            table.append(self._take())
        tokens.append(token_id)


class AppendLate(SolutionBlockTable):
    """Slip: a new block only once the token count has passed the table's slots."""

    def append(self, seq_id, token_id):
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        if len(tokens) > len(table) * self.block_size:  # checked before the token is stored: one too late
            table.append(self._take())
        tokens.append(token_id)


class NoSharing(SolutionBlockTable):
    """Slip: every prompt gets new blocks."""

    def _register(self, seq_id, i):
        pass


class SharesPartialBlocks(SolutionBlockTable):
    """Slip: the partly filled last block of a prompt is offered for reuse too."""

    def allocate(self, seq_id, token_ids):
        bs, tokens = self.block_size, list(token_ids)
        table = super().allocate(seq_id, token_ids)
        if len(tokens) % bs:
            key = ("partial", tuple(tokens))
            if key in self.full_blocks and len(table) >= 1:  # reuse another's partial block
                mine = table.pop()
                self.ref_count[mine] = 0
                self.free_blocks.insert(0, mine)
                table.append(self.full_blocks[key])
                self.ref_count[self.full_blocks[key]] += 1
            else:
                self.full_blocks[key] = table[-1]
        return table


class OwnTokensKey(SolutionBlockTable):
    """Slip: a block is looked up by its own tokens, not by the whole prefix up to its end."""

    def allocate(self, seq_id, token_ids):
        bs, tokens = self.block_size, list(token_ids)
        table = []
        for i in range(-(-len(tokens) // bs)):
            key = tuple(tokens[i * bs:(i + 1) * bs])
            if len(key) == bs and key in self.full_blocks:
                self.ref_count[self.full_blocks[key]] += 1
                table.append(self.full_blocks[key])
            else:
                table.append(self._take())
        self.tables[seq_id], self.tokens[seq_id] = table, tokens
        for i in range(len(tokens) // bs):
            self.full_blocks.setdefault(tuple(tokens[i * bs:(i + 1) * bs]), table[i])
        return table


class LeaksReusableBlocks(SolutionBlockTable):
    """Slip: a block offered for reuse (full) never comes back to the free list, even after its last user leaves."""

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0 and block not in self.full_blocks.values():
                self.free_blocks.append(block)
        del self.tokens[seq_id]


class LeaksEverything(SolutionBlockTable):
    """Slip: free forgets the sequence but returns no block."""

    def free(self, seq_id):
        del self.tables[seq_id], self.tokens[seq_id]


class KeepsFreedPrefixes(SolutionBlockTable):
    """Slip: a freed block stays in the prefix lookup, and is found again after another sequence took it."""

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free_blocks.append(block)
        del self.tokens[seq_id]


class NoRegisterOnAppend(SolutionBlockTable):
    """Slip: only a prompt's full blocks are offered for reuse, not a block filled by append."""

    def append(self, seq_id, token_id):
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        if len(tokens) == len(table) * self.block_size:
            if not self.free_blocks:
                raise MemoryError("full")
            table.append(self._take())
        tokens.append(token_id)


class TakesThenChecks(SolutionBlockTable):
    """Slip: allocate takes blocks one by one and finds out the pool is too small halfway."""

    def allocate(self, seq_id, token_ids):
        bs, tokens = self.block_size, list(token_ids)
        table = []
        for i in range(len(tokens) // bs):
            block = self.full_blocks.get(tuple(tokens[:(i + 1) * bs]))
            if block is None:
                break
            self.ref_count[block] += 1
            table.append(block)
        shared = len(table)
        while len(table) < -(-len(tokens) // bs):
            if not self.free_blocks:
                raise MemoryError("out of blocks")  # the blocks taken so far stay taken
            table.append(self._take())
        self.tables[seq_id], self.tokens[seq_id] = table, tokens
        for i in range(shared, len(tokens) // bs):
            self._register(seq_id, i)
        return table


class NeverChecks(SolutionBlockTable):
    """Slip: no check for a full pool (list.pop on an empty free list raises IndexError)."""

    def append(self, seq_id, token_id):
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        if len(tokens) == len(table) * self.block_size:
            table.append(self._take())
        tokens.append(token_id)
        if len(tokens) % self.block_size == 0:
            self._register(seq_id, len(table) - 1)


BLOCK_SLIPS = {
    FloorBlocks: "the last, partly filled block counts too",
    ExtraBlockWhenFull: "no block is needed for a token that has not arrived yet",
    AppendEarly: "while its last block still had a free slot",
    AppendLate: "an off-by-one on a full block",
    NoSharing: "reuse the blocks already held for that prefix",
    SharesPartialBlocks: "which is only partly filled",
    OwnTokensKey: "matched a block by its own tokens only",
    FreesSharedBlocks: "returned blocks another sequence still uses",
    LeaksReusableBlocks: "a leak",
    LeaksEverything: "a leak",
    KeepsFreedPrefixes: "whose last user had freed it",
    NoRegisterOnAppend: "filled its block",
    TakesThenChecks: "had already changed the pool",
    NeverChecks: "raise MemoryError, so the caller can tell",
}


@pytest.mark.parametrize("slip", list(BLOCK_SLIPS), ids=lambda c: c.__name__)
def test_each_block_table_slip_gets_its_own_message(slip):
    feedback = check_block_table(slip)
    assert not feedback.correct
    assert BLOCK_SLIPS[slip] in feedback.message, feedback.message
    others = {m for s, m in BLOCK_SLIPS.items() if m != BLOCK_SLIPS[slip]}
    assert not any(m in feedback.message for m in others), feedback.message


def test_the_block_table_skeleton_as_shown_is_answered_without_an_error():
    feedback = check_block_table(skeleton("check_block_table")["MyBlockTable"])
    assert not feedback.correct and "partly filled block counts too" in feedback.message


def test_a_block_table_that_is_not_a_class_is_explained():
    assert "class itself" in check_block_table(SolutionBlockTable(4, 4)).message
    assert "raised TypeError" in check_block_table(int).message
