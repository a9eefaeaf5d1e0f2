"""The fixed-shape static cache behind lesson 03's compiled decode step: exact, and tried within a budget."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.experiments.static_compile import FixedShapeStaticCache, _decode_greedy, try_compiled_decode


@torch.inference_mode()
def test_fixed_shape_decode_gives_the_dynamic_caches_tokens(model):
    prompt = list(range(5, 29))
    c = model.config
    cache = FixedShapeStaticCache(c.num_layers, c.num_kv_heads, c.head_dim, max_len=len(prompt) + 10)
    shapes = set()

    def step(token, positions):
        shapes.add(tuple(cache.keys[0].shape))
        return model(token, cache, positions=positions, last_only=True)

    tokens, seconds = _decode_greedy(model, prompt, 10, cache, step)
    reference = kvlab.generate(model, prompt, cache="none", max_new_tokens=10).tokens
    assert tokens == reference and len(seconds) == 9
    assert shapes == {(1, c.num_kv_heads, len(prompt) + 10, c.head_dim)}  # one shape for every step
    assert cache.seq_len == len(prompt) + 9 and int(cache.position) == cache.seq_len
    with pytest.raises(ValueError, match="max_len"):
        cache.advance()  # the last slot is filled: one more token does not fit
        cache.advance()


def test_a_compile_that_runs_out_of_budget_comes_back_as_a_message():
    result = try_compiled_decode(budget_s=0.5)
    assert result["status"] == "timeout" and "budget" in result["message"] and "skipped" in result["message"]
    with pytest.raises(ValueError, match="budget_s"):
        try_compiled_decode(budget_s=0)
