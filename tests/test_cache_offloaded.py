"""The offloaded cache: the same tokens as dynamic, and bytes that really move through the slow tier.

Oracles: the dynamic cache on the same model and inputs (values are copied, never changed), the
bytes-moved formula written out here, and the tier's file read back independently of the cache.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import kvlab
from kvlab.cache import make_cache
from kvlab.cache.offloaded import OffloadedCache

on_cpu = pytest.mark.skipif(kvlab.pick_device().type != "cpu",
                            reason="the memory-mapped tier is the CPU-only path")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA not available: pinned tier and side-stream prefetch are checked "
                                       "by the GPU checks (tests/gpu/)")


def row_bytes(cfg, batch=1, elem=4):
    """Bytes of one token's K and V in one layer."""
    return 2 * batch * cfg.num_kv_heads * cfg.head_dim * elem


def test_offloaded_and_dynamic_generate_the_same_tokens(each_model):
    prompt = list(range(3, 43))
    exact = kvlab.generate(each_model, prompt, cache="dynamic", max_new_tokens=24)
    off = kvlab.generate(each_model, prompt, cache="offloaded", max_new_tokens=24)
    assert off.tokens == exact.tokens
    off.cache.close()


def test_offloaded_logits_equal_dynamic_logits(each_model, teacher_forced_logits):
    exact = make_cache("dynamic", each_model.config, device=each_model.device)
    ref = teacher_forced_logits(each_model, exact, prompt_len=40, steps=16)
    cache = make_cache("offloaded", each_model.config, device=each_model.device, max_len=56)  # 40 + 16 tokens
    got = teacher_forced_logits(each_model, cache, prompt_len=40, steps=16)
    assert torch.allclose(got, ref, atol=1e-6, rtol=0), (got - ref).abs().max()
    if each_model.device.type == "cpu":  # measured: bit for bit on CPU (same values, same kernels)
        assert torch.equal(got, ref)
    cache.close()


def test_bytes_moved_per_step_follow_the_formula(each_model):
    cfg, P, N = each_model.config, 30, 12
    result = kvlab.generate(each_model, list(range(1, P + 1)), cache="offloaded", max_new_tokens=N)
    L, row = cfg.num_layers, row_bytes(cfg)
    # step 0 (prefill): nothing stored to read, P tokens written per layer;
    # step i: the P + i - 1 stored tokens read back per layer, one new token written per layer
    expected = [L * P * row] + [L * (P + i - 1) * row + L * row for i in range(1, N)]
    assert result.timeline.bytes_moved == expected
    assert result.cache.bytes_moved_total == sum(expected)
    result.cache.close()


def test_every_step_copies_out_of_and_into_the_tier(each_model, teacher_forced_logits):
    """Wrap the one copy function: reads go tier -> working buffer, writes the other way, all counted."""
    cfg = each_model.config
    cache = make_cache("offloaded", cfg, device=each_model.device, max_len=30)
    calls = []
    real_copy = cache._copy

    def spy(dst, src):
        calls.append((dst, src))
        real_copy(dst, src)

    cache._copy = spy
    teacher_forced_logits(each_model, cache, prompt_len=20, steps=3)

    def inside(t, owner):
        lo = owner.untyped_storage().data_ptr()
        return lo <= t.data_ptr() < lo + owner.untyped_storage().nbytes()

    reads = [(d, s) for d, s in calls if inside(s, cache.tier)]
    writes = [(d, s) for d, s in calls if inside(d, cache.tier)]
    assert len(reads) + len(writes) == len(calls)
    assert all(not inside(d, cache.tier) for d, _ in reads)  # data really leaves the tier
    assert len(writes) == 4 * cfg.num_layers and len(reads) == 3 * cfg.num_layers  # no read at prefill
    moved = sum(s.numel() * s.element_size() for _, s in calls)
    assert moved == cache.bytes_moved_total == row_bytes(cfg) * cfg.num_layers * (20 + 3 + 20 + 21 + 22)
    cache.close()


