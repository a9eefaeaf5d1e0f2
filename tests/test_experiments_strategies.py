"""The strategies experiment: one tidy table whose memory, latency and quality columns are consistent."""
from __future__ import annotations

import pytest

from kvlab.cache import kv_cache_bytes
from kvlab.experiments.strategies import (four_bit_memory_ratio, ideal_memory_ratio,
                                                           quantized_memory_ratio, run_strategies)

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

SETTINGS = [{"cache": "dynamic"}, {"cache": "static"}, {"cache": "quantized", "bits": 4, "residual": 0},
            {"cache": "quantized", "bits": 2, "residual": 8, "group_size": 8}, {"cache": "offloaded"}]


@pytest.fixture(scope="module")
def table(model):
    return model, run_strategies(model, SETTINGS, pairs=(2, 4), new_tokens=6, repeats=1, examples=6,
                                 quality_prompts=3)


def test_one_row_per_setting_and_context(table):
    _, frame = table
    assert len(frame) == len(SETTINGS) * 2
    assert set(frame["pairs"]) == {2, 4} and set(frame["context_tokens"]) == {21, 37}
    assert frame.groupby("pairs")["setting"].apply(list).iloc[0][0] == "dynamic"


def test_memory_columns_add_up_and_match_the_formula(table):
    model, frame = table
    c = model.config
    assert (frame["allocated_bytes"] == frame["used_bytes"] + frame["reserved_bytes"]).all()
    dyn = frame[frame["setting"] == "dynamic"]
    formula = [kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, t) for t in dyn["stored_tokens"]]
    assert dyn["allocated_bytes"].tolist() == formula
    static = frame[frame["strategy"] == "static"].set_index("pairs")
    # sized for the longest context of the sweep: the shorter one reserves what it does not use
    assert static.loc[2, "reserved_bytes"] > 0 and static.loc[2, "allocated_bytes"] == static.loc[4, "allocated_bytes"]
    off = frame[frame["strategy"] == "offloaded"]
    assert (off["offloaded_bytes"] > 0).all() and (off["bytes_moved_per_step"] > 0).all()
    assert (frame.loc[frame["strategy"] != "offloaded", "bytes_moved_per_step"] == 0).all()


def test_quantized_memory_is_the_ideal_format(table):
    model, frame = table
    q4 = frame[frame["setting"] == "quantized(bits=4, residual=0)"]
    # 4-bit codes + an fp32 scale and zero-point per group of head_dim (16): 1/8 + 2/16 of fp32
    assert q4["ideal_memory_ratio"].tolist() == [pytest.approx(0.25)] * 2
    assert q4["memory_ratio"].tolist() == pytest.approx(q4["ideal_memory_ratio"].tolist())
    q2 = frame[frame["strategy"] == "quantized"].iloc[-1]
    tokens = q2["stored_tokens"]
    assert q2["ideal_memory_ratio"] == pytest.approx(((tokens - 8) * (2 / 32 + 2 / 8) + 8) / tokens)
    assert ideal_memory_ratio({"cache": "dynamic"}, 16, 10) == 1.0


def test_exact_strategies_match_the_exact_cache(table):
    _, frame = table
    exact = frame[frame["strategy"].isin(["dynamic", "static", "offloaded"])]
    assert (exact["kl_max"] == 0).all() and (exact["greedy_agreement"] == 1).all()
    assert (exact["accuracy"] == exact["exact_accuracy"]).all()
    assert (frame.loc[frame["strategy"] == "quantized", "kl_mean"] > 0).all()
    assert (frame["token_ms_p95"] >= frame["token_ms_p50"]).all()
    assert (frame["cache_ms_per_step"] > 0).all()


def test_bad_settings_are_refused_before_any_work(model):
    with pytest.raises(ValueError, match="bits"):
        run_strategies(model, [{"cache": "quantized", "bits": 3}], pairs=(2,), examples=0)
    with pytest.raises(ValueError, match="group_size"):
        run_strategies(model, [{"cache": "quantized", "bits": 4, "group_size": 5}], pairs=(2,), examples=0)
    with pytest.raises(ValueError, match="names no cache"):
        run_strategies(model, [{"bits": 4}], pairs=(2,))
    with pytest.raises(ValueError, match="exceed"):
        run_strategies(model, [{"cache": "dynamic"}], pairs=(200,), examples=0)


def test_the_predicted_memory_ratio_is_read_at_the_longest_context(table):
    _, frame = table
    assert quantized_memory_ratio(frame, bits=4) == pytest.approx(0.25)  # 4/32 + 2/16, as above
    q2 = frame[(frame["bits"] == 2) & (frame["pairs"] == 4)]  # residual 8: the longest context has the least fp32
    assert quantized_memory_ratio(frame, bits=2) == q2["memory_ratio"].item()
    with pytest.raises(ValueError, match="no 8-bit quantized cache in this run .*choose quantized with 8 bits"):
        quantized_memory_ratio(frame, bits=8)


def test_the_prediction_names_the_two_byte_counts_its_answer_is_computed_from(table):
    """``four_bit_memory_ratio`` (notebook 03's ``guess.against``) returns the ratio and the bytes it divides."""
    _, frame = table
    ratio, inputs = four_bit_memory_ratio(frame)
    assert ratio == quantized_memory_ratio(frame, bits=4)
    assert inputs["4-bit cache bytes"] / inputs["dynamic cache bytes"] == pytest.approx(ratio)


def test_time_inside_the_cache_is_measured_on_cuda_with_the_compute_stream_synchronised(monkeypatch):
    """On CUDA an update returns before its kernels ran: each update is timed between two waits for the compute
    stream, so 'ms in cache/step' exists there too. No GPU needed: the stream is a fake that records the waits."""
    import torch

    from kvlab.experiments.strategies import _timed_updates

    events = []

    class Stream:
        def synchronize(self):
            events.append("sync")

    class FakeCudaCache:
        device = torch.device("cuda")
        copy_s_total = 0.0

        def update(self, layer_idx, k, v):
            events.append("update")
            self.copy_s_total += 0.5
            return k, v

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    cache = FakeCudaCache()
    spent, copied = _timed_updates(cache)
    cache.update(0, "k", "v")
    assert events == ["sync", "update", "sync"]
    assert len(spent) == 1 and spent[0] >= 0 and copied == [0.5]


def test_on_cuda_the_panel_also_runs_offloaded_without_prefetch():
    """Prefetched copies overlap compute on a side stream, untimed; the synchronous twin times the tier's copies."""
    from kvlab.experiments.strategies import strategy_settings

    cpu = strategy_settings(("offloaded",), link_gbps=1.0)
    cuda = strategy_settings(("offloaded",), link_gbps=1.0, device="cuda")
    assert {"cache": "offloaded", "prefetch": False} not in cpu
    assert cuda == [{"cache": "dynamic"}, {"cache": "offloaded"}, {"cache": "offloaded", "prefetch": False},
                    {"cache": "offloaded", "link_gbps": 1.0}]
