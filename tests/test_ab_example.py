"""The A/B example, measured: at the same load, one real policy completes more yet starts answers later.

Virtual time on a cost model, so the numbers are deterministic: the same arguments give the same
frame. Checked with the calibration shipped in kvlab/data/calibration/ and with a round-number cost
model, so the result does not hang on one machine's coefficients. The load is chosen from policy
A's throughput alone (``ab_load``); the first-token times and B's throughput are then measured.
"""
from __future__ import annotations

import pandas as pd
import pytest

import kvlab
from kvlab.experiments.service_curves import ab_example, ab_holds, ab_load, ab_policies
from kvlab.serving.cost_model import CostModel, load_calibration

LESSONS = ("06",)  # the lessons these tests belong to: `pytest -m lNN`

ROUND = dict(step=0.02, prefill_tokens=1e-3, attention_calls=1e-4, decode_seqs=1e-3, decode_kv_slots=1e-5,
             prefill_attention=1e-6)


@pytest.fixture(scope="module", params=["shipped", "round"])
def cost_model(request) -> CostModel:
    if request.param == "shipped":
        return load_calibration("llama-30m")
    return CostModel(coefficients=ROUND, config=kvlab.llama_30m().to_dict(), settings={"block_size": 16})


@pytest.fixture(scope="module")
def frame(cost_model) -> pd.DataFrame:
    return ab_example(cost_model)  # at the default load, ab_load(cost_model)


def test_b_completes_more_in_the_window_but_its_p95_first_token_comes_later(frame):
    a, b = frame.set_index("policy").loc["A"], frame.set_index("policy").loc["B"]
    assert a["rule"] == "prefill_first" and b["rule"] == "decode_first"
    assert a["offered_rps"] == b["offered_rps"] and a["sent"] == b["sent"]  # the same load, the same requests
    assert b["completed"] > a["completed"] and b["output_tokens_per_s"] > a["output_tokens_per_s"]
    assert b["ttft_p95_s"] > a["ttft_p95_s"]
    # with margins a rounding change could not erase
    assert b["output_tokens_per_s"] > 1.2 * a["output_tokens_per_s"] and b["ttft_p95_sent_s"] > 1.3 * a["ttft_p95_sent_s"]
    assert ab_holds(frame) == {**ab_holds(frame), "higher_throughput": "B", "holds": True}


def test_every_request_sent_is_counted_at_the_end_of_the_window(frame):
    assert (frame["sent"] == frame.attrs["requests"]).all()
    assert (frame["sent"] == frame["completed"] + frame["failed"] + frame["waiting"] + frame["running"]).all()
    assert (frame["ttft_n"] == frame["completed"]).all()  # quantiles come with their sample size


def test_the_example_is_deterministic(cost_model, frame):
    pd.testing.assert_frame_equal(ab_example(cost_model, rate=frame["offered_rps"].iloc[0]), frame)


def test_the_load_is_where_a_alone_falls_behind_and_below_it_both_do_the_same_work(cost_model, frame):
    """The trade-off is a property of load: with little of it both keep up and complete the same."""
    rate = frame["offered_rps"].iloc[0]
    assert rate == ab_load(cost_model)
    light = ab_example(cost_model, rate=rate / 10)
    assert light["completed"].nunique() == 1 and not ab_holds(light)["holds"]


def test_the_policies_differ_only_in_priority():
    p = ab_policies()
    a, b = p["A"].__dict__, p["B"].__dict__
    assert {k for k in a if a[k] != b[k]} == {"priority"}


def test_below_capacity_both_rules_keep_up_overloaded_one_trades_first_tokens_for_throughput(cost_model):
    from kvlab.experiments.service_curves import ab_at_two_loads

    frame = ab_at_two_loads(cost_model)
    low, high = (frame[frame["load"] == k].set_index("policy") for k in ("below capacity", "overloaded"))
    assert low["offered_rps"].iloc[0] == pytest.approx(high["offered_rps"].iloc[0] / 2, rel=1e-3)
    assert low["keeps_up"].all() and low["completed"].nunique() == 1  # the same work below capacity
    assert not high.loc["A", "keeps_up"]  # the overloaded level is where A falls behind, by construction
    a, b = high.loc["A"], high.loc["B"]
    assert b["output_tokens_per_s"] > 1.2 * a["output_tokens_per_s"] and b["ttft_p95_sent_s"] > 1.3 * a["ttft_p95_sent_s"]
    assert a["tpot_p50_s"] > b["tpot_p50_s"]  # A's prompt-only steps pause the running answers
    assert (frame["tpot_n"] <= frame["completed"]).all()
    with pytest.raises(ValueError, match="low_fraction"):
        ab_at_two_loads(cost_model, low_fraction=1.5)


def test_the_ab_figure_draws_one_load_or_two(frame):
    from kvlab.lessons.l06_under_load.figures import plot_ab_example

    one = plot_ab_example(frame)
    two = plot_ab_example(pd.concat([frame.assign(load="low"), frame.assign(load="high")], ignore_index=True))
    assert len(one.axes) == len(two.axes) == 3
    assert [t.get_text() for t in two.axes[0].get_xticklabels()][0].startswith("low")
