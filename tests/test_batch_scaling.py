"""Why batching works, measured: the decode-step table, the floors beside it, and prefill one by one vs batched."""
from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from kvlab.experiments.bandwidth import weight_bytes_per_step
from kvlab.lessons import CLAIMS
from kvlab.experiments.batch_scaling import batch_scaling, crossover_batch
from kvlab.lessons.l05_batching.figures import plot_batch_scaling

LESSONS = ("05",)  # the lessons these tests belong to: `pytest -m lNN`

CLAIM_NAMES = ("decode_step_stays_flat_for_small_batches", "per_sequence_decode_time_falls_with_batch",
               "batch_one_decode_reads_below_the_bandwidth", "batched_prompts_all_get_first_tokens_sooner",
               "first_prompt_waits_for_the_batch")


@pytest.fixture(scope="module")
def scaling(model):
    return batch_scaling(model, batch_sizes=(4, 1, 2), prompt_tokens=4, steps=2, repeats=2, prompts=3,
                         prefill_tokens=8, bandwidth_mb=8)


def test_one_row_per_batch_size_with_the_steps_timed(scaling):
    d = scaling.decode
    assert d["batch"].tolist() == [1, 2, 4]  # sorted
    assert (d["n"] == 4).all()  # steps x repeats
    assert ((d["step_p25_s"] <= d["step_s"]) & (d["step_s"] <= d["step_p75_s"])).all()
    assert (d["per_seq_s"] == d["step_s"] / d["batch"]).all()


def test_the_floors_are_the_bytes_and_the_arithmetic_over_the_machine_measured_in_the_run(scaling, model):
    d, m = scaling.decode, scaling.machine
    w = weight_bytes_per_step(model)
    assert (d["weight_bytes"] == w).all()
    per_token = model.config.kv_bytes_per_token(4)
    assert d["kv_bytes"].tolist() == [b * (4 + (2 * 2 + 1) / 2) * per_token for b in (1, 2, 4)]
    assert d["memory_floor_s"].tolist() == pytest.approx(((w + d["kv_bytes"]) / (m["bandwidth_GBps"] * 1e9)).tolist())
    assert d["compute_floor_s"].tolist() == pytest.approx([2 * (w / 4) * b / (m["matmul_GFLOPs"] * 1e9)
                                                           for b in (1, 2, 4)])
    assert d["achieved_GBps"].tolist() == pytest.approx(((w + d["kv_bytes"]) / d["step_s"] / 1e9).tolist())
    assert m["bandwidth_GBps"] > 0 and m["matmul_GFLOPs"] > 0 and m["threads"] == 1
    # where the compute floor (per sequence) times the batch meets the weights' memory floor
    assert crossover_batch(scaling) == pytest.approx((w / (m["bandwidth_GBps"] * 1e9))
                                                     / (2 * (w / 4) / (m["matmul_GFLOPs"] * 1e9)))


def test_batched_prompts_share_one_first_token_time_and_one_by_one_ones_add_up(scaling):
    p = scaling.prefill.set_index("way")
    one, batched = p.loc["one by one"], p.loc["batched"]
    assert batched["first_ttft_s"] == batched["mean_ttft_s"] == batched["all_first_s"]
    assert one["first_ttft_s"] <= one["mean_ttft_s"] <= one["all_first_s"]
    assert (scaling.prefill["prompts"] == 3).all() and (scaling.prefill["n"] == 2).all()


def test_every_claim_reads_the_result(scaling):
    for name in CLAIM_NAMES:
        v = CLAIMS[name].on(scaling)
        assert CLAIMS[name].clock == "wall" and v.holds is not None, v


def test_the_figure_has_four_panels(scaling):
    fig = plot_batch_scaling(scaling)
    assert isinstance(fig, Figure) and len(fig.axes) == 4


@pytest.mark.parametrize("kwargs, match", [(dict(batch_sizes=()), "batch_sizes"), (dict(batch_sizes=(0, 2)), "batch"),
                                           (dict(prompt_tokens=2000), "positions"), (dict(repeats=0), "repeats")])
def test_bad_settings_are_refused_before_anything_runs(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        batch_scaling(model, **kwargs)


def test_the_machine_also_times_the_models_weight_products_alone(scaling, model):
    m = scaling.machine
    assert m["products_ms"] > 0
    # the products stream exactly the bytes a step's weights take: GB/s and ms describe the same time
    assert m["products_GBps"] == pytest.approx(weight_bytes_per_step(model) / m["products_ms"] / 1e6)
