"""The hold rates notebooks/TEACHING.md states are the ones measured: written from the committed records
(notebooks/claims_hold_rates.json for the claims' examples, notebooks/key_ranges.json for the notebooks' own
runs, both made by scripts/claims_robustness.py), and one row per asserting wall claim."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from claims_robustness import (KEY_RECORD, NOT_MEASURED, RECORD, ROW, TEACHING, held_columns,  # noqa: E402
                               measured_paragraph, notebook_columns, notebook_sentence, rewrite_teaching)
from kvlab.lessons import CLAIMS  # noqa: E402

NAME = "uncached_wait_gap_widens"  # an asserting claim of notebook 01


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


@pytest.fixture(scope="module")
def key() -> dict:
    return json.loads(KEY_RECORD.read_text())


def rows() -> dict[str, tuple[str, str, str, str, str]]:
    """{claim: (nb, example quiet, example loaded, notebook quiet, notebook loaded)} of TEACHING.md's table."""
    out = {}
    for line in TEACHING.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            out[m.group(1)] = tuple(m.group(i).strip() for i in range(2, 7))
    return out


def test_the_teaching_notes_state_the_recorded_rates_and_how_they_were_measured(record, key):
    text = TEACHING.read_text(encoding="utf-8")
    assert rewrite_teaching(text, record, key) == text, (
        "TEACHING.md's hold rates differ from notebooks/claims_hold_rates.json or notebooks/key_ranges.json: run "
        "`python scripts/claims_robustness.py --teaching` (or measure anew with --json notebooks/claims_hold_rates.json,"
        " or --notebooks)")
    assert measured_paragraph(record, key) in text


def test_every_asserting_wall_claim_has_a_row_with_its_notebook_and_a_recorded_rate(record):
    have, measured = rows(), held_columns(record)
    asserting = {c.name for c in CLAIMS.values() if c.clock == "wall" and c.asserts}
    assert asserting <= set(have), f"claims without a row in TEACHING.md's table: {sorted(asserting - set(have))}"
    assert asserting <= set(measured), f"claims the record did not measure: {sorted(asserting - set(measured))}"
    for name, (nb, quiet, loaded, _, _) in have.items():
        assert name in CLAIMS, f"TEACHING.md names {name}, which no lesson registers"
        assert CLAIMS[name].notebook.startswith(nb), (name, nb, CLAIMS[name].notebook)
        if name in asserting:
            assert (quiet, loaded) == measured[name]


def test_the_notebook_columns_are_those_of_the_key_record(key):
    wrong = {name: (nb_quiet, nb_loaded, notebook_columns(key, nb, name))
             for name, (nb, _, _, nb_quiet, nb_loaded) in rows().items()
             if (nb_quiet, nb_loaded) != notebook_columns(key, nb, name)}
    assert not wrong, ("TEACHING.md's columns \"in the notebook\" differ from notebooks/key_ranges.json "
                       f"(shown, recorded): {wrong}; run `python scripts/claims_robustness.py --teaching`")


def _key(key: dict, claims: list[dict | None]) -> dict:
    """``key`` with 01's quiet executions replaced by one per entry of ``claims`` (None: one without the field)."""
    runs = [{"notebook": "01_the_slowdown.ipynb", "condition": "quiet", "run": i, "claim_marks": {},
             "not_holding": [], **({"claims": c} if c is not None else {})} for i, c in enumerate(claims)]
    return dict(key, executions=runs)


def test_the_notebook_columns_count_the_runs_each_claim_held(key):
    made = _key(key, [{NAME: "✓", "cached_steps_stay_flat": "•"}, {NAME: "✗", "cached_steps_stay_flat": "•"},
                      None])
    assert notebook_columns(made, "01", NAME) == ("1/2 (9–91%)", NOT_MEASURED)  # no loaded run: not measured
    assert notebook_columns(made, "01", "cached_steps_stay_flat") == ("shown (•)", NOT_MEASURED)
    assert notebook_columns(made, "01", "uncached_tokens_slow_down") == (NOT_MEASURED, NOT_MEASURED)
    assert notebook_columns(made, "00", NAME) == (NOT_MEASURED, NOT_MEASURED)
    assert notebook_columns(_key(key, [{NAME: "✓"}, {}]), "01", NAME) == ("1/2 (9–91%)", NOT_MEASURED)  # not shown: not held
    assert notebook_columns(_key(key, [None, None]), "01", NAME) == (NOT_MEASURED, NOT_MEASURED)  # no field
    assert NOT_MEASURED in notebook_sentence(_key(key, [None]))


