"""The engine on the real decoder: batched paged execution gives exactly the tokens of one-at-a-time generate."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache.base import causal_attention, kv_cache_bytes
from kvlab.serving import (Engine, PagedAttentionMetadata, PagedKVCache, SamplingParams, SchedulerConfig,
                           StepShape, TRACE_COLUMNS)
from kvlab.workload import Request, make_workload
from kvlab.serving.config import EngineSpec


def reference_tokens(model, request: Request) -> list[int]:
    return kvlab.generate(model, request.prompt, cache="dynamic", max_new_tokens=request.max_new_tokens).tokens


def assert_same_tokens_as_generate(model, engine: Engine, requests: list[Request]) -> None:
    for r in requests:
        assert engine.sequences[r.request_id].output_token_ids == reference_tokens(model, r), \
            f"request {r.request_id} differs from single-sequence generate"


def blocks(model, n: int, block_size: int) -> int:
    return n * EngineSpec(block_size=block_size).block_bytes(model.config)


# -- the paged cache against dense attention -----------------------------------------------------------
def test_paged_attention_equals_dense_causal_attention_per_sequence():
    torch.manual_seed(0)
    nh, nkv, hs, bs = 4, 2, 8, 4
    cache = PagedKVCache(1, nkv, hs, num_blocks=12, block_size=bs)
    # Sequence 0: 6 tokens already stored, 1 new (decode). Sequence 1: 3 stored, a 5-token chunk.
    # Sequence 2: a fresh 7-token prompt. Blocks deliberately out of order.
    tables, stored, new = [[7, 2], [5, 0, 9], [11, 3]], [6, 3, 0], [1, 5, 7]
    dense_k = [torch.randn(1, nkv, s + n, hs) for s, n in zip(stored, new)]
    dense_v = [torch.randn(1, nkv, s + n, hs) for s, n in zip(stored, new)]
    for table, s, k, v in zip(tables, stored, dense_k, dense_v):  # write the history into the pool by hand
        for pos in range(s):
            block, off = table[pos // bs], pos % bs
            cache.key_cache[0][block, off] = k[0, :, pos]
            cache.value_cache[0][block, off] = v[0, :, pos]
    q = [torch.randn(1, nh, n, hs) for n in new]
    cache.metadata = PagedAttentionMetadata.build(cache, new, [s + n for s, n in zip(stored, new)], tables)
    packed = lambda xs, s_list: torch.cat([x[:, :, s:] for x, s in zip(xs, s_list)], dim=2)  # noqa: E731
    out = cache.attend(0, torch.cat(q, dim=2), packed(dense_k, stored), packed(dense_v, stored))  # (1, nh, 13, hs)
    expected = torch.cat([causal_attention(qi, k, v) for qi, k, v in zip(q, dense_k, dense_v)], dim=2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert cache.metadata.decode_rows == [0] and cache.metadata.prefill_rows == [1, 2]


def test_paged_cache_memory_counts_tokens_and_in_block_waste():
    cfg = kvlab.tiny_llama()
    cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, num_blocks=10, block_size=16)
    cache.set_usage(num_tokens=37, num_blocks=3)  # e.g. 20 + 17 tokens in 2 + ... blocks
    per_token = kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1)
    m = cache.memory()
    assert m.allocated_bytes == 160 * per_token == sum(t.numel() * 4 for t in cache.key_cache + cache.value_cache)
    assert m.used_bytes == 37 * per_token and m.reserved_bytes == 123 * per_token
    u = cache.usage()
    assert u["in_block_waste_bytes"] == (48 - 37) * per_token and u["free_bytes"] == 7 * 16 * per_token


# -- exact tokens, batched ---------------------------------------------------------------------------------
def test_chunked_prefill_mixed_batches_give_the_greedy_tokens_of_generate(each_model):
    requests = make_workload("short_short", 6, arrival="poisson", rate=400.0, vocab_size=320, seed=3)
    engine = Engine(each_model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=24, max_model_len=128)))
    records = engine.run(requests, clock="virtual")
    assert all(r.status == "completed" for r in records)
    trace = engine.trace_frame()
    chunked = any(n < engine.sequences[rid].num_prompt_tokens
                  for rids, ns, decs in zip(trace.request_ids, trace.num_new_tokens, trace.is_decode)
                  for rid, n, dec in zip(rids, ns, decs) if not dec)
    assert chunked, "no prompt was split: the test does not exercise chunked prefill"
    assert ((trace.num_prefill_seqs > 0) & (trace.num_decode_seqs > 0)).any(), "no mixed prefill + decode step"
    assert_same_tokens_as_generate(each_model, engine, requests)


def test_preemption_by_recompute_gives_the_greedy_tokens_of_generate(each_model):
    g = torch.Generator().manual_seed(4)
    requests = [Request(i, 20, 20, 0.0, "x", prompt=torch.randint(0, 320, (20,), generator=g).tolist())
                for i in range(4)]
    # 16 blocks of 4 = 64 tokens: three 20-token prompts fit (5 blocks each), then their decodes need more.
    engine = Engine(each_model, EngineSpec(block_size=4, kv_budget_bytes=blocks(each_model, 16, 4), enable_prefix_caching=False, scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=32, max_model_len=48)))
    records = engine.run(requests, clock="virtual")
    assert engine.stats()["preemptions"] > 0, "the budget did not force a preemption"
    assert sum(r.extra["preemptions"] for r in records) == engine.stats()["preemptions"]
    assert all(r.status == "completed" for r in records)
    assert_same_tokens_as_generate(each_model, engine, requests)


def test_prefix_cache_hits_on_a_shared_system_prompt_give_the_greedy_tokens_of_generate(each_model):
    requests = make_workload("short_short", 6, arrival="all_at_once", vocab_size=320, seed=5,
                             shared_prefix_tokens=40)
    for r in requests[1:]:  # the first computes the system prompt; the others arrive later, together
        r.arrival_s = 10.0  # (virtual seconds: the clock jumps over the idle gap)
    engine = Engine(each_model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=64, max_model_len=160)))
    records = engine.run(requests, clock="virtual")
    assert engine.stats()["prefix_hit_tokens"] == 5 * 40  # 40 tokens = 5 full blocks reused by each later request
    assert [r.extra["cached_tokens"] for r in records] == [0] + [40] * 5
    assert_same_tokens_as_generate(each_model, engine, requests)


def test_static_batching_and_prefill_first_give_the_same_tokens_too(each_model):
    requests = make_workload("short_short", 5, arrival="all_at_once", vocab_size=320, seed=6)
    for sched in (SchedulerConfig(policy="static", max_seqs=3, max_batch_tokens=64, max_model_len=128),
                  SchedulerConfig(priority="prefill_first", max_seqs=3, max_batch_tokens=32, max_model_len=128)):
        engine = Engine(each_model, EngineSpec(block_size=16, scheduler=sched))
        engine.run(requests, clock="virtual")
        assert_same_tokens_as_generate(each_model, engine, requests)


def test_seeded_sampling_matches_generate_and_repeats(model):
    requests = make_workload("short_short", 3, arrival="all_at_once", vocab_size=320, seed=7)
    sampling = SamplingParams(temperature=0.8, seed=11)
    runs = []
    for _ in range(2):
        engine = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_model_len=128)), sampling=sampling)
        engine.run(requests, clock="virtual")
        runs.append([engine.sequences[r.request_id].output_token_ids for r in requests])
    assert runs[0] == runs[1]
    for r, tokens in zip(requests, runs[0]):
        ref = kvlab.generate(model, r.prompt, max_new_tokens=r.max_new_tokens, temperature=0.8, seed=11).tokens
        assert tokens == ref


# -- bad input ------------------------------------------------------------------------------------------------
def test_a_prompt_longer_than_the_context_fails_alone_with_its_reason(model):
    requests = [Request(0, 10, 5, 0.0, "ok"), Request(1, 60, 8, 0.0, "too long"), Request(2, 12, 4, 0.0, "ok")]
    engine = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=32, max_model_len=64)))
    records = engine.run(requests, clock="virtual")
    assert [r.status for r in records] == ["completed", "failed", "completed"]
    assert records[1].fail_reason == "prompt_too_long" and records[1].token_s == []
    assert [len(r.token_s) for r in (records[0], records[2])] == [5, 4]


def test_budgets_and_options_that_cannot_work_are_clear_errors_at_construction(model):
    # the tiny Llama holds 512 B of K/V per token
    with pytest.raises(ValueError, match="holds no block"):
        Engine(model, EngineSpec(block_size=16, kv_budget_bytes=1000))
    with pytest.raises(ValueError, match=r"fewer than max_model_len=1024.*kv_budget_bytes to >= 524,288"):
        Engine(model, EngineSpec(block_size=16, kv_budget_bytes=100_000))
    with pytest.raises(ValueError, match=r"max_batch_tokens \(8\) < block_size \(16\)"):
        Engine(model, EngineSpec(block_size=16, scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=8, max_model_len=64)))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        Engine(model, EngineSpec(scheduler=SchedulerConfig(max_model_len=4096)))
    with pytest.raises(ValueError, match="no weights"):
        Engine(kvlab.tiny_llama())
    engine = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_model_len=64)))
    with pytest.raises(ValueError, match="unknown clock 'cpu'"):
        engine.run([Request(0, 4, 2, 0.0, "x")], clock="cpu")
    with pytest.raises(ValueError, match="appears more than once"):
        engine.run([Request(0, 4, 2, 0.0, "x"), Request(0, 4, 2, 0.0, "x")])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request(Request(5, 2, 2, 0.0, "x", prompt=[1, 999]))


# -- the loop: clocks, abort, trace ------------------------------------------------------------------------
def test_wall_clock_run_stamps_every_request_in_order(model):
    requests = [Request(0, 8, 4, 0.0, "a"), Request(1, 8, 3, 0.03, "b")]  # the second arrives while idle
    engine = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_model_len=64)))
    records = engine.run(requests, clock="wall")
    for r in records:
        assert r.status == "completed" and len(r.token_s) == r.max_new_tokens
        stamps = [r.scheduled_s, r.sent_s, r.admitted_s, *r.token_s, r.finished_s]
        assert stamps == sorted(stamps)
        assert r.first_token_s == r.token_s[0] and r.finished_s == r.token_s[-1]
    assert records[1].sent_s >= 0.03  # released at its arrival, not before


def test_abort_frees_the_blocks_of_a_running_request(model):
    engine = Engine(model, EngineSpec(block_size=4, scheduler=SchedulerConfig(max_model_len=64), enable_prefix_caching=False))
    engine.add_request(Request(0, 10, 20, 0.0, "x"))
    engine.add_request(Request(1, 10, 20, 0.0, "x"))
    engine.step()
    engine.step()
    used = engine.block_manager.stats().used
    assert engine.abort(0) and not engine.abort(0)
    assert engine.block_manager.stats().used == used - 3  # its 11 tokens sat in 3 blocks of 4
    assert engine.records[0].status == "failed" and engine.records[0].fail_reason == "cancelled"
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.records[1].status == "completed" and engine.block_manager.stats().used == 0


def test_the_trace_has_one_row_per_step_and_the_pool_drains(model):
    requests = make_workload("short_short", 5, arrival="all_at_once", seed=8)  # no vocab: seeded random prompts
    engine = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_seqs=3, max_batch_tokens=32, max_model_len=128)))
    done = []
    records = engine.run(requests, clock="virtual", progress=lambda d, t: done.append((d, t)))
    trace = engine.trace_frame()
    assert list(trace.columns) == list(TRACE_COLUMNS) and len(trace) == engine.stats()["steps"]
    assert (trace.num_tokens <= 32).all() and (trace.num_running <= 3).all()
    assert trace.num_prefill_tokens.sum() == sum(r.prompt_tokens for r in requests)  # no preemption, no hits
    assert trace.num_decode_seqs.sum() == sum(r.max_new_tokens - 1 for r in requests)
    assert (trace.start_s.diff().dropna() >= 0).all() and (trace.duration_s > 0).all()
    assert done[-1] == (5, 5) and len(done) == 5
    assert engine.block_manager.stats().used == 0 and all(b.ref_count == 0 for b in engine.block_manager.blocks)
    gantt = engine.step_requests_frame()
    assert set(gantt.phase) == {"prefill", "decode"} and gantt.num_tokens.sum() == trace.num_tokens.sum()
    assert sorted(gantt.request_id.unique()) == [r.request_id for r in requests]
    assert engine.executor.cache.memory().used_bytes == 0  # nothing held after the last step
    # A StepShape is what a cost model prices: prefill tokens, decoding sequences, KV tokens read.
    shape = StepShape(num_prefill_tokens=30, num_prefill_seqs=1, num_decode_seqs=4, prefill_kv_tokens=30,
                      decode_kv_tokens=100)
    assert (shape.num_tokens, shape.num_seqs, shape.kv_tokens_read) == (34, 5, 130)
    again = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_seqs=3, max_batch_tokens=32, max_model_len=128)))
    again.run(requests, clock="virtual")
    assert [again.sequences[r.request_id].token_ids for r in requests] == \
        [engine.sequences[r.request_id].token_ids for r in requests]  # deterministic given the seed
