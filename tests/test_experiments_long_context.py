"""Cached decode at long context: one row per timed step, the K/V each step read, and the summary's arithmetic."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from kvlab.cache.base import kv_cache_bytes
from kvlab.experiments.long_context import context_step_summary, default_contexts, run_context_steps

LESSONS = ("01",)  # the lessons these tests belong to: `pytest -m lNN`


@pytest.fixture(scope="module")
def frame(model):
    return run_context_steps(model, contexts=(8, 40), steps=3, repeats=2)


def test_one_row_per_decode_step_per_context_and_repeat(frame):
    assert len(frame) == 2 * 2 * 3
    assert sorted(frame["context"].unique()) == [8, 40]
    assert list(frame.loc[(frame["repeat"] == 0) & (frame["context"] == 8), "token"]) == [1, 2, 3]


def test_each_step_read_the_kv_of_every_position_it_attends_over(frame, model):
    # oracle: the memory formula at the step's context; decode step i after a prompt of n attends over n + i keys
    cfg = model.config
    assert list(frame["position"]) == [n + i for _ in range(2) for n in (8, 40) for i in (1, 2, 3)]
    expected = [kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, p) for p in frame["position"]]
    assert list(frame["kv_bytes_read"]) == expected
    assert frame.attrs["kv_bytes_per_token"] == cfg.kv_bytes_per_token() and frame.attrs["threads"] == 1


def test_summary_takes_the_fastest_repeat_then_the_median_step():
    rows = [dict(repeat=r, context=n, token=t, position=n + t, step_ms=ms + (5.0 if r == 1 else 0.0),
                 kv_bytes_read=100 * (n + t))
            for r in range(2) for n, base in ((10, 1.0), (1000, 1.5)) for t, ms in ((1, base), (2, base + 0.1),
                                                                                      (3, base + 9.0))]
    s = context_step_summary(pd.DataFrame(rows))
    assert list(s["context"]) == [10, 1000]
    assert list(s["step_ms"]) == pytest.approx([1.1, 1.6])  # median of (1.0, 1.1, 10.0); repeat 1 was slowed
    assert list(s["vs_shortest"]) == pytest.approx([1.0, 1.6 / 1.1])
    assert list(s["extra_ms"]) == pytest.approx([0.0, 0.5])
    assert list(s["kv_mb_read"]) == pytest.approx([100 * 12 / 1e6, 100 * 1002 / 1e6])


def test_default_contexts_run_up_to_the_models_context(model):
    contexts = default_contexts(model, steps=8)
    assert contexts[0] == 32 and contexts[-1] == model.config.max_position_embeddings - 9
    assert list(contexts) == sorted(set(contexts)) and len(contexts) == 4


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(contexts=(8,)), "at least two"),
    (dict(contexts=(8, 8)), "repeated"),
    (dict(contexts=(8, 0)), "positive integer"),
    (dict(contexts=(8, 1020)), "exceeds the model's context of 1024"),
    (dict(contexts=(8, 16), steps=1), "steps must be"),
    (dict(contexts=(8, 16), repeats=0), "repeats must be"),
])
def test_bad_settings_raise_before_any_generation(model, kwargs, fragment, monkeypatch):
    import kvlab.experiments.long_context as lc

    def no_generation(*_a, **_k):
        raise AssertionError("generated before checking the settings")

    monkeypatch.setattr(lc, "generate", no_generation)
    with pytest.raises(ValueError, match=fragment):
        run_context_steps(model, **kwargs)


def test_torch_threads_is_restored_after_the_run(model):
    before = torch.get_num_threads()
    run_context_steps(model, contexts=(4, 8), steps=2, repeats=1, threads=1)
    assert torch.get_num_threads() == before
