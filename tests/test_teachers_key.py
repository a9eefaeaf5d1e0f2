"""The teacher's key is generated from the saved runs and the record of answers across runs: current, complete,
and never linked from a learner's copy."""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest

from kvlab import teachers_key
from kvlab.authoring import notebook_dir
from kvlab.course import NOTEBOOKS, WORKSHOP_DIR

FOLDER = notebook_dir()
ROWS = teachers_key.key_rows(FOLDER)


def test_the_key_is_what_the_saved_runs_and_the_record_say():
    assert (FOLDER / teachers_key.KEY_FILE).read_text(encoding="utf-8") == teachers_key.render(FOLDER), \
        "notebooks/KEY.md is stale: run python -m kvlab notebooks (it rewrites the key from the saved runs)"


def test_every_prediction_has_its_question_and_its_answer():
    asked = sum(c.source.count(".against(") for n in NOTEBOOKS
                for c in nbformat.read(FOLDER / n.file, as_version=4).cells if c.cell_type == "code")
    assert len(ROWS) == asked and asked >= len(NOTEBOOKS)
    for r in ROWS:
        assert not r["question"].startswith("(") and not r["answer"].startswith("("), r
        assert any(ch.isdigit() for ch in r["answer"]), r


@pytest.mark.parametrize("answer", sorted({r["answer"] for r in ROWS}))
def test_every_answer_in_the_saved_runs_reads_as_a_number(answer: str):
    value, unit = teachers_key.parse_answer(answer)
    assert teachers_key.format_answer(value, unit) == answer  # the number and its unit, nothing lost


@pytest.mark.parametrize("text, value, unit", [("3.7×", 3.7, "×"), ("12.5 ms", 12.5, " ms"), ("57.7%", 57.7, "%"),
                                               ("4,096 tokens", 4096, " tokens"), ("1.23e+03 ms", 1230, " ms"),
                                               ("-0.5 s", -0.5, " s"), ("32 sequences", 32, " sequences")])
def test_answer_formats(text: str, value: float, unit: str):
    assert teachers_key.parse_answer(text) == (pytest.approx(value), unit)
    assert teachers_key.parse_answer("inf×")[0] == float("inf")
    assert teachers_key.parse_answer("no prediction yet") is None and teachers_key.parse_answer(None) is None


def test_the_record_names_the_notebooks_predictions():
    """Every row of notebooks/key_ranges.json names a prediction of the notebooks, and every prediction of a
    measured notebook has its row (without a record, the key says "not measured" everywhere)."""
    record = teachers_key.read_record(FOLDER)
    if record is None:
        assert teachers_key.render(FOLDER).count("| not measured | not measured |") == len(ROWS)
        return
    assert not teachers_key.record_mismatches(ROWS, record), \
        "notebooks/key_ranges.json does not match the notebooks: python scripts/claims_robustness.py --notebooks"


def _record(rows: list[dict]) -> dict:
    """A record as scripts/claims_robustness.py --notebooks writes it, for the first notebook's predictions."""
    first = [r for r in rows if r["notebook"] == rows[0]["notebook"]]
    return {"environment": {"cuda_device": None, "torch_threads": 2, "versions": {"kvlab": "0.1.0", "torch": "2.x"}},
            "runs": 2, "cpu_count": 2, "started": "2026-01-01 10:00:00", "finished": "2026-01-01 10:05:00",
            "command": "python scripts/claims_robustness.py --notebooks --runs 2 --only 00",
            "notebooks": [first[0]["notebook"]],
            "conditions": [{"condition": "quiet", "processes": 0, "load_before": 0.5, "load_after": 0.75},
                           {"condition": "loaded", "processes": 2, "load_before": 0.75, "load_after": 2.5}],
            "predictions": [{"notebook": r["notebook"], "question": r["question"], "every_machine": r["every_machine"],
                             "unit": teachers_key.parse_answer(r["answer"])[1],
                             "quiet": {"values": [2.5, 3.25]}, "loaded": {"values": [4.0, None]}} for r in first]}


def test_the_key_shows_the_range_of_each_measured_prediction():
    record = _record(ROWS)
    text = teachers_key.render(FOLDER, record)
    unit = record["predictions"][0]["unit"]
    assert f"| 2.5–3.25{unit} (2 runs) | 4{unit} (1 run, 1 without an answer) |" in text
    assert text.count("| not measured | not measured |") == len(ROWS) - len(record["predictions"])
    assert "2026-01-01 10:00:00" in text and record["command"] in text and "0.50 before and 0.75 after" in text
    assert "(notebooks 00 only)" in text and "2 CPU-bound competing processes" in text
    assert not teachers_key.record_mismatches(ROWS, record)


def test_a_record_that_no_longer_matches_the_notebooks_is_named():
    record = _record(ROWS)
    stale = copy.deepcopy(record)
    stale["predictions"][0]["question"] = "A question the notebook no longer asks?"
    problems = teachers_key.record_mismatches(ROWS, stale)
    assert any("unknown prediction" in p for p in problems) and any("no row for" in p for p in problems)


def test_the_learners_edition_never_links_the_key():
    for n in NOTEBOOKS:
        text = (FOLDER / WORKSHOP_DIR / n.file).read_text(encoding="utf-8")
        assert teachers_key.KEY_FILE not in text, f"workshop/{n.file} links the teacher's key"


def test_a_prediction_without_its_box_is_named(tmp_path: Path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%matplotlib inline\nx = 1"),
                                         nbformat.v4.new_code_cell("guess.against(2.0)")])
    assert teachers_key._question(nb.cells[0].source, "guess") is None
    assert teachers_key._question('guess = predict("How many?" " Say.", unit="x")', "guess") == "How many? Say."
    assert teachers_key.predictions(nb) == [{"question": "(no predict(...) found before it)", "answer": None,
                                             "every_machine": False}]
