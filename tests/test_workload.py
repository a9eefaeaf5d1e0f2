"""Workloads: seeded profiles, arrival processes and trace replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlab.traces import SAMPLE_TRACE, read_trace, replay_trace
from kvlab.workload import (
    MIXTURE_WEIGHTS,
    PROFILES,
    Request,
    Workload,
    arrival_times,
    constant,
    gamma,
    make_workload,
    poisson,
    profile_workload,
    trace_rate,
    workload_frame,
)


def lengths_and_arrivals(requests):
    return [(r.prompt_tokens, r.max_new_tokens, r.arrival_s, r.profile) for r in requests]


# -- seeds -------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_workload():
    a = make_workload("mixture", 50, rate=3.0, seed=7, vocab_size=100)
    b = make_workload("mixture", 50, rate=3.0, seed=7, vocab_size=100)
    assert a == b
    assert lengths_and_arrivals(a) != lengths_and_arrivals(make_workload("mixture", 50, rate=3.0, seed=8))


def test_token_ids_do_not_change_lengths_or_arrivals():
    with_ids = make_workload("mixture", 30, rate=2.0, seed=1, vocab_size=50)
    without = make_workload("mixture", 30, rate=2.0, seed=1)
    assert lengths_and_arrivals(with_ids) == lengths_and_arrivals(without)
    assert all(r.prompt is None for r in without)
    ids = np.concatenate([r.prompt for r in with_ids])
    assert ids.min() >= 0 and ids.max() < 50
    assert all(len(r.prompt) == r.prompt_tokens for r in with_ids)


# -- arrival processes -------------------------------------------------------------
@pytest.mark.parametrize("process", [
    lambda: poisson(2000, rate=4.0, rng=0),
    lambda: gamma(2000, rate=4.0, burstiness=0.5, rng=0),
    lambda: gamma(2000, rate=4.0, burstiness=4.0, rng=0),
])
def test_the_rate_is_respected_on_average(process):
    t = process()
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    assert np.diff(t).mean() == pytest.approx(1 / 4.0, rel=0.08)


def test_constant_rate_is_exact_and_all_at_once_is_zero():
    assert constant(5, rate=2.0).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert arrival_times("all_at_once", 4).tolist() == [0.0] * 4
    assert poisson(3, rate=math.inf).tolist() == [0.0] * 3  # vLLM's rate = inf


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_the_variation_of_gaps(b):
    gaps = np.diff(gamma(2000, rate=1.0, burstiness=b, rng=3))
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(b), rel=0.12)


def test_poisson_gaps_vary_as_much_as_they_average():
    gaps = np.diff(poisson(2000, rate=1.0, rng=5))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)


# -- profiles ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_lengths_stay_in_the_profile_ranges(name):
    p = PROFILES[name]
    reqs = make_workload(name, 300, arrival="all_at_once", seed=2)
    prompts = [r.prompt_tokens for r in reqs]
    outputs = [r.max_new_tokens for r in reqs]
    assert min(prompts) >= p.prompt_tokens[0] and max(prompts) <= p.prompt_tokens[1]
    assert min(outputs) >= p.max_new_tokens[0] and max(outputs) <= p.max_new_tokens[1]
    assert {r.profile for r in reqs} == {name}


def test_mixture_follows_its_documented_weights():
    reqs = make_workload("mixture", 2000, arrival="all_at_once", seed=0)
    share = workload_frame(reqs)["profile"].value_counts(normalize=True)
    for name, w in MIXTURE_WEIGHTS.items():
        assert share[name] == pytest.approx(w, abs=0.04)


def test_scale_stretches_lengths():
    reqs = make_workload("long_short", 200, arrival="all_at_once", scale=0.5)
    lo, hi = PROFILES["long_short"].prompt_tokens
    assert min(r.prompt_tokens for r in reqs) >= lo / 2 and max(r.prompt_tokens for r in reqs) <= hi / 2


def test_max_context_cuts_prompts_and_keeps_outputs():
    free = make_workload("long_short", 100, arrival="all_at_once", seed=4)
    cut = make_workload("long_short", 100, arrival="all_at_once", seed=4, max_context=300)
    assert all(r.prompt_tokens + r.max_new_tokens <= 300 for r in cut)
    assert [r.max_new_tokens for r in cut] == [r.max_new_tokens for r in free]
    assert any(r.prompt_tokens + r.max_new_tokens > 300 for r in free)  # the cut did something
    tiny = make_workload("long_gen", 20, arrival="all_at_once", max_context=100)
    assert all(r.max_new_tokens == 99 and r.prompt_tokens == 1 for r in tiny)


def test_shared_system_prompt_prefixes_every_prompt():
    reqs = make_workload("short_short", 10, rate=1.0, vocab_size=1000, shared_prefix_tokens=32)
    assert len({tuple(r.prompt[:32]) for r in reqs}) == 1
    assert all(r.prefix_id == "system" and r.prompt_tokens >= 32 + 16 for r in reqs)


# -- trace replay -----------------------------------------------------------------------
def test_the_shipped_sample_trace_replays_like_the_conversation_trace():
    assert SAMPLE_TRACE.stat().st_size < 20_000
    trace = read_trace(SAMPLE_TRACE)
    assert len(trace) == 200
    assert 700 <= trace["prompt_tokens"].median() <= 1400  # conversation: median ~1,020
    assert 90 <= trace["output_tokens"].median() <= 180  # conversation: median ~129
    reqs = replay_trace(SAMPLE_TRACE, length_scale=8.0, max_context=1024)
    assert reqs[0].arrival_s == 0 and all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    assert 3 <= len(reqs) / reqs[-1].arrival_s <= 8  # about 5.5 requests/s
    assert all(r.prompt_tokens + r.max_new_tokens <= 1024 for r in reqs)


def test_replay_scales_time_and_lengths(tmp_path):
    csv = tmp_path / "tiny.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:48.2500000,100,9\n"  # out of order on purpose
        "2023-11-16 18:15:46.0000000,40,10\n"
        "2023-11-16 18:15:46.5000000,7,0\n"
    )
    reqs = replay_trace(csv, time_scale=2.0, length_scale=2.0, vocab_size=10)
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.0, 4.5])  # gaps 0.5, 1.75 doubled
    assert [r.prompt_tokens for r in reqs] == [20, 4, 50]  # 40/2, round(3.5), 100/2
    assert [r.max_new_tokens for r in reqs] == [5, 1, 4]  # an empty output becomes 1 token
    assert all(len(r.prompt) == r.prompt_tokens and r.profile == "trace" for r in reqs)
    assert len(replay_trace(csv, max_requests=2)) == 2


def test_replay_accepts_timestamps_in_seconds(tmp_path):
    csv = tmp_path / "seconds.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n100.0,8,2\n100.25,8,2\n")
    assert [r.arrival_s for r in replay_trace(csv)] == [0.0, 0.25]


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(profile="chat", n=5, rate=1.0), "unknown profile 'chat'; choose one of short_short, long_short, long_gen, mixture"),
    (dict(profile="mixture", n=0, rate=1.0), "n=0"),
    (dict(profile="mixture", n=5, rate=0.0), "rate=0.0"),
    (dict(profile="mixture", n=5, rate=-2), "rate=-2"),
    (dict(profile="mixture", n=5, rate=float("nan")), "rate=nan"),
    (dict(profile="mixture", n=5), "rate is required"),
    (dict(profile="mixture", n=5, rate=1.0, arrival="bursty"), "unknown arrival 'bursty'; choose one of all_at_once, constant, poisson, gamma"),
    (dict(profile="mixture", n=5, rate=1.0, arrival="gamma", burstiness=0), "burstiness=0"),
    (dict(profile="mixture", n=5, rate=1.0, arrival="gamma", burstiness=-1.0), "burstiness=-1.0"),
    (dict(profile="mixture", n=5, rate=1.0, scale=0), "scale=0"),
    (dict(profile="mixture", n=5, rate=1.0, max_context=64, shared_prefix_tokens=64), "shared_prefix_tokens"),
])
def test_bad_workload_arguments_get_a_clear_error(kwargs, message):
    with pytest.raises(ValueError) as e:
        make_workload(**kwargs)
    assert message in str(e.value)


def test_bad_traces_get_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        replay_trace(tmp_path / "missing.csv")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("timestamp,ContextTokens,Output\n1,2,3\n")
    with pytest.raises(ValueError) as e:
        replay_trace(wrong)
    assert "['TIMESTAMP', 'GeneratedTokens']" in str(e.value)  # which are missing
    assert "found ['timestamp', 'ContextTokens', 'Output']" in str(e.value)  # which were found
    header_only = tmp_path / "empty.csv"
    header_only.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(ValueError, match="no requests"):
        replay_trace(header_only)
    blank = tmp_path / "blank.csv"
    blank.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        replay_trace(blank)
    bad_time = tmp_path / "bad_time.csv"
    bad_time.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(ValueError, match="TIMESTAMP"):
        replay_trace(bad_time)
    with pytest.raises(ValueError, match="time_scale=0"):
        replay_trace(SAMPLE_TRACE, time_scale=0)
    with pytest.raises(ValueError, match="max_requests=0"):
        replay_trace(SAMPLE_TRACE, max_requests=0)


def test_a_request_knows_its_prompt_length():
    with pytest.raises(ValueError, match="prompt has 2 ids but prompt_tokens=3"):
        Request(0, 3, 4, 0.0, "short_short", prompt=[1, 2])


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "constant"])
def test_a_workload_built_once_and_timed_at_a_rate_is_the_one_make_workload_draws_at_that_rate(arrival):
    once = profile_workload("mixture", 30, seed=5, max_context=512, arrival=arrival, burstiness=0.5)
    for rate in (0.5, 8.0):  # the oracle: make_workload at that rate, request for request
        assert once.at_rate(rate) == make_workload("mixture", 30, arrival, rate, burstiness=0.5, seed=5, max_context=512)
    assert [r.arrival_s for r in once.requests] == [0.0] * 30  # built untimed; timing makes new requests


def test_a_replayed_workload_keeps_its_own_gaps_stretched_to_the_rate():
    trace = replay_trace(SAMPLE_TRACE, max_requests=20)
    fast = Workload(tuple(trace), "trace", arrival="replay").at_rate(10.0)
    assert trace_rate(fast) == pytest.approx(10.0)
    gaps, fast_gaps = np.diff([r.arrival_s for r in trace]), np.diff([r.arrival_s for r in fast])
    assert np.allclose(fast_gaps, gaps * trace_rate(trace) / 10.0)


def test_a_bad_workload_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="unknown arrival"):
        Workload((), "x", arrival="sometimes")
    with pytest.raises(ValueError, match="n=0"):
        Workload((), "x")
    with pytest.raises(ValueError, match="rate"):
        profile_workload("short_short", 3).at_rate(0.0)
