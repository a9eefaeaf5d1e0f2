"""The scheduler: static and continuous batching, priorities, chunked prefill, preemption, rejection."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.clocks import summarize
from kvlab.serving import (BlockManager, Engine, Executor, Scheduler, SchedulerConfig, SchedulerOutput, Sequence,
                           SequenceStatus, StepResult)
from kvlab.workload import Request
from kvlab.serving.config import EngineSpec

VOCAB = 50  # as conftest's make_sequence: prompts given as a length use token ids below 50


def next_token(seq: Sequence) -> int:
    """A deterministic stand-in for the model's choice (the scheduler never looks at token values)."""
    return (sum(seq.token_ids) * 31 + seq.num_tokens) % VOCAB


def run_step(sched: Scheduler, now: float = 0.0) -> SchedulerOutput:
    out = sched.schedule(now)
    sched.postprocess(out, [next_token(s) if d else None for s, d in zip(out.seqs, out.do_sample)])
    return out


def check_step(sched: Scheduler, out: SchedulerOutput, chunked: bool) -> None:
    cfg, bm = sched.config, sched.block_manager
    assert sum(out.num_new_tokens) <= cfg.max_batch_tokens
    assert len(out.seqs) <= cfg.max_seqs and len(sched.running) <= cfg.max_seqs
    assert len({id(s) for s in out.seqs}) == len(out.seqs), "a sequence scheduled twice in one step"
    assert out.shape.num_tokens == sum(out.num_new_tokens) and out.shape.num_seqs == len(out.seqs)
    for s, n in zip(out.seqs, out.num_new_tokens):
        assert s.status is SequenceStatus.RUNNING and 1 <= n
        if not chunked:
            assert n == s.num_uncomputed_tokens, "without chunked prefill a prompt runs whole"
        assert s.num_computed_tokens + n <= len(s.block_table) * bm.block_size, "tokens without a slot"


def check_blocks(sched: Scheduler) -> None:
    bm = sched.block_manager
    owners = Counter(b for s in sched.running for b in s.block_table)
    assert all(not s.block_table for s in sched.waiting)
    for block in bm.blocks:
        assert block.ref_count == owners[block.block_id], "ref count differs from the block tables"
        if block.ref_count > 1:
            assert block.block_hash is not None
    assert bm.stats().used + bm.stats().free == bm.num_blocks


# -- configuration errors --------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(max_seqs=0), "max_seqs must be an integer >= 1"),
    (dict(max_batch_tokens=0), "max_batch_tokens must be an integer >= 1"),
    (dict(policy="round_robin"), "unknown scheduling policy 'round_robin'"),
    (dict(priority="shortest_first"), "unknown priority 'shortest_first'"),
    (dict(max_seqs=8, max_batch_tokens=4), r"max_batch_tokens \(4\) < max_seqs \(8\)"),
    (dict(max_waiting=0), "max_waiting"),
    (dict(batch_wait_s=-1.0), "batch_wait_s"),
])
def test_invalid_scheduler_options_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


def test_options_that_need_the_block_size_or_context_are_checked_at_construction():
    with pytest.raises(ValueError, match=r"max_batch_tokens \(8\) < block_size \(16\)"):
        Scheduler(SchedulerConfig(max_seqs=2, max_batch_tokens=8), BlockManager(64, 16), max_model_len=128)
    with pytest.raises(ValueError, match="chunked_prefill=True"):
        Scheduler(SchedulerConfig(max_batch_tokens=64, chunked_prefill=False), BlockManager(64, 16), max_model_len=128)


