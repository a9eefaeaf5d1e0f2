"""kvlab's caches beside transformers' own (notebook 03): same weights, same tokens, bytes by each layout's formula.

The oracles: kvlab's own greedy tokens (the exact caches must match them token for token), a
hand count of each layout's bytes (the formula), and transformers' cache objects fed known tensors.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import transformers

from kvlab.lessons import CLAIMS, verdicts
from kvlab.experiments.transformers_caches import (RAN, formula_bytes, not_run, pair_table, run_transformers_caches,
                                                   transformers_cache)
from kvlab.generate import generate
from kvlab.experiments.transformers_steps import transformers_cache_bytes
from kvlab.experiments.recall import load_recall_model, make_examples

from claim_examples import counterexample_of

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

NEW = 12
QUANTO = transformers.utils.is_optimum_quanto_available()


@pytest.fixture(scope="module")
def model():
    return load_recall_model(device="cpu")


@pytest.fixture(scope="module")
def frame(model):
    return run_transformers_caches(model, pairs=4, questions=2, new_tokens=NEW, residual=8)


def _copy(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out.attrs = {k: (v.copy() if isinstance(v, pd.DataFrame) else v) for k, v in frame.attrs.items()}
    return out


def test_formula_bytes_by_hand(model):
    cfg = model.config  # 4 layers, 2 K/V heads of 32, fp32: 2 x 4 x 2 x 32 x 4 = 2048 bytes per token
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 32)
    kw = dict(prompt_tokens=133, max_len=157, bits=4, group_size=32, residual=16)
    assert formula_bytes("dynamic", "kvlab", cfg, 5, **kw) == 138 * 2048
    assert formula_bytes("static", "transformers", cfg, 5, **kw) == 157 * 2048
    assert formula_bytes("offloaded", "kvlab", cfg, 5, **kw) == 157 * 2048 + 157 * 2048 // 4  # tier + one layer
    # kvlab, step 5: 138 stored, the newest 16 in fp32; per quantized token and layer, K and V each:
    # 2 heads x 32 values x 4 bits = 32 bytes of codes + 2 groups x (scale + zero) x 4 bytes = 16 bytes
    assert formula_bytes("quantized", "kvlab", cfg, 5, **kw) == 4 * 2 * 122 * (32 + 16) + 16 * 2048
    # transformers, step 5: 5 tokens in the residual since the prefill quantized the prompt; quanto packs
    # 2 groups of 4-bit codes per byte along its first axis: ceil(133 x 2 / 2) rows of 32 bytes
    assert formula_bytes("quantized", "transformers", cfg, 5, **kw) == 4 * 2 * (133 * 32 + 133 * 16) + 5 * 2048
    # step 16 flushes the residual (16 tokens reached): everything quantized again
    assert formula_bytes("quantized", "transformers", cfg, 16, **kw) == 4 * 2 * 149 * 48
    # 2 bits, an odd number of groups: quanto's last byte row is only partly used
    two = formula_bytes("quantized", "transformers", cfg, 0, **{**kw, "bits": 2, "prompt_tokens": 3})
    assert two == 4 * 2 * (math.ceil(3 * 2 / 4) * 32 + 3 * 16)


def test_transformers_cache_bytes_counts_what_is_allocated(model):
    from kvlab.model.loading import to_transformers

    hf = to_transformers(model)
    k = torch.randn(1, 2, 10, 32)  # (B, nkv, T, hs)
    static = transformers.StaticCache(config=hf.config, max_cache_len=40)
    dynamic = transformers.DynamicCache(config=hf.config)
    for layer in range(4):
        static.update(k, k, layer)
        dynamic.update(k, k, layer)
    assert transformers_cache_bytes(static) == 4 * 2 * 40 * 2 * 32 * 4  # the whole reservation, counter excluded
    assert transformers_cache_bytes(dynamic) == 4 * 2 * 10 * 2 * 32 * 4
    if QUANTO:
        q = transformers.QuantizedCache("quanto", hf.config, nbits=4, q_group_size=32, residual_length=8)
        for layer in range(4):
            q.update(k, k, layer)  # the prefill: all 10 tokens quantized, no residual
        # 20 groups of 32 per tensor: 10 rows of packed 4-bit codes (320 B) + a scale and a shift per group (160 B)
        assert transformers_cache_bytes(q) == 4 * 2 * (10 * 32 + 20 * 2 * 4)


def test_exact_caches_give_kvlab_tokens_and_every_step_matches_its_formula(model, frame):
    ran = frame[frame["status"] == RAN]
    assert ran["bytes_match"].all()
    exact = frame[(frame["library"] == "transformers") & frame["strategy"].isin(["dynamic", "static"])]
    assert (exact["agreement"] == 1.0).all() and exact["first_divergence"].isna().all()
    steps = frame.attrs["steps"]
    prompts = make_examples(2, 4, seed=1000)
    for q, ex in enumerate(prompts):  # the oracle: kvlab's own generate, outside the experiment
        ours = generate(model, ex.prompt_ids, cache="dynamic", max_new_tokens=NEW).tokens
        theirs = steps[(steps["strategy"] == "dynamic") & (steps["library"] == "transformers")
                       & (steps["question"] == q)].sort_values("token")["token_id"].tolist()
        assert theirs == ours
    assert len(set(steps["token_id"])) > 3, "a constant continuation would make the token check weak"
    assert len(steps) == ran.shape[0] * 2 * NEW  # every run: one row per token


def test_a_cache_that_cannot_run_here_says_why_in_one_line(frame):
    off = frame[(frame["strategy"] == "offloaded") & (frame["library"] == "transformers")].iloc[0]
    if torch.cuda.is_available():
        assert off["status"] == RAN
    else:
        assert off["status"].startswith("did not run here") and "CUDA" in off["status"]
        assert not_run(frame) == [f"transformers' DynamicCache(offloading=True) {off['status']}"]
        assert pair_table(frame).set_index("strategy").loc["offloaded", "note"] == off["status"]
    kv = frame[(frame["strategy"] == "offloaded") & (frame["library"] == "kvlab")].iloc[0]
    assert kv["status"] == RAN and kv["bytes_match"]  # kvlab's side runs everywhere


def test_without_quanto_the_quantized_pair_says_what_to_install(model, monkeypatch):
    import transformers.cache_utils as cu

    monkeypatch.setattr(cu, "is_optimum_quanto_available", lambda: False)  # what a machine without it sees
    f = run_transformers_caches(model, strategies=("quantized",), pairs=2, questions=1, new_tokens=4)
    t = f[f["library"] == "transformers"].iloc[0]
    assert "optimum-quanto" in t["status"] and pd.isna(t["token_ms_p50"])
    assert f[f["library"] == "kvlab"].iloc[0]["status"] == RAN


@pytest.mark.skipif(not QUANTO, reason="optimum-quanto is not installed")
def test_quantized_caches_hold_different_bytes_for_the_same_tokens_stored(frame):
    q = frame[frame["strategy"] == "quantized"].set_index("library")
    assert (q["status"] == RAN).all() and q["bytes_match"].all()
    assert q.loc["kvlab", "cache_bytes"] != q.loc["transformers", "cache_bytes"]  # residual windows differ
    assert 0 <= q.loc["transformers", "agreement"] <= 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(bits=8), "quanto backend stores 2 or 4 bits"),
    (dict(strategies=("paged",)), "choose strategies among"),
    (dict(group_size=5), "group_size 5 does not divide head_dim 32"),
    (dict(pairs=0), "pairs"),
    (dict(new_tokens=1), "new_tokens >= 2"),
    (dict(pairs=64, new_tokens=64), "exceed the model's context"),
])
def test_bad_settings_raise_before_any_work(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_transformers_caches(model, **kwargs)


def test_transformers_cache_builds_each_counterpart(model):
    from kvlab.model.loading import to_transformers

    cfg = to_transformers(model).config
    assert type(transformers_cache("static", cfg, 20)).__name__ == "StaticCache"
    assert transformers_cache("offloaded", cfg, 20).offloading
    with pytest.raises(ValueError, match="unknown strategy"):
        transformers_cache("paged", cfg, 20)


# -- the claims of notebook 03 that read this comparison --------------------------------------------


def test_the_claims_hold_on_the_run_and_notice_counter_examples(frame):
    names = ("transformers_exact_caches_give_kvlab_tokens", "cache_bytes_follow_each_layout")
    assert all(v.holds for v in verdicts(frame, *names))
    wrong = _copy(frame)
    steps = wrong.attrs["steps"]
    one = steps.index[(steps["strategy"] == "static") & (steps["library"] == "transformers")][3]
    steps.loc[one, "token_id"] += 1  # transformers' static cache now gave another token
    assert not verdicts(wrong, names[0])[0].holds
    wrong = _copy(frame)
    wrong.loc[(wrong["strategy"] == "dynamic") & (wrong["library"] == "transformers"), "bytes_match"] = False
    assert not verdicts(wrong, names[1])[0].holds


@pytest.mark.skipif(not QUANTO, reason="optimum-quanto is not installed")
def test_the_quantized_claims_read_the_run_and_the_wall_claim_can_fail(frame):
    obs = verdicts(frame, "quantized_caches_keep_different_tokens", "same_strategy_different_speed")
    assert all(v.holds is not None and not v.claim.asserts for v in obs), [str(v) for v in obs]
    assert verdicts(frame, "quantized_caches_hold_their_own_layouts")[0].holds
    same = _copy(frame)
    q = same["strategy"] == "quantized"
    same.loc[q, "cache_bytes"] = same.loc[q & (same["library"] == "kvlab"), "cache_bytes"].iloc[0]
    assert not verdicts(same, "quantized_caches_hold_their_own_layouts")[0].holds  # one layout for both: false
    wall = CLAIMS["transformers_quantized_cache_costs_time"]
    assert wall.on(counterexample_of(wall)(_copy(frame))).holds is False  # quantized as fast as the DynamicCache


def test_the_panel_shows_one_row_per_strategy(model):
    from kvlab.lessons.l03_cache_strategies.panel import transformers_caches_panel

    panel = transformers_caches_panel(model, strategies=("dynamic", "static"), pairs=4, new_tokens=8, questions=1)
    result = panel.run()
    assert list(result.summary["strategy"]) == ["dynamic", "static"]
    assert result.figure is not None and len(result.figure.axes) == 2
