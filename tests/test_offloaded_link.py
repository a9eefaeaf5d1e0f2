"""The offloaded cache behind a slow link: the same bytes and tokens, and the link's time really in every step.

Oracles: the bytes a decode step must move, counted here from the token counts (not read from the
cache); the same cache without a link (same copies, memory speed); the time those bytes take at
the stated rate, bytes / rate, which each throttled step must take at least.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kvlab
from kvlab.cache import make_cache
from kvlab.cache.offloaded import OffloadedCache
from kvlab.experiments.strategies import run_strategies

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

RATE_GBPS = 0.05  # slow enough that a tiny model's few dozen KiB per step take milliseconds
PROMPT = list(range(1, 201))  # 200 tokens
NEW = 10


def row_bytes(cfg, elem=4):
    """Bytes of one token's K and V in one layer (batch 1)."""
    return 2 * cfg.num_kv_heads * cfg.head_dim * elem


def by_hand(cfg, prompt_len, new_tokens):
    """Bytes each decode step moves: every layer reads its stored tokens and writes the new one."""
    return [(prompt_len + j - 1 + 1) * row_bytes(cfg) * cfg.num_layers for j in range(1, new_tokens)]


@pytest.fixture(scope="module")
def runs(model):
    cfg = model.config
    out = {}
    for name, link in (("fast", None), ("slow", RATE_GBPS)):
        cache = make_cache("offloaded", cfg, device=model.device, max_len=len(PROMPT) + NEW, link_gbps=link)
        out[name] = (kvlab.generate(model, PROMPT, cache=cache, max_new_tokens=NEW), cache)
    yield out
    for _, cache in out.values():
        cache.close()


def test_a_slow_link_gives_the_same_tokens_and_moves_the_bytes_counted_by_hand(model, runs):
    exact = kvlab.generate(model, PROMPT, cache="dynamic", max_new_tokens=NEW).tokens
    expected = by_hand(model.config, len(PROMPT), NEW)
    for result, cache in runs.values():
        assert result.tokens == exact
        assert result.timeline.bytes_moved[1:] == expected
        prefill = len(PROMPT) * row_bytes(model.config) * model.config.num_layers  # the prompt written out once
        assert cache.bytes_moved_total == prefill + sum(expected)


def test_every_throttled_step_takes_at_least_its_bytes_over_the_rate(model, runs):
    result, cache = runs["slow"]
    link_s = np.array(by_hand(model.config, len(PROMPT), NEW)) / (RATE_GBPS * 1e9)
    assert link_s.min() > 1e-3  # the test means something: each step owes the link over a millisecond
    steps = np.array(result.timeline.step_s[1:])
    assert (steps >= link_s - 1e-6).all(), (steps, link_s)
    assert cache.copy_s_total >= cache.bytes_moved_total / (RATE_GBPS * 1e9) - 1e-6
    assert 0 < cache.link_wait_s_total <= cache.copy_s_total


def test_the_throttled_step_is_slower_than_the_unthrottled_one_by_the_links_time(model, runs):
    """A copy waits until its bytes would have crossed the link since it started (``wait_for_link``): a step gains the
    link's time less what its copies took anyway, which a competing CPU load lengthens (2026-12-08: 1.46 ms gained
    against 2.10 ms of link beside two busy loops)."""
    link_s = np.median(by_hand(model.config, len(PROMPT), NEW)) / (RATE_GBPS * 1e9)
    slow = np.median(runs["slow"][0].timeline.step_s[1:])
    fast_result, fast_cache = runs["fast"]
    fast = np.median(fast_result.timeline.step_s[1:])
    copy_s = fast_cache.copy_s_total / len(fast_result.timeline.step_s)  # what a step's copies take unthrottled
    assert slow - fast >= 0.8 * (link_s - copy_s) - 2e-4, (slow, fast, link_s, copy_s)
    fast_cache = runs["fast"][1]
    assert fast_cache.link_wait_s_total == 0  # no link: no waiting


