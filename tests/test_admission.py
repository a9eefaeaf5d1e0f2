"""A pluggable admission rule in the scheduler, and the audited runs of notebook 05's exercise."""
from __future__ import annotations

import pandas as pd
import pytest

from kvlab.experiments.admission import (STARVED_AFTER, AdmissionAudit, admission_run, admission_workload,
                                         builtin_admission, clocks_table)
from kvlab.workload import policy_workload
from kvlab.experiments.serving_run import FixedStepCostExecutor, serve
from kvlab.model.config import tiny_llama
from kvlab.serving import AdmissionError, SchedulerConfig, WaitingRequest
from kvlab.workload import Request
from kvlab.serving.config import EngineSpec

LESSONS = ("05",)  # the lessons these tests belong to: `pytest -m lNN`


def exact_run(rule, requests, **config):
    sched = SchedulerConfig(policy="continuous", chunked_prefill=False, admission=rule, **config)
    return serve(tiny_llama(), requests, EngineSpec(scheduler=sched), clock="virtual", executor=FixedStepCostExecutor(0.01, 0.0001), threads=None)


def test_the_builtin_rule_as_a_function_schedules_exactly_like_the_engine():
    for requests, config in [
        (admission_workload(), dict(max_seqs=4, max_batch_tokens=64, max_model_len=64)),
        (policy_workload(320, "mixed", n=12, prompt_tokens=40, max_new_tokens=24),
         dict(max_seqs=4, max_batch_tokens=128, max_model_len=128)),
    ]:
        mine, builtin = exact_run(builtin_admission, requests, **config), exact_run(None, requests, **config)
        columns = ["step", "request_ids", "num_new_tokens", "start_s", "end_s", "kv_blocks_used"]
        pd.testing.assert_frame_equal(mine.trace[columns], builtin.trace[columns])


def test_the_default_is_the_builtin_rule():
    assert SchedulerConfig().admission is None


@pytest.mark.parametrize("bad", [dict(policy="static"), dict(chunked_prefill=True), dict(admission=42)])
def test_an_admission_rule_needs_whole_prompts_under_continuous_batching(bad):
    settings = dict(policy="continuous", chunked_prefill=False, admission=builtin_admission) | bad
    with pytest.raises(ValueError, match="admission"):
        SchedulerConfig(**settings)


def test_the_scheduler_refuses_a_pick_that_over_allocates():
    def everyone(waiting, free_blocks, token_budget, free_slots):
        return list(waiting)

    requests = [Request(i, 40, 4, 0.0, "t", prompt=[1 + i] * 40) for i in range(3)]
    with pytest.raises(AdmissionError, match="tokens of budget"):
        exact_run(everyone, requests, max_seqs=4, max_batch_tokens=64, max_model_len=64)


def test_the_scheduler_refuses_a_request_that_is_not_waiting():
    requests = [Request(0, 8, 2, 0.0, "t", prompt=[1] * 8)]
    with pytest.raises(AdmissionError, match="at most once"):
        exact_run(lambda w, b, t, s: ["nobody"], requests, max_seqs=2, max_batch_tokens=64, max_model_len=64)


def test_a_rule_may_return_request_ids():
    ids = lambda w, b, t, s: [r.request_id for r in builtin_admission(w, b, t, s)]  # noqa: E731
    config = dict(max_seqs=4, max_batch_tokens=64, max_model_len=64)
    assert exact_run(ids, admission_workload(), **config).trace.equals(
        exact_run(None, admission_workload(), **config).trace)


def test_the_rule_sees_tokens_and_blocks_of_each_waiting_request():
    seen = []

    def spy(waiting, free_blocks, token_budget, free_slots):
        seen.append((list(waiting), free_blocks, token_budget, free_slots))
        return builtin_admission(waiting, free_blocks, token_budget, free_slots)

    admission_run(spy)
    waiting, free_blocks, budget, slots = seen[0]
    assert [(w.request_id, w.tokens, w.blocks, w.preempted) for w in waiting] == [
        (0, 40, 3, False), (1, 40, 3, False), (2, 60, 4, False)]
    assert (free_blocks, budget, slots) == (8, 64, 4)
    assert all(isinstance(w, WaitingRequest) for w in waiting)


def test_the_workload_binds_every_limit_under_the_builtin_rule():
    seen = []

    def spy(waiting, free_blocks, token_budget, free_slots):
        picked = builtin_admission(waiting, free_blocks, token_budget, free_slots)
        rest = waiting[len(picked):]
        if rest:
            head, blocks, tokens = rest[0], free_blocks - sum(p.blocks for p in picked), \
                token_budget - sum(p.tokens for p in picked)
            seen.append("slots" if len(picked) == free_slots else "blocks" if head.blocks > blocks
                        else "tokens" if head.tokens > tokens else "?")
        return picked

    run, audit = admission_run(spy)
    assert run is not None and audit.violation is None
    assert {"slots", "blocks", "tokens"} <= set(seen)


def test_the_audit_counts_overtaking_and_names_the_starved_request():
    def skip(waiting, free_blocks, token_budget, free_slots):
        out = []
        for r in waiting:
            if len(out) < free_slots and r.blocks <= free_blocks and r.tokens <= token_budget:
                out.append(r)
                free_blocks, token_budget = free_blocks - r.blocks, token_budget - r.tokens
        return out

    run, audit = admission_run(skip)
    assert run is not None and audit.violation is None
    rid, n = audit.starved()
    assert rid == 2 and n > STARVED_AFTER  # the 60-token prompt
    _, fcfs = admission_run(builtin_admission)
    assert fcfs.starved() is None and not any(fcfs.passed_over.values())


def test_a_violation_stops_the_run_and_says_where():
    run, audit = admission_run(lambda w, b, t, s: list(w)[:s])
    assert run is None and audit.violation.kind == "blocks" and audit.violation.alone_fits  # each fits alone
    assert "10 KV blocks, with 8 free" in audit.violation.message


def test_an_audit_rejects_a_pick_that_is_not_a_list():
    run, audit = admission_run(lambda w, b, t, s: w[0])
    assert run is None and audit.violation.kind == "pick"


def test_the_clocks_table_has_the_four_clocks_with_n():
    run, _ = admission_run()
    table = clocks_table([run])
    assert list(table.columns) == ["run", "n", "TTFT p50 (ms)", "TTFT p95 (ms)", "TPOT p50 (ms)", "E2E p50 (ms)",
                                   "output tokens/s", "steps"]
    assert table.loc[0, "n"] == len(admission_workload())


def test_an_audit_can_wrap_a_rule_directly():
    audit = AdmissionAudit(builtin_admission)
    views = [WaitingRequest(0, 10, 1, 0.0, False), WaitingRequest(1, 60, 4, 0.0, False)]
    assert [w.request_id for w in audit(views, 8, 64, 4)] == [0]
    assert audit.passed_over == {1: 0} and audit.admitted == [0]