# -- rejection -------------------------------------------------------------------------------------
def test_requests_too_long_or_beyond_a_full_queue_fail_with_their_reason(make_sequence):
    sched = Scheduler(SchedulerConfig(max_waiting=2, max_model_len=32), BlockManager(16, 4), max_model_len=32)
    assert sched.add_sequence(make_sequence(0, 30, 3)) == "prompt_too_long"  # 30 + 3 > 32
    assert sched.add_sequence(make_sequence(1, 4, 4)) is None
    assert sched.add_sequence(make_sequence(2, 4, 4)) is None
    third = make_sequence(3, 4, 4)
    assert sched.add_sequence(third) == "queue_full"
    assert third.status is SequenceStatus.FAILED and third.finish_reason == "queue_full"
    assert len(sched.waiting) == 2


# -- chunked prefill and budgets ---------------------------------------------------------------------
def test_chunked_prefill_splits_a_long_prompt_across_steps(make_sequence):
    sched = Scheduler(SchedulerConfig(max_seqs=2, max_batch_tokens=16), BlockManager(32, 4), max_model_len=64)
    sched.add_sequence(make_sequence(0, 40, 2))
    chunks = [run_step(sched).num_new_tokens for _ in range(3)]
    assert chunks == [[16], [16], [8]]
    s = sched.running[0]
    assert s.num_output_tokens == 1  # sampled only when the last chunk ran


def test_decode_first_and_prefill_first_favour_who_they_say(make_sequence):
    """A decodes; B's 32-token prompt arrives. prefill_first: B's first token sooner, A stalls meanwhile."""
    first_token_step, a_token_steps = {}, {}
    for priority in ("decode_first", "prefill_first"):
        sched = Scheduler(SchedulerConfig(max_seqs=2, max_batch_tokens=16, priority=priority),
                          BlockManager(32, 4), max_model_len=64)
        a = make_sequence(0, 4, 12)
        sched.add_sequence(a)
        run_step(sched)  # A's prompt: first token
        b = make_sequence(1, 32, 4)
        sched.add_sequence(b)
        steps_a = []
        for step in range(1, 12):
            out = run_step(sched)
            if any(s is a and d for s, d in zip(out.seqs, out.do_sample)):
                steps_a.append(step)
            if b.num_output_tokens and priority not in first_token_step:
                first_token_step[priority] = step
        a_token_steps[priority] = steps_a
    # budget 16: prefill_first runs B's prompt as 16 + 16 (first token at step 2); decode_first
    # gives A one token per step and B the other 15, 15, then 2 (first token at step 3).
    assert first_token_step == {"prefill_first": 2, "decode_first": 3}
    assert a_token_steps["decode_first"][:3] == [1, 2, 3]  # A keeps decoding every step
    assert a_token_steps["prefill_first"][0] == 3  # A waits while B's prompt runs


# -- static batching -----------------------------------------------------------------------------------
def admitted_and_finished(policy: str, make_sequence) -> tuple[dict, dict]:
    sched = Scheduler(SchedulerConfig(policy=policy, max_seqs=2, max_batch_tokens=32), BlockManager(32, 4),
                      max_model_len=64)
    for rid, max_new in enumerate([2, 8, 2]):  # A short, B long, C waits for a slot
        sched.add_sequence(make_sequence(rid, 5, max_new))
    admitted, finished, step = {}, {}, 0
    while sched.has_unfinished():
        out = run_step(sched, now=float(step))
        for s in out.admitted:
            admitted.setdefault(s.request_id, step)
        for s in out.seqs:
            if s.status is SequenceStatus.FINISHED:
                finished.setdefault(s.request_id, step)
        step += 1
    return admitted, finished


def test_static_batching_waits_for_its_longest_member(make_sequence):
    admitted, finished = admitted_and_finished("static", make_sequence)
    assert admitted[2] > finished[1]  # C only after B, the longest of the first batch, is done
    admitted, finished = admitted_and_finished("continuous", make_sequence)
    assert finished[0] < admitted[2] < finished[1]  # C takes A's slot while B still runs