def test_the_link_is_an_option_of_the_offloaded_cache_and_turns_prefetch_off():
    cfg = kvlab.tiny_llama()
    cache = make_cache("offloaded", cfg, max_len=8, link_gbps=2)
    assert cache.link_gbps == 2.0 and cache.prefetch is False
    cache.close()
    for bad in (0, -1.0, float("inf"), "fast", True):
        with pytest.raises(ValueError, match="link_gbps must be a positive number of GB/s"):
            OffloadedCache(2, 2, 16, max_len=8, link_gbps=bad)


def test_the_experiment_reports_the_links_time_and_bytes_per_second(model):
    settings = [{"cache": "dynamic"}, {"cache": "offloaded"}, {"cache": "offloaded", "link_gbps": RATE_GBPS}]
    frame = run_strategies(model, settings, pairs=(2, 8), new_tokens=5, repeats=1, examples=0)
    off = frame[frame["strategy"] == "offloaded"]
    slow = off[off["link_gbps"] == RATE_GBPS]
    assert np.allclose(slow["link_ms_per_step"], slow["bytes_moved_per_step"] / (RATE_GBPS * 1e9) * 1e3)
    assert (slow["copy_ms_per_step"] >= slow["link_ms_per_step"] - 1e-6).all()  # copies include the wait
    assert (slow["copy_gb_per_s"] <= RATE_GBPS * 1.0001).all()  # no copy outruns its link
    assert (slow["moved_gb_per_s"] <= slow["copy_gb_per_s"]).all()  # a step does more than copying
    plain = off[off["link_gbps"].isna()]
    assert plain["link_ms_per_step"].isna().all() and (plain["copy_gb_per_s"] > 0).all()
    assert frame.loc[frame["strategy"] == "dynamic", "copy_ms_per_step"].isna().all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_a_slow_link_on_cuda_syncs_each_chunk_and_keeps_the_tokens():
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cuda")
    exact = kvlab.generate(model, PROMPT, cache="dynamic", max_new_tokens=NEW)
    slow = kvlab.generate(model, PROMPT, cache="offloaded", max_new_tokens=NEW, link_gbps=RATE_GBPS)
    assert slow.tokens == exact.tokens and slow.cache.prefetch is False
    link_s = np.array(by_hand(model.config, len(PROMPT), NEW)) / (RATE_GBPS * 1e9)
    assert (np.array(slow.timeline.step_s[1:]) >= link_s - 1e-6).all()


def test_the_copy_clock_starts_only_after_the_device_is_synchronised(monkeypatch):
    """On CUDA a blocking copy first waits for the kernels queued before it: the clock of a synchronous copy
    must start after a synchronise (kvlab.device.now), or copy_s reads as compute and hides link time. Faked
    here: the order of synchronise, clock read and copy is recorded."""
    import time
    from types import SimpleNamespace

    import kvlab.device

    events: list[str] = []
    monkeypatch.setattr(kvlab.device, "synchronize", lambda device: events.append("sync"))
    monkeypatch.setattr(kvlab.device, "time", SimpleNamespace(
        perf_counter=lambda: events.append("clock") or time.perf_counter()))
    cache = OffloadedCache(2, 2, 8, max_len=16, link_gbps=100.0)
    inner = cache._paced_copy
    monkeypatch.setattr(cache, "_paced_copy", lambda dst, src: events.append("copy") or inner(dst, src))
    k = v = torch.randn(1, 2, 4, 8)  # (B, nkv, T, hs)
    cache.update(0, k, v)  # a prompt: no history to fetch, its 4 tokens written out
    cache.update(0, k[:, :, :1], v[:, :, :1])  # the next token: history fetched, the token written out
    copies = [i for i, e in enumerate(events) if e == "copy"]
    assert len(copies) == 3, events
    for i in copies:
        assert events[i - 2:i] == ["sync", "clock"], events
    cache.close()