def test_returned_keys_live_in_working_buffers_not_in_the_tier(each_model):
    cache = make_cache("offloaded", each_model.config, device=each_model.device, max_len=8)
    k = torch.randn(1, each_model.config.num_kv_heads, 5, each_model.config.head_dim, device=each_model.device)
    K, V = cache.update(0, k, k + 1)
    assert torch.equal(K, k) and torch.equal(V, k + 1)
    tier = cache.tier.untyped_storage()
    for t in (K, V):
        assert t.untyped_storage().data_ptr() != tier.data_ptr()
        assert not (tier.data_ptr() <= t.data_ptr() < tier.data_ptr() + tier.nbytes())
    cache.close()


@on_cpu
def test_the_mapped_file_holds_the_keys_and_values(each_model, teacher_forced_logits):
    cfg, P, N = each_model.config, 12, 4
    exact = make_cache("dynamic", cfg)
    cache = make_cache("offloaded", cfg, max_len=P + N)
    teacher_forced_logits(each_model, exact, prompt_len=P, steps=N)
    teacher_forced_logits(each_model, cache, prompt_len=P, steps=N)
    # read the file with numpy, independently of torch's mapping
    shape = (cfg.num_layers, P + N, 2, 1, cfg.num_kv_heads, cfg.head_dim)
    on_disk = torch.from_numpy(np.fromfile(cache.storage_path, dtype=np.float32).reshape(shape))
    for layer in range(cfg.num_layers):
        assert torch.equal(on_disk[layer, :, 0].permute(1, 2, 0, 3), exact.keys[layer])  # (B, nkv, S, hs)
        assert torch.equal(on_disk[layer, :, 1].permute(1, 2, 0, 3), exact.values[layer])
    cache.close()


@on_cpu
def test_each_step_reads_the_history_back_from_the_file(each_model):
    """Overwrite the file behind the cache's back: the next step sees it, so it really reads the tier."""
    cfg = each_model.config
    ids = torch.arange(1, 21)[None]
    ref = make_cache("dynamic", cfg)
    cache = make_cache("offloaded", cfg, max_len=24)
    with torch.inference_mode():
        each_model(ids, ref), each_model(ids, cache)
        assert torch.allclose(each_model(ids[:, :1], cache), each_model(ids[:, :1], ref), atol=1e-6)
        with open(cache.storage_path, "r+b") as f:  # zero layer 0's stored tokens on disk
            f.write(bytes(21 * row_bytes(cfg)))
        ref_next, got_next = each_model(ids[:, 1:2], ref), each_model(ids[:, 1:2], cache)
    assert not torch.allclose(got_next, ref_next, atol=1e-3)
    cache.close()


def test_memory_accounting_splits_tier_and_working_buffers(each_model, teacher_forced_logits):
    cfg = each_model.config
    cache = make_cache("offloaded", cfg, device=each_model.device, max_len=50)
    teacher_forced_logits(each_model, cache, prompt_len=20, steps=5)
    row, L = row_bytes(cfg), cfg.num_layers
    m = cache.memory()
    slots = 2 if cache.prefetch else 1
    assert m.offloaded_bytes == L * 50 * row
    assert m.device_bytes == slots * 50 * row == sum(s.numel() * s.element_size() for s in cache.slots)
    assert m.allocated_bytes == m.offloaded_bytes + m.device_bytes
    assert m.used_bytes == L * 25 * row
    assert m.reserved_bytes == m.allocated_bytes - m.used_bytes
    cache.close()


def test_reset_forgets_tokens_and_the_cache_can_be_reused(each_model):
    prompt = list(range(7, 27))
    cache = make_cache("offloaded", each_model.config, device=each_model.device, max_len=30)
    first = kvlab.generate(each_model, prompt, cache=cache, max_new_tokens=8).tokens
    cache.reset()
    assert cache.seq_len == 0 and cache.memory().used_bytes == 0
    assert kvlab.generate(each_model, prompt, cache=cache, max_new_tokens=8).tokens == first
    cache.close()