def test_the_rewrite_replaces_only_the_rates_and_the_paragraph(record, key):
    made = _key(key, [{NAME: "✓"}, {NAME: "✗"}])
    text = (f"before\n<!-- kvlab:hold-rates -->\nold words\n<!-- /kvlab:hold-rates -->\n"
            f"| `{NAME}` | 01 | 9/9 | 0/9 | 5/5 | 4/5 | why | *say* |\n"
            f"| `slow_link_time_shows_in_the_step` | 03 | shown (•) | shown (•) | 5/5 | 4/5 | never | *say* |\nafter\n")
    out = rewrite_teaching(text, record, made)
    quiet, loaded = held_columns(record)[NAME]
    assert f"| `{NAME}` | 01 | {quiet} | {loaded} | 1/2 (9–91%) | {NOT_MEASURED} | why | *say* |" in out
    assert (f"| `slow_link_time_shows_in_the_step` | 03 | shown (•) | shown (•) | {NOT_MEASURED} | {NOT_MEASURED} "
            f"| never | *say* |") in out
    assert "old words" not in out and measured_paragraph(record, made) in out
    assert made["command"] in out and made["conditions"][0]["started"] in out
    assert out.startswith("before\n") and out.endswith("after\n")
    assert rewrite_teaching(out, record, made) == out
    with pytest.raises(ValueError, match="hold-rates"):
        rewrite_teaching("no markers", record, made)


def test_a_hold_rate_comes_with_its_wilson_interval():
    from claims_robustness import rate_cell, wilson

    assert rate_cell(10, 10) == "10/10 (72–100%)"  # ten of ten still allows a 28% failure rate
    assert rate_cell(0, 10) == "0/10 (0–28%)"
    low, high = wilson(7, 10)
    assert 0.39 < low < 0.40 and 0.89 < high < 0.90  # the textbook case: 7/10 gives 39.7%–89.2%


def test_an_observation_shows_no_example_rate_even_one_recorded_while_it_asserted(record, key):
    """06's simulator checks became observations (•) after their rates were recorded: their rows say "shown (•)", as
    every observation's do, never an old count (nor 3/3 from a short run)."""
    made = _key(key, [{NAME: "✓"}])
    name = "simulator_medians_within_factor_two"
    assert not CLAIMS[name].asserts
    text = (f"<!-- kvlab:hold-rates -->\n<!-- /kvlab:hold-rates -->\n"
            f"| `{name}` | 06 | 3/3 | 3/3 | 5/5 | 4/5 | why | *say* |\n")
    assert f"| `{name}` | 06 | shown (•) | shown (•) |" in rewrite_teaching(text, record, made)


def test_a_measurement_again_on_another_cpu_says_which(record, key):
    again = {"command": "c", "started": "a", "finished": "b"}
    moved = dict(key, remeasured=[{**again, "notebooks": ["01_the_slowdown.ipynb"], "cpu": "Other CPU"}])
    assert "from a to b on Other CPU;" in notebook_sentence(moved)
    stayed = dict(key, remeasured=[{**again, "notebooks": ["01_the_slowdown.ipynb"],
                                    "cpu": key["environment"].get("cpu")}])
    assert "from a to b;" in notebook_sentence(stayed)  # the record's own CPU: nothing to add
    examples = dict(record, remeasured=[{**again, "claims": [NAME], "cpu": "Other CPU"}])
    assert "from a to b on Other CPU." in measured_paragraph(examples, key)
