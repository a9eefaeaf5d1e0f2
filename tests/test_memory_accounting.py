"""Cache memory is reported honestly: the formula 2 x layers x kv_heads x head_dim x tokens x batch x bytes.

Two independent oracles: the formula computed by hand here, and the bytes of the storages the
cache's tensors really sit in (``untyped_storage().nbytes()``).
"""
from __future__ import annotations

import pytest
import torch

import kvlab

CFG = kvlab.tiny_llama()  # 2 layers, 2 kv heads, head_dim 16


def formula(tokens: int, batch: int = 1, bytes_per_element: int = 4, cfg=CFG) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * tokens * batch * bytes_per_element


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind the tensors: what was really allocated."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def test_formula_by_hand():
    # Llama-3-8B: 32 layers, 8 kv heads, head_dim 128, fp16 -> 128 KiB per token.
    llama3 = kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
    assert kvlab.kv_cache_bytes(32, 8, 128, 1, 1, 2) == 131072 == llama3.kv_bytes_per_token(2)
    assert kvlab.kv_cache_bytes(2, 2, 16, 10, 3, 4) == 2 * 2 * 2 * 16 * 10 * 3 * 4 == formula(10, 3)


@pytest.mark.parametrize("prompt", [1, 9])  # 1: k/v of the prompt are views into the fused qkv output
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_dynamic_cache_holds_exactly_the_formula(model, batch, dtype, prompt):
    m = model.to(dtype)
    try:
        cache = kvlab.make_cache("dynamic", CFG, batch=batch, dtype=dtype)
        assert cache.memory().allocated_bytes == 0
        ids = torch.randint(0, 256, (batch, prompt))  # (B, T)
        m(ids, cache)
        for tokens in range(prompt, prompt + 5):
            mem = cache.memory()
            expected = formula(tokens, batch, dtype.itemsize)
            assert mem.allocated_bytes == mem.used_bytes == expected == mem.device_bytes
            assert mem.reserved_bytes == 0 == mem.offloaded_bytes
            assert storage_bytes(cache.keys + cache.values) == expected
            m(ids[:, :1], cache)
    finally:
        model.float()


@pytest.mark.parametrize("batch", [1, 2])
@torch.inference_mode()
def test_static_cache_reserves_max_len_and_reports_the_empty_part(model, batch):
    max_len = 40
    cache = kvlab.make_cache("static", CFG, batch=batch, max_len=max_len)
    assert storage_bytes(cache.keys + cache.values) == formula(max_len, batch)
    ids = torch.randint(0, 256, (batch, 11))
    for tokens in (0, 11, 12, 13):
        if tokens == 11:
            model(ids, cache)
        elif tokens > 11:
            model(ids[:, :1], cache)
        mem = cache.memory()
        assert mem.allocated_bytes == formula(max_len, batch) == mem.device_bytes
        assert mem.used_bytes == formula(tokens, batch)
        assert mem.reserved_bytes == formula(max_len - tokens, batch)
    cache.reset()
    mem = cache.memory()
    assert (mem.allocated_bytes, mem.used_bytes) == (formula(max_len, batch), 0)  # reset keeps the reservation


def test_no_cache_holds_nothing(model):
    result = kvlab.generate(model, "abc", cache="none", max_new_tokens=5)
    assert result.cache.memory() == kvlab.CacheMemory(0, 0, 0, 0, 0)
    assert result.timeline.cache_bytes == [0] * 5


@pytest.mark.parametrize("name", kvlab.CACHE_NAMES)
def test_allocated_is_used_plus_reserved_for_every_strategy(model, name):
    result = kvlab.generate(model, "memory", cache=name, max_new_tokens=4)
    mem = result.cache.memory()
    assert mem.allocated_bytes == mem.used_bytes + mem.reserved_bytes
    assert mem.allocated_bytes == mem.device_bytes + mem.offloaded_bytes
    assert min(mem.allocated_bytes, mem.used_bytes, mem.reserved_bytes) >= 0
    assert result.timeline.cache_bytes[-1] == mem.allocated_bytes


def test_dynamic_timeline_grows_by_kv_bytes_per_token_each_step(model):
    prompt = "grow by one token"
    result = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=12)
    per_token = CFG.kv_bytes_per_token()
    assert per_token == formula(1) == result.cache.bytes_per_token()
    steps = [b - a for a, b in zip(result.timeline.cache_bytes, result.timeline.cache_bytes[1:])]
    assert steps == [per_token] * 11
    # After the step that produced token i, the cache holds the prompt and tokens 0..i-1 (token i is not fed yet).
    assert result.timeline.cache_bytes[0] == formula(len(prompt))


def test_static_timeline_stays_at_its_reservation(model):
    result = kvlab.generate(model, "stay", cache="static", max_new_tokens=6, max_len=32)
    assert result.timeline.cache_bytes == [formula(32)] * 6
