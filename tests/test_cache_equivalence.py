"""A KV cache is an optimisation, not an approximation: cached and uncached runs give the same logits and tokens.

The oracle is the uncached computation: one forward pass over the whole sequence with ``cache="none"``.
Exact strategies (dynamic, static, offloaded) must match it to fp32 rounding (atol 1e-5) at every
position and generate identical greedy tokens.
"""
from __future__ import annotations

import pytest
import torch

import kvlab

ATOL = 1e-5
PROMPT, NEW = 13, 24


EXACT = [pytest.param(name, id=name) for name in ("dynamic", "static", "offloaded")]


@pytest.fixture(scope="module")
def model(each_model):
    """The tiny model of each architecture, with weights large enough that a mismatch shows."""
    cfg = each_model.config
    if cfg.arch == "llama":
        assert cfg.num_kv_heads < cfg.num_heads  # grouped-query attention really exercised
    # std 0.2 instead of 0.02: logits of order 1-10 and varied greedy tokens, so a mismatch shows.
    return each_model.init_weights(seed=0, std=0.2)


def make(name: str, model, batch: int = 1, max_len: int = 64) -> kvlab.KVCache:
    options = {"max_len": max_len} if name in ("static", "offloaded") else {}
    return kvlab.make_cache(name, model.config, batch=batch, **options)


def prompt_ids(batch: int = 1, length: int = PROMPT, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))  # (B, T)


@pytest.mark.parametrize("name", EXACT)
def test_cached_and_uncached_generate_the_same_tokens(model, name):
    ids = prompt_ids()[0].tolist()
    uncached = kvlab.generate(model, ids, cache="none", max_new_tokens=NEW)
    cached = kvlab.generate(model, ids, cache=name, max_new_tokens=NEW)
    assert cached.tokens == uncached.tokens
    assert len(set(uncached.tokens)) > 1, "a constant continuation would make this check weak"


@pytest.mark.parametrize("name", EXACT)
@torch.inference_mode()
def test_cached_decode_logits_equal_one_uncached_pass(model, name):
    """Prefill, then one token at a time: every step's logits equal the full pass at that position."""
    full = torch.cat([prompt_ids(), prompt_ids(length=NEW, seed=1)], dim=1)  # (1, P + N): fixed tokens
    expected = model(full, kvlab.make_cache("none", model.config))  # (1, P + N, V)
    cache = make(name, model)
    got = [model(full[:, :PROMPT], cache)]  # (1, P, V)
    for t in range(PROMPT, full.size(1)):
        got.append(model(full[:, t:t + 1], cache))  # (1, 1, V)
    torch.testing.assert_close(torch.cat(got, dim=1), expected, atol=ATOL, rtol=0)
    assert cache.seq_len == full.size(1)


@pytest.mark.parametrize("name", EXACT)
@torch.inference_mode()
def test_prompt_fed_in_chunks_gives_the_same_logits(model, name):
    """Several new tokens over a non-empty cache use the causal mask's offset (S > T)."""
    ids = prompt_ids(length=20)
    expected = model(ids, kvlab.make_cache("none", model.config))  # (1, 20, V)
    cache = make(name, model)
    got = torch.cat([model(ids[:, :7], cache), model(ids[:, 7:12], cache), model(ids[:, 12:], cache)], dim=1)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", EXACT)
@torch.inference_mode()
def test_cached_batch_of_sequences_matches_uncached(model, name):
    ids = prompt_ids(batch=3, length=16)  # (3, 16)
    expected = model(ids, kvlab.make_cache("none", model.config, batch=3))
    cache = make(name, model, batch=3)
    got = torch.cat([model(ids[:, :10], cache)] + [model(ids[:, t:t + 1], cache) for t in range(10, 16)], dim=1)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", EXACT)
def test_a_reset_cache_generates_the_same_tokens_again(model, name):
    cache = make(name, model)
    first = kvlab.generate(model, prompt_ids()[0].tolist(), cache=cache, max_new_tokens=8)
    cache.reset()
    assert cache.seq_len == 0
    second = kvlab.generate(model, prompt_ids()[0].tolist(), cache=cache, max_new_tokens=8)
    assert second.tokens == first.tokens
