"""Offloading under load: both runs share one schedule and one set of tokens; the tables and the figure read them."""
from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from kvlab.lessons import CLAIMS
from kvlab.experiments.offload_load import (OFFLOADED, ON_DEVICE, bytes_by_hand, default_link_gbps,
                                            distribution_table, offload_under_load, paired_steps)
from kvlab.lessons.l03_cache_strategies.figures import plot_offload_under_load

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`


@pytest.fixture(scope="module")
def loaded(model):
    return offload_under_load(model, n=6, max_seqs=3, prompt_tokens=40, max_new_tokens=8, link_gbps=0.05)


def test_both_runs_run_the_same_steps_and_give_the_same_tokens(loaded):
    assert loaded.same_tokens and loaded.same_schedule
    dev, off = loaded.run(ON_DEVICE), loaded.run(OFFLOADED)
    assert len(dev.trace) == len(off.trace) > 6
    assert dev.trace["num_seqs"].max() == 3  # requests waited for the three slots: the batches were full
    assert off.settings["executor"] == "model_offloaded" and dev.settings["executor"] == "model"


def test_the_bytes_logged_per_step_match_the_count_from_the_trace(loaded, model):
    off = loaded.run(OFFLOADED)
    hand = bytes_by_hand(off, model.config.kv_bytes_per_token(4))
    steps = loaded.steps[loaded.steps["run"] == OFFLOADED]
    assert steps["bytes_moved"].tolist() == hand["bytes_moved"].tolist()
    assert (loaded.steps.loc[loaded.steps["run"] == ON_DEVICE, "bytes_moved"] == 0).all()
    link_s = steps["bytes_moved"] / (0.05 * 1e9)
    assert (steps["copy_s"] >= link_s - 1e-6).all()  # the link's time is inside every offloaded step


def test_the_distribution_table_gives_n_and_spread_for_each_run_and_measure(loaded):
    t = distribution_table(loaded)
    assert list(zip(t["run"], t["measure"])) == [(r, m) for r in (ON_DEVICE, OFFLOADED)
                                                 for m in ("step time", "time between tokens")]
    steps = len(loaded.run(ON_DEVICE).trace)
    gaps = int(loaded.run(ON_DEVICE).requests["output_tokens"].sum()) - 6  # every token but each request's first
    assert t["n"].tolist() == [steps, gaps, steps, gaps]
    assert ((t["p25"] <= t["p50"]) & (t["p50"] <= t["p75"]) & (t["p75"] <= t["p95"])).all()
    assert (t["iqr"] - (t["p75"] - t["p25"])).abs().max() < 1e-12
    ms = distribution_table(loaded, ms=True)
    assert ms["p50_ms"].tolist() == pytest.approx((t["p50"] * 1e3).tolist())


def test_paired_steps_line_up_the_same_step_of_both_runs(loaded):
    p = paired_steps(loaded)
    assert len(p) == len(loaded.run(ON_DEVICE).trace)
    assert (p["extra_s"] == p["offloaded_s"] - p["on_device_s"]).all()


def test_the_deterministic_claims_hold_and_every_claim_reads_the_run(loaded):
    for name in ("offloaded_engine_serves_the_same_tokens", "offloaded_pool_moves_the_counted_bytes"):
        assert CLAIMS[name].clock == "deterministic"
        assert CLAIMS[name].on(loaded).holds is True, CLAIMS[name].on(loaded)
    for name in ("offloaded_tail_between_tokens_is_longer", "offloading_widens_the_spread",
                 "offload_cost_follows_the_bytes"):
        assert CLAIMS[name].on(loaded).holds is not None, CLAIMS[name].on(loaded)


def test_the_figure_has_the_two_distributions_and_the_bytes(loaded):
    fig = plot_offload_under_load(loaded)
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert "n = " in fig.axes[0].get_legend().get_texts()[0].get_text()


def test_a_cpu_model_gets_the_modelled_link(model):
    assert default_link_gbps(model) == 0.25


def test_bad_settings_are_refused(model):
    with pytest.raises(ValueError, match="max_seqs"):
        offload_under_load(model, max_seqs=0)