def test_static_batch_waits_up_to_batch_wait_s_to_fill(make_sequence):
    cfg = SchedulerConfig(policy="static", max_seqs=3, max_batch_tokens=32, batch_wait_s=1.0)
    sched = Scheduler(cfg, BlockManager(32, 4), max_model_len=64)
    sched.add_sequence(make_sequence(0, 5, 2, arrival_s=0.0))
    out = sched.schedule(0.0)
    assert out.is_empty and out.wake_at_s == 1.0
    sched.add_sequence(make_sequence(1, 5, 2, arrival_s=0.5))
    assert sched.schedule(0.5).is_empty
    out = sched.schedule(1.0)  # the timeout: go with what came
    assert [s.request_id for s in out.admitted] == [0, 1]
    full = Scheduler(cfg, BlockManager(32, 4), max_model_len=64)
    for rid in range(3):
        full.add_sequence(make_sequence(rid, 5, 2))
    assert len(full.schedule(0.0).admitted) == 3  # a full batch does not wait


# -- preemption ------------------------------------------------------------------------------------------
def test_preemption_frees_the_most_recently_admitted_and_requeues_it_first(make_sequence):
    # 4 blocks of 4 tokens; two 8-token prompts take 2 blocks each, and each next token needs a third.
    sched = Scheduler(SchedulerConfig(max_seqs=2, max_batch_tokens=16), BlockManager(4, 4, False), max_model_len=16)
    a, b = make_sequence(0, 8, 6), make_sequence(1, 8, 6)
    sched.add_sequence(a)
    sched.add_sequence(b)
    run_step(sched)  # both prompts, one sampled token each
    run_step(sched)  # A decodes into a new block: B, the most recent, is preempted
    assert sched.num_preemptions == 1 and b.num_preemptions == 1
    assert list(sched.waiting) == [b] and b.block_table == [] and b.num_computed_tokens == 0
    assert b.num_output_tokens == 1  # its streamed token is kept, to be recomputed with the prompt
    check_blocks(sched)
    while sched.has_unfinished():
        run_step(sched)
    assert a.num_output_tokens == b.num_output_tokens == 6


# -- properties ------------------------------------------------------------------------------------------
# (prompt tokens, max_new_tokens, arrival step, kind: 0 = starts with the shared system prompt)
request_lists = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 24), st.integers(0, 8),
                                   st.integers(0, 2)), min_size=1, max_size=12)
configs = st.fixed_dictionaries({
    "policy": st.sampled_from(["continuous", "static"]),
    "priority": st.sampled_from(["decode_first", "prefill_first"]),
    "max_seqs": st.integers(1, 6),
    "chunked_prefill": st.booleans(),
    "max_waiting": st.one_of(st.none(), st.integers(1, 8)),
    "batch_wait_s": st.sampled_from([0.0, 3.0]),
})


@settings(max_examples=120, deadline=None)
@given(requests=request_lists, cfg=configs, block_size=st.sampled_from([1, 2, 4, 8]),
       extra_blocks=st.integers(0, 8), budget=st.integers(0, 40), caching=st.booleans(),
       stop=st.booleans(), aborts=st.lists(st.integers(0, 11), max_size=2))
