"""Lesson 03's figures and panel, built from a small real run on the shipped recall model.

Each figure is checked against an independent oracle where one exists: the memory formula from the
model's config, the bytes an offloaded step must move counted by hand, recall_accuracy's own rows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure

from kvlab.cache import kv_cache_bytes
from kvlab.experiments.cache_accuracy import accuracy_by_distance, accuracy_summary, accuracy_table
from kvlab.lessons.l03_cache_strategies.figures import (expected_bytes_moved, plot_accuracy_by_distance, plot_accuracy_vs_bits,
                                    plot_bytes_moved, plot_cache_time, plot_latency_vs_context,
                                    plot_memory_vs_context, plot_offload_cost, plot_strategies)
from kvlab.experiments.quality import recall_accuracy
from kvlab.experiments.recall import load_recall_model, make_examples
from kvlab.experiments.strategies import run_strategy_comparison, strategy_settings
from kvlab.lessons.l03_cache_strategies.panel import learner_table, strategies_panel

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

PAIRS = (2, 4)


@pytest.fixture(scope="module")
def model():
    return load_recall_model(device="cpu")


@pytest.fixture(scope="module")
def frame(model):
    return run_strategy_comparison(model, ("dynamic", "static", "quantized", "offloaded"), bits=(8, 2),
                                   residual=0, group_size=32, pairs=PAIRS, new_tokens=6, repeats=1,
                                   examples=12, quality_prompts=2)


def _bpt(model) -> int:
    c = model.config
    return kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, 1)  # fp32, batch 1, K and V


def _lines(ax, label_part: str):
    return [line for line in ax.get_lines() if label_part in str(line.get_label())]


def test_the_run_has_every_setting_and_the_accuracy_frame(frame, model):
    assert list(dict.fromkeys(frame["setting"])) == [
        "dynamic", "static", "quantized(bits=8, residual=0, group_size=32)",
        "quantized(bits=2, residual=0, group_size=32)", "offloaded", "offloaded(link_gbps=1.0)"]
    assert sorted(frame["pairs"].unique()) == list(PAIRS)
    assert frame.attrs["bytes_per_token"] == _bpt(model)
    acc = frame.attrs["accuracy"]
    assert set(acc["setting"]) == {"dynamic", "quantized(bits=8, residual=0, group_size=32)",
                                   "quantized(bits=2, residual=0, group_size=32)"}  # exact strategies not rescored
    longest = frame[frame["pairs"] == max(PAIRS)].set_index("setting")
    summary = accuracy_summary(acc).set_index("setting")
    assert longest.loc["dynamic", "accuracy"] == summary.loc["dynamic", "accuracy"]
    assert np.isnan(longest.loc["static", "accuracy"]) and np.isnan(frame.loc[frame["pairs"] == 2, "accuracy"]).all()
    table = learner_table(frame)
    assert list(table["recall accuracy"])[1] == "= exact" and len(table) == 6
    n = frame.attrs["accuracy"].groupby("setting")["examples"].sum()["dynamic"]
    assert all(a.endswith(f"/{n})") for a in table["recall accuracy"] if a[:1].isdigit())  # every % shows its n


def test_memory_plot_draws_each_setting_over_the_formula(frame, model):
    fig = plot_memory_vs_context(frame)
    ax = fig.axes[0]
    formula = _lines(ax, "formula")[0]
    tokens = np.asarray(formula.get_xdata())
    c = model.config
    assert np.allclose(formula.get_ydata(), [kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, int(t)) / 1024
                                             for t in tokens])
    for setting, rows in frame.groupby("setting", sort=False):
        line = [ln for ln in ax.get_lines() if ln.get_label() == setting.replace("quantized", "quant")
                .replace("residual", "res").replace("group_size", "group")][0]
        assert np.allclose(line.get_ydata(), rows.sort_values("stored_tokens")["allocated_bytes"] / 1024)
    dyn = frame[frame["setting"] == "dynamic"].sort_values("stored_tokens")
    assert np.allclose(dyn["allocated_bytes"] / 1024, np.interp(dyn["stored_tokens"], tokens, formula.get_ydata()))
    ideal = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert len(ideal) == 2  # one ideal line per quantized setting
    assert any("reserved" in t.get_text() for t in ax.texts)  # static at the shorter context


def test_latency_plot_has_p50_points_and_whiskers_to_p95(frame):
    fig = plot_latency_vs_context(frame)
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == frame["setting"].nunique()
    first = frame[frame["setting"] == "dynamic"].sort_values("context_tokens")
    data_line, _caps, (segments,) = bars[0].lines
    assert np.allclose(data_line.get_ydata(), first["token_ms_p50"])
    tops = [seg[:, 1].max() for seg in segments.get_segments()]
    assert np.allclose(tops, first["token_ms_p95"])


def test_cache_time_plot_has_a_line_per_setting_and_the_dynamic_step_for_scale(frame):
    ax = plot_cache_time(frame).axes[0]
    assert len(_lines(ax, "(bits=")) == 2 and len(_lines(ax, "a whole dynamic step")) == 1


def test_bytes_moved_bars_match_the_hand_count(frame, model):
    fig = plot_bytes_moved(frame)
    ax = fig.axes[0]
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(containers) == 2  # the tier at its own speed and behind the slow link: the same bytes
    for bars, (_, off) in zip(containers, frame[frame["strategy"] == "offloaded"].groupby("setting", sort=False)):
        off = off.sort_values("context_tokens")
        heights = [b.get_height() for b in bars]
        assert np.allclose(heights, off["bytes_moved_per_step"] / 1024)
        # each of the new_tokens - 1 decode steps reads the stored tokens and writes one: count them by hand
        for r, h in zip(off.itertuples(), heights):
            steps = range(r.context_tokens, r.stored_tokens)  # tokens stored when each decode step starts
            by_hand = np.mean([(s + 1) * _bpt(model) for s in steps])
            assert h * 1024 == pytest.approx(by_hand) == expected_bytes_moved(r.context_tokens, r.stored_tokens,
                                                                             _bpt(model))
    n_off = (frame["strategy"] == "offloaded").sum()
    assert len(ax.texts) == n_off and all(t.get_text().endswith(" ms") for t in ax.texts)
    empty = plot_bytes_moved(frame[frame["strategy"] != "offloaded"]).axes[0]
    assert "no offloaded" in empty.texts[0].get_text()


def test_offload_cost_plots_step_time_against_bytes_with_the_links_floor(frame):
    ax = plot_offload_cost(frame).axes[0]
    dyn = frame[frame["setting"] == "dynamic"].set_index("context_tokens")["token_ms_p50"]
    for setting, rows in frame[frame["strategy"] == "offloaded"].groupby("setting", sort=False):
        rows = rows.sort_values("context_tokens")
        (line,) = _lines(ax, setting + ":")  # labelled with the copies' bytes per second
        assert "GB/s" in line.get_label()
        assert np.allclose(line.get_xdata(), rows["bytes_moved_per_step"] / 1024)
        assert np.allclose(line.get_ydata(), rows["token_ms_p50"])
    slow = frame[frame["setting"] == "offloaded(link_gbps=1.0)"].sort_values("context_tokens")
    (floor,) = _lines(ax, "dynamic + bytes / 1 GB/s")
    link_ms = slow["bytes_moved_per_step"] / 1e9 * 1e3  # the link's own time, computed here from the bytes
    assert np.allclose(floor.get_ydata(), slow["context_tokens"].map(dyn) + link_ms)
    assert len(_lines(ax, "dynamic at the same contexts")) == 1
    empty = plot_offload_cost(frame[frame["strategy"] != "offloaded"]).axes[0]
    assert "no offloaded" in empty.texts[0].get_text()


def test_the_accuracy_table_counts_right_answers_and_names_each_buckets_n(frame):
    acc = frame.attrs["accuracy"]
    table = accuracy_table(acc)
    assert list(table.index) == list(dict.fromkeys(acc["setting"]))
    buckets = acc[acc["setting"] == "dynamic"]
    for col, n in zip(table.columns, buckets["examples"]):
        assert col.endswith(f"(n={n})")
    for setting, g in acc.groupby("setting", sort=False):
        cells = [f"{c}/{n}" for c, n in zip(g["correct"], g["examples"])]
        assert list(table.loc[setting])[:-1] == cells
        assert table.loc[setting, "all"] == f"{g['correct'].sum()}/{g['examples'].sum()}"
    summary = accuracy_summary(acc).set_index("setting")
    assert (summary["nearest_n"] == buckets["examples"].iloc[0]).all()
    assert (summary["correct"] == acc.groupby("setting")["correct"].sum().reindex(summary.index)).all()


def test_accuracy_vs_bits_has_the_quantized_line_and_the_exact_level(frame):
    acc = frame.attrs["accuracy"]
    ax = plot_accuracy_vs_bits(acc).axes[0]
    summary = accuracy_summary(acc).set_index("setting")
    (quant,) = _lines(ax, "quant(")
    assert list(quant.get_xdata()) == [2.0, 8.0]
    assert np.allclose(quant.get_ydata(), [summary.loc["quantized(bits=2, residual=0, group_size=32)", "accuracy"],
                                           summary.loc["quantized(bits=8, residual=0, group_size=32)", "accuracy"]])
    (exact,) = _lines(ax, "exact cache")
    assert exact.get_ydata()[0] == summary.loc["dynamic", "accuracy"]


def test_accuracy_by_distance_matches_recall_accuracy(model):
    examples = make_examples(8, 4, seed=1000)
    ours = accuracy_by_distance(model, [{"cache": "quantized", "bits": 2, "residual": 0}], pairs=4, examples=8,
                                quality_prompts=0)
    theirs = recall_accuracy(model, examples, "quantized", bits=2, residual=0)
    mine = ours[ours["strategy"] == "quantized"].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine[list(theirs.columns)], theirs, check_dtype=False, check_categorical=False)
    # the plots read both kinds of frame: ours (with an exact row) and recall_accuracy's
    for frame_in in (ours, theirs):
        ax = plot_accuracy_by_distance(frame_in).axes[0]
        assert len(_lines(ax, "exact cache")) == 1 and len(_lines(ax, "quant(bits=2")) == 1
        assert all("n=" in t.get_text() for t in ax.get_xticklabels())
        bits_ax = plot_accuracy_vs_bits(frame_in).axes[0]
        assert len(_lines(bits_ax, "exact cache")) == 1


def test_the_dashboard_puts_all_six_plots_on_one_figure(frame):
    fig = plot_strategies(frame)
    assert isinstance(fig, Figure) and len(fig.axes) == 6 and fig.legends
    titles = [ax.get_title() for ax in fig.axes]
    assert any("Memory" in t for t in titles) and any("distance" in t for t in titles)
    bare = frame.copy()
    bare.attrs = {}
    fig2 = plot_strategies(bare)
    assert any("no accuracy run" in t.get_text() for ax in fig2.axes for t in ax.texts)


def test_the_panel_runs_and_refuses_bad_choices_in_one_line(model):
    panel = strategies_panel(model, strategies=("dynamic", "quantized"), bits=(4,), pairs=(2,), new_tokens=4,
                             examples=20, repeats=1)
    result = panel.run()
    assert result is not None and isinstance(result.figure, Figure), panel.traceback()
    assert list(result.summary["setting"]) == ["dynamic", "quantized(bits=4, residual=0, group_size=32)"]
    assert panel.run(strategies=()) is None and "at least one strategy" in panel.error
    assert panel.run(strategies=("quantized",), bits=()) is None and "no bits" in panel.error
    assert panel.run(group_size=5) is None and "group_size" in panel.error  # not an option of the dropdown


def test_settings_from_the_panel_choices():
    assert strategy_settings(("quantized", "offloaded"), bits=(2, 8), residual=16) == [
        {"cache": "dynamic"}, {"cache": "quantized", "bits": 8, "residual": 16},
        {"cache": "quantized", "bits": 2, "residual": 16}, {"cache": "offloaded"}]
    with pytest.raises(ValueError, match="unknown strategy 'paged'"):
        strategy_settings(("paged",))
