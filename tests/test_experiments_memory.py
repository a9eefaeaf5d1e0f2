"""Cache memory: measured bytes equal the formula, and the calculator's arithmetic for real model shapes."""
from __future__ import annotations

import math

import pytest

import kvlab
import kvlab.cache
from kvlab.experiments.memory import GIB, kv_memory_table, max_sequences, measure_cache_memory

LESSONS = ("02",)  # the lessons these tests belong to: `pytest -m lNN`


def by_hand(cfg: kvlab.ModelConfig, tokens: int, batch: int = 1, elem: float = 4) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes, written out independently."""
    return int(2 * cfg.num_layers * cfg.num_kv_heads * (cfg.hidden_size // cfg.num_heads) * tokens * batch * elem)


@pytest.fixture(scope="module")
def measured(each_model):
    frame = measure_cache_memory(each_model, prompt_tokens=5, max_new_tokens=20, caches=("dynamic", "static"))
    return each_model.config, frame


def test_dynamic_cache_allocates_exactly_the_formula_at_every_step(measured):
    cfg, frame = measured
    dyn = frame[frame["cache"] == "dynamic"]
    assert list(dyn["tokens"]) == list(range(5, 25))  # prompt, then one more token per decode step
    for _, row in dyn.iterrows():
        assert row["allocated_bytes"] == row["used_bytes"] == by_hand(cfg, row["tokens"])
        assert row["formula_bytes"] == by_hand(cfg, row["tokens"])
        assert row["reserved_bytes"] == 0


def test_static_cache_holds_the_formula_and_reserves_the_rest_of_its_capacity(measured):
    cfg, frame = measured
    static = frame[frame["cache"] == "static"]
    capacity = by_hand(cfg, 5 + 20)  # preallocated for prompt + max_new_tokens
    for _, row in static.iterrows():
        assert row["used_bytes"] == by_hand(cfg, row["tokens"]) == row["formula_bytes"]
        assert row["allocated_bytes"] == capacity
        assert row["reserved_bytes"] == capacity - row["used_bytes"]


def test_every_strategy_that_stores_something_is_measured_by_default(model):
    frame = measure_cache_memory(model, prompt_tokens=4, max_new_tokens=4)
    assert list(dict.fromkeys(frame["cache"])) == [c for c in kvlab.CACHE_NAMES if c != "none"]
    measured = frame.dropna(subset=["tokens"])
    assert (measured["allocated_bytes"] == measured["used_bytes"] + measured["reserved_bytes"]).all()


def test_a_strategy_that_cannot_be_built_gets_a_row_saying_why(monkeypatch, model):
    monkeypatch.setitem(kvlab.cache.STRATEGIES, "quantized",
                        ("kvlab.cache.not_written_yet", "QuantizedCache", ("bits", "group_size", "residual")))
    frame = measure_cache_memory(model, prompt_tokens=4, max_new_tokens=3, caches=("dynamic", "quantized"))
    missing = frame[frame["cache"] == "quantized"]
    assert len(missing) == 1
    assert missing["tokens"].isna().all()
    assert "not measured" in missing["note"].iloc[0] and "not_written_yet" in missing["note"].iloc[0]
    assert len(frame[frame["cache"] == "dynamic"]) == 3


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(caches=("lru",)), "unknown cache 'lru'"),
    (dict(prompt_tokens=0), "prompt_tokens"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(prompt_tokens=1000, max_new_tokens=100), "exceeds the model's context"),
])
def test_bad_measurement_settings_are_refused(kwargs, fragment, model):
    with pytest.raises(ValueError, match=fragment):
        measure_cache_memory(model, **kwargs)


def test_calculator_matches_hand_computed_published_shapes():
    # Llama-3-8B: 32 layers x 8 KV heads x 128 head_dim x 2 (K, V) x 2 bytes = 128 KiB per token
    t = kv_memory_table("Llama-3-8B (GQA)", contexts=[8192], batches=[1, 8], bytes_per_element=2)
    assert list(t["kv_bytes"]) == [131072 * 8192, 131072 * 8192 * 8]
    assert t["kv_gib"].iloc[1] == 8.0
    # GPT-2 small: 12 layers x 12 heads x 64 head_dim x 2 x 2 bytes = 36 KiB per token
    g = kv_memory_table("GPT-2 small (124M)", contexts=[1024], batches=[1], bytes_per_element=2)
    assert g["kv_bytes"].iloc[0] == 36864 * 1024
    # the same Llama shape with every head keeping its own K/V (MHA) needs 4x more
    mha = kvlab.ModelConfig(**{**kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"].to_dict(), "num_kv_heads": 32})
    assert kv_memory_table(mha, [8192], [1])["kv_bytes"].iloc[0] == 4 * t["kv_bytes"].iloc[0]


def test_sequences_that_fit_after_the_weights():
    cfg = kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
    weights = cfg.num_parameters() * 2
    expected = math.floor((80 * GIB - weights) / (131072 * 8192))
    assert max_sequences(cfg, 8192, gpu_gib=80, bytes_per_element=2) == expected
    t = kv_memory_table(cfg, contexts=[2048, 8192], batches=[1, 16, 64, 256], gpu_gib=80)
    for _, row in t.iterrows():  # "fits" and "max_batch" must tell the same story
        assert row["fits"] == (row["batch"] <= row["max_batch"])
    # Llama-3-70B's fp16 weights alone overflow a 24 GiB card: nothing fits
    assert max_sequences("Llama-3-70B (GQA)", 1024, gpu_gib=24) == 0


def test_int4_cache_is_a_quarter_of_fp16_and_long_contexts_are_flagged():
    t = kv_memory_table("GPT-2 small (124M)", [512, 4096], [1], bytes_per_element=0.5)
    f = kv_memory_table("GPT-2 small (124M)", [512, 4096], [1], bytes_per_element=2)
    assert list(t["kv_bytes"] * 4) == list(f["kv_bytes"])
    assert list(t["over_model_context"]) == [False, True]  # GPT-2 was trained for 1024 tokens


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(config="Llama-9"), "unknown model 'Llama-9'"),
    (dict(contexts=[0]), "contexts"),
    (dict(batches=[]), "batches"),
    (dict(bytes_per_element=0), "bytes_per_element"),
    (dict(gpu_gib=-1), "gpu_gib"),
])
def test_calculator_refuses_bad_input(kwargs, fragment):
    args = dict(config="GPT-2 small (124M)", contexts=[1024], batches=[1]) | kwargs
    with pytest.raises(ValueError, match=fragment):
        kv_memory_table(**args)


def test_the_options_each_cache_was_built_with_are_recorded():
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")
    frame = measure_cache_memory(model, prompt_tokens=4, max_new_tokens=4, caches=("dynamic", "static", "quantized"))
    options = frame.attrs["options"]
    assert options["dynamic"] == {} and options["static"] == {"max_len": 8}
    assert options["quantized"]["residual"] == 64 and options["quantized"]["bits"] == 4