def test_scheduling_invariants_hold_at_every_step(requests, cfg, block_size, extra_blocks, budget, caching, stop,
                                                  aborts, make_sequence):
    max_model_len = 48
    max_batch_tokens = max(block_size, cfg["max_seqs"], budget) if cfg["chunked_prefill"] else 48 + budget
    config = SchedulerConfig(max_batch_tokens=max_batch_tokens, max_model_len=max_model_len, **cfg)
    bm = BlockManager(-(-max_model_len // block_size) + extra_blocks, block_size, caching)
    sched = Scheduler(config, bm, max_model_len)
    system = [3] * 16  # a shared prefix for some prompts, to provoke prefix-cache hits
    seqs, pending = [], sorted(enumerate(requests), key=lambda r: r[1][2])
    step = 0
    while pending or sched.has_unfinished():
        while pending and pending[0][1][2] <= step:
            rid, (prompt_len, max_new, arrival, kind) = pending.pop(0)
            prompt = (system + list(range(prompt_len)))[:prompt_len] if kind == 0 else prompt_len
            s = make_sequence(rid, prompt, max_new, arrival_s=float(step), stop=[7] if stop else [])
            sched.add_sequence(s)
            seqs.append(s)
        if step in aborts and seqs:
            sched.abort(seqs[step % len(seqs)].request_id)
        out = sched.schedule(float(step))
        check_step(sched, out, cfg["chunked_prefill"])
        check_blocks(sched)
        sched.postprocess(out, [next_token(s) if d else None for s, d in zip(out.seqs, out.do_sample)])
        check_blocks(sched)
        # Every request sent is in exactly one place: ended, waiting or running.
        ended = [s for s in seqs if s.is_finished]
        assert len(seqs) == len(ended) + len(sched.waiting) + len(sched.running)
        assert {id(s) for s in seqs} == {id(s) for s in ended} | {id(s) for s in sched.waiting} | \
            {id(s) for s in sched.running}
        step += 1
        assert step < 5000, "the scheduler stopped making progress"
    assert bm.stats().used == 0 and all(b.ref_count == 0 for b in bm.blocks)
    for s in seqs:
        assert s.status in (SequenceStatus.FINISHED, SequenceStatus.FAILED)
        if s.status is SequenceStatus.FINISHED:
            assert s.num_output_tokens == s.max_new_tokens or s.token_ids[-1] == 7
        else:
            assert s.finish_reason in ("prompt_too_long", "queue_full", "cancelled")
            if s.num_prompt_tokens + s.max_new_tokens > max_model_len:
                assert s.finish_reason == "prompt_too_long"


class TickExecutor(Executor):
    """A test double for the executor: deterministic tokens, a step time growing with its tokens."""

    name = "tick"

    def execute(self, out: SchedulerOutput) -> StepResult:
        tokens = [next_token(s) if d else None for s, d in zip(out.seqs, out.do_sample)]
        return StepResult(tokens, 1e-3 * (1 + out.shape.num_tokens) + 1e-4 * out.shape.kv_tokens_read)


@settings(max_examples=40, deadline=None)
@given(requests=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 16), st.floats(0, 0.2)), min_size=1,
                         max_size=16),
       cfg=configs, cutoffs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_sent_equals_completed_failed_waiting_running_at_any_cutoff(requests, cfg, cutoffs):
    cfg = {**cfg, "chunked_prefill": True}
    engine = Engine(kvlab.tiny_llama(), EngineSpec(block_size=4, kv_budget_bytes=40 * 4 * 512, scheduler=SchedulerConfig(max_batch_tokens=32, max_model_len=64, **cfg)), executor=TickExecutor())
    workload = [Request(i, p, n, a, "test") for i, (p, n, a) in enumerate(requests)]
    records = engine.run(workload, clock="virtual")
    trace = engine.trace_frame()
    assert (trace.num_tokens <= 32).all() and (trace.num_seqs <= cfg["max_seqs"]).all()
    assert (trace.kv_blocks_used + trace.kv_blocks_free == engine.num_blocks).all()
    end = max(r.finished_s for r in records)
    for frac in cutoffs:
        s = summarize(records, until_s=end * frac)
        assert s.sent == s.completed + s.failed + s.waiting + s.running
        assert s.sent == sum(r.sent_s <= end * frac for r in records)
    for r in records:  # handed over at the first step boundary after its arrival
        assert r.scheduled_s <= r.sent_s
    assert engine.block_manager.stats().used == 0  # drained: only the prefix cache may keep (free) blocks
    statuses = Counter(r.status for r in records)
    assert statuses["completed"] + statuses["failed"] == len(records)
    for r in records:
        r.check()
        if r.status == "completed":
            assert len(r.token_s) == r.max_new_tokens and r.fail_reason is None
        else:
            assert r.fail_reason in ("prompt_too_long", "queue_full") and r.token_s == []
