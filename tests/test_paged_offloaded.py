"""The engine's paged KV pool offloaded to a slower tier: the same tokens, the bytes counted by hand, the link's time.

Oracles: the on-device engine (``ModelExecutor``) on the same requests, token for token; the bytes a
step must move, counted here from the scheduled sequences themselves (their block tables and the
tokens they had stored before the step), not from the cache's metadata; bytes / rate for the link.
"""
from __future__ import annotations

import os

import pytest
import torch

from kvlab.cache.paged_offloaded import OffloadedPagedKVCache, block_runs
from kvlab.serving import Engine, SchedulerConfig
from kvlab.serving.offloaded_executor import OffloadedModelExecutor
from kvlab.workload import Request
from kvlab.serving.config import EngineSpec

BLOCK = 8
SHARED = list(range(1, 41))  # a 40-token prefix several prompts share (prefix caching shares its blocks)


def requests() -> list[Request]:
    """Mixed lengths, some with a shared prefix, all arriving at t = 0."""
    out = []
    for i in range(7):
        prompt = (SHARED if i % 2 else []) + [(13 * i + j) % 300 + 1 for j in range(10 + 9 * i)]
        out.append(Request(i, len(prompt), 6 + 3 * (i % 3), 0.0, "test", prompt=prompt))
    return out