# --- capacity, options, cleanup -------------------------------------------------------------------


def test_exceeding_max_len_is_a_clear_error_before_any_work():
    cfg = kvlab.tiny_llama()
    cache = make_cache("offloaded", cfg, max_len=6)
    k = torch.zeros(1, cfg.num_kv_heads, 7, cfg.head_dim)
    with pytest.raises(ValueError, match="offloaded cache holds 6 tokens but 7 are needed; raise max_len"):
        cache.update(0, k, k)
    assert cache.seq_len == 0 and cache.bytes_moved_total == 0
    model = kvlab.build_model(cfg, seed=0, device="cpu")
    with pytest.raises(ValueError, match="holds 6 tokens but prompt"):
        kvlab.generate(model, [1, 2, 3, 4], cache=cache, max_new_tokens=3)
    cache.close()


@pytest.mark.parametrize("options,message", [
    (dict(), "offloaded cache needs max_len"),
    (dict(max_len=0), "max_len must be an integer >= 1, got 0"),
    (dict(max_len=8, prefetch="yes"), "prefetch must be True or False"),
    (dict(max_len=8, storage_dir="no/such/folder"), "storage_dir 'no/such/folder' is not an existing folder"),
])
def test_bad_options_get_a_clear_error_and_leave_no_file(tmp_path, options, message):
    options = {"storage_dir": str(tmp_path), **options}
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=message):
        OffloadedCache(2, 2, 16, **options)
    assert sorted(os.listdir(tmp_path)) == before


@on_cpu
def test_the_tier_file_goes_away_on_close_and_on_garbage_collection(tmp_path):
    cfg = kvlab.tiny_llama()
    mine = make_cache("offloaded", cfg, max_len=8, storage_dir=str(tmp_path))
    assert os.path.dirname(mine.storage_path) == str(tmp_path) and len(os.listdir(tmp_path)) == 1
    mine.close()
    assert os.listdir(tmp_path) == [] and tmp_path.exists()  # our file gone, the caller's folder kept
    with pytest.raises(RuntimeError, match="closed"):
        mine.update(0, torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16))

    temp = make_cache("offloaded", cfg, max_len=8)
    folder = os.path.dirname(temp.storage_path)
    assert os.path.isfile(temp.storage_path)
    del temp  # no close(): the finalizer removes the temporary folder
    assert not os.path.exists(folder)


# --- CUDA: pinned host tier, side-stream prefetch ---------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("prefetch", [True, False])
def test_cuda_tier_is_pinned_and_tokens_match_dynamic(prefetch):
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cuda")
    prompt = list(range(3, 43))
    exact = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=24)
    off = kvlab.generate(model, prompt, cache="offloaded", max_new_tokens=24, prefetch=prefetch)
    assert off.tokens == exact.tokens
    cache = off.cache
    assert cache.tier.is_pinned() and not cache.tier.is_cuda and cache.slots[0].is_cuda
    assert cache.prefetch is prefetch and len(cache.slots) == (2 if prefetch else 1)
    L, P, row = model.config.num_layers, len(prompt), row_bytes(model.config)
    assert off.timeline.bytes_moved[-1] == L * (P + 22) * row + L * row


@needs_cuda
def test_cuda_prefetch_logits_equal_dynamic(teacher_forced_logits):
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cuda")
    ref = teacher_forced_logits(model, make_cache("dynamic", model.config, device="cuda"), prompt_len=40, steps=16)
    cache = make_cache("offloaded", model.config, device="cuda", max_len=56)  # 40 + 16 tokens
    got = teacher_forced_logits(model, cache, prompt_len=40, steps=16)
    assert torch.allclose(got, ref, atol=1e-6, rtol=0), (got - ref).abs().max()
