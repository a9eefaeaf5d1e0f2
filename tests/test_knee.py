"""The one knee rule (kvlab.serving.knee): each case of its definition, by hand, and every place that prints a knee
reads it from there."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from kvlab.serving.knee import KEEPS_UP_RATIO, find_knee, keeps_up

LESSONS = ("06", "09")  # the lessons these tests belong to: `pytest -m lNN`

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("keeps, case, rps, at_least, words", [
    ([True, True, False, False], "knee", 2.0, 2.0, "2 req/s"),
    ([True, False, True, True], "knee", 1.0, 1.0, "1 req/s"),  # fails, then recovers: the knee is before the fall
    ([True, True, True, True], "kept_up", None, 8.0, "≥ 8 req/s"),  # no knee on the grid: capacity at least the top
    ([False, True, True, True], "behind_from_the_start", None, None, "< 1 req/s"),  # below the lowest load
    ([True], "kept_up", None, 1.0, "≥ 1 req/s"),
])
def test_each_case_of_the_definition(keeps, case, rps, at_least, words):
    offered = [1.0, 2.0, 4.0, 8.0][:len(keeps)]
    knee = find_knee(offered, keeps)
    assert (knee.case, knee.rps, knee.at_least) == (case, rps, at_least)
    assert str(knee).startswith(words), str(knee)


def test_a_load_keeps_up_with_enough_served_and_its_tail_within_the_target():
    assert keeps_up(KEEPS_UP_RATIO) and not keeps_up(KEEPS_UP_RATIO - 0.01)
    assert keeps_up(1.0, 0.5, slo_ttft_s=1.0) and not keeps_up(1.0, 1.5, slo_ttft_s=1.0)
    assert not keeps_up(1.0, math.nan, slo_ttft_s=1.0)  # nothing completed: no p95, so not within the target
    assert not keeps_up(math.nan)
    with pytest.raises(ValueError, match="min_served"):
        keeps_up(1.0, min_served=1.5)


def test_bad_curves_are_refused_before_any_work():
    with pytest.raises(ValueError, match="rise strictly"):
        find_knee([2, 1], [True, True])
    with pytest.raises(ValueError, match="one entry per load"):
        find_knee([1, 2], [True])
    with pytest.raises(ValueError, match="at least one load"):
        find_knee([], [])


def test_the_http_sweeps_the_lessons_and_the_room_read_the_same_knee():
    """A curve that falls behind and recovers: the lessons' mark_knee, the HTTP sweeps' knee (bench serve, 09) and
    the room's service curve all put its knee before the first fall; one that keeps up everywhere has none on the
    grid, with its lower bound."""
    from kvlab.experiments.two_engines import knee as http_knee
    from kvlab.serving.sweep import mark_knee

    frame = pd.DataFrame({"profile": "x", "policy": "p", "offered_rps": [1.0, 2.0, 4.0, 8.0],
                          "throughput_ratio": [1.0, 0.5, 1.0, 1.0], "ttft_p95_s": [0.1, 0.2, 0.2, 0.3]})
    assert mark_knee(frame, slo_ttft_s=1.0)["is_knee"].tolist() == [True, False, False, False]
    rows = frame.assign(served=frame.throughput_ratio)
    assert http_knee(rows, slo_ttft_s=1.0).rps == 1.0
    assert str(http_knee(rows.assign(served=1.0), slo_ttft_s=1.0)).startswith("≥ 8 req/s")
    assert mark_knee(frame.assign(throughput_ratio=1.0)).attrs["knees"] == {"x / p": str(find_knee(
        [1, 2, 4, 8], [True] * 4))}


# Comparisons with the keep-up share outside kvlab/serving/knee.py, each for a reason that is not a knee.
NOT_A_KNEE = {
    "kvlab/lessons/l06_under_load/exercises.py": "the wrong answer the checker recognises (the last level that keeps up)",
    "kvlab/lessons/l09_measure_a_real_server/claims.py": "09's claim on why the achieved rate lags (a drain-aware rate)",
}


def test_no_second_knee_rule_in_the_package():
    """Only kvlab/serving/knee.py decides whether a load keeps up and where the knee is: no other module compares a
    served share with the keep-up share or walks a curve to its first failure."""
    rule = re.compile(r"(>=?|<=?)\s*(KEEPS_UP_RATIO|min_served|min_throughput_ratio)\b|"
                      r"\b(KEEPS_UP_RATIO|min_served|min_throughput_ratio)\s*(>=?|<=?)\s*[a-z(]")
    found = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kvlab").rglob("*.py") if p.name != "knee.py"
             and rule.search(re.sub(r"0 < \w+ <= 1", "", p.read_text(encoding="utf-8")))}
    assert found <= set(NOT_A_KNEE), f"a keep-up rule outside kvlab.serving.knee in {sorted(found - set(NOT_A_KNEE))}"
    readers = [p.relative_to(ROOT).as_posix() for p in (ROOT / "kvlab").rglob("*.py")
               if "find_knee(" in p.read_text(encoding="utf-8")]
    assert {"kvlab/serving/sweep.py", "kvlab/experiments/two_engines.py", "kvlab/room/view.py"} <= set(readers)