class Recording(OffloadedModelExecutor):
    """Notes, before each step runs, what every scheduled sequence has stored and which blocks it owns."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.expected: list[tuple[int, int]] = []  # per step: (bytes to read, bytes to write) by hand

    def execute(self, out):
        cfg = self.model.config
        slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # one token's K and V, every layer, fp32
        blocks = set()
        for seq, n in zip(out.seqs, out.num_new_tokens):
            stored = seq.num_computed_tokens
            blocks.update(seq.block_table[:-(-stored // BLOCK)] if stored else [])
        self.expected.append((len(blocks) * BLOCK * slot, sum(out.num_new_tokens) * slot))
        return super().execute(out)


def serve(model, executor, budget_blocks: int | None = None, max_batch_tokens: int = 64):
    budget = None if budget_blocks is None else budget_blocks * EngineSpec(block_size=BLOCK).block_bytes(model.config, torch.float32)
    engine = Engine(model, EngineSpec(block_size=BLOCK, kv_budget_bytes=budget, scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=max_batch_tokens, max_model_len=128)), executor=executor)
    engine.run(requests(), clock="virtual")
    return engine, {rid: list(s.output_token_ids) for rid, s in engine.sequences.items()}


@pytest.mark.parametrize("budget_blocks, link", [(None, None), (24, None), (None, 0.05)],
                         ids=["roomy pool", "tight pool: preemption", "slow link"])
def test_the_offloaded_pool_gives_the_on_device_tokens_and_moves_the_bytes_counted_by_hand(model, budget_blocks,
                                                                                            link):
    on_device, expected_tokens = serve(model, None, budget_blocks)
    executor = Recording(model, link_gbps=link)
    engine, tokens = serve(model, executor, budget_blocks)
    assert tokens == expected_tokens
    assert engine.trace_frame()["request_ids"].tolist() == on_device.trace_frame()["request_ids"].tolist()
    log = executor.step_frame()
    assert list(zip(log["bytes_read"], log["bytes_written"])) == executor.expected
    assert (log["bytes_moved"] == log["bytes_read"] + log["bytes_written"]).all()
    assert executor.cache.bytes_moved_total == int(log["bytes_moved"].sum())
    if budget_blocks:
        assert engine.stats()["preemptions"] > 0  # the case means something: sequences were recomputed
    else:
        assert engine.stats()["prefix_hit_tokens"] > 0  # shared blocks were found (and are read once per step)
    executor.close()


def test_prompts_split_over_several_steps_read_back_their_own_first_chunks(model):
    """A budget of 16 tokens per step cuts prompts into chunks: each later chunk attends over blocks it must fetch."""
    executor = Recording(model)
    _, tokens = serve(model, executor, max_batch_tokens=16)
    _, expected = serve(model, None, max_batch_tokens=16)
    assert tokens == expected
    assert list(zip(*[executor.step_frame()[c] for c in ("bytes_read", "bytes_written")])) == executor.expected
    executor.close()


def test_every_throttled_step_takes_at_least_its_bytes_over_the_rate(model):
    rate = 0.02  # GB/s: the tiny model's few KiB per step take milliseconds
    executor = OffloadedModelExecutor(model, link_gbps=rate)
    serve(model, executor)
    log = executor.step_frame()
    link_s = log["bytes_moved"] / (rate * 1e9)
    assert link_s.max() > 1e-3
    assert (log["copy_s"] >= link_s - 1e-6).all()
    assert executor.cache.link_wait_s_total > 0
    executor.close()


def test_the_device_holds_one_layer_and_the_tier_holds_the_pool():
    cache = OffloadedPagedKVCache(4, 2, 8, num_blocks=10, block_size=4)
    per_layer = 2 * 10 * 4 * 2 * 8 * 4  # K and V, blocks x tokens x heads x head_dim x fp32
    m = cache.memory()
    assert m.device_bytes == per_layer and m.offloaded_bytes == 4 * per_layer
    assert m.allocated_bytes == 5 * per_layer and m.used_bytes == 0
    assert cache.key_cache is None  # no on-device pool per layer
    path = cache.storage_path
    assert path is not None and os.path.exists(path)
    cache.close()
    assert not os.path.exists(path)
    with pytest.raises(RuntimeError, match="closed"):
        cache.update(0, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))


def test_block_runs_are_consecutive_distinct_ids():
    assert block_runs([7, 3, 4, 5, 9, 4]) == [(3, 6), (7, 8), (9, 10)]
    assert block_runs([]) == []


@pytest.mark.parametrize("kwargs, match", [(dict(link_gbps=0), "link_gbps"), (dict(link_gbps=True), "link_gbps"),
                                           (dict(storage_dir="/no/such/folder"), "storage_dir"),
                                           (dict(num_blocks=0), "num_blocks")])
def test_bad_options_are_refused_before_anything_is_allocated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OffloadedPagedKVCache(2, 2, 8, **{"num_blocks": 4, "block_size": 4, **kwargs})


def test_the_copy_clock_starts_only_after_the_device_is_synchronised(monkeypatch):
    """On CUDA the layer's first blocking copy waits for its queued kernels: the start time must be taken after
    a synchronise (kvlab.device.now), or copy_s reads as the layer's compute and wait_for_link hides part of
    the link's time behind it. Faked here: the order of synchronise, clock read and copy is recorded."""
    import time
    from types import SimpleNamespace

    import kvlab.device
    from kvlab.cache.paged import PagedAttentionMetadata

    events: list[str] = []
    monkeypatch.setattr(kvlab.device, "synchronize", lambda device: events.append("sync"))
    monkeypatch.setattr(kvlab.device, "time", SimpleNamespace(
        perf_counter=lambda: events.append("clock") or time.perf_counter()))
    cache = OffloadedPagedKVCache(2, 2, 8, num_blocks=4, block_size=4, link_gbps=100.0)
    inner = cache._fetch
    monkeypatch.setattr(cache, "_fetch", lambda layer, runs: events.append("copy") or inner(layer, runs))
    k = v = torch.randn(1, 2, 1, 8)  # (1, nkv, N, hs): one sequence's next token after 5 stored
    cache.metadata = PagedAttentionMetadata.build(cache, [1], [6], [[1, 2]])
    cache.update(0, k, v)
    assert events.index("copy") >= 2 and events[events.index("copy") - 2:events.index("copy")] == ["sync", "clock"]
    assert cache.bytes_read_last_step == 2 * 2 * cache.block_bytes  # blocks 1 and 2, K and V: a real fetch
    cache.close()
