"""The teacher's key is generated from the saved runs: current, complete, and never linked from a learner's copy."""
from __future__ import annotations

from pathlib import Path

import nbformat

from kvlab import teachers_key
from kvlab.authoring import notebook_dir
from kvlab.course import NOTEBOOKS, WORKSHOP_DIR

FOLDER = notebook_dir()


def test_the_key_is_what_the_saved_runs_say():
    assert (FOLDER / teachers_key.KEY_FILE).read_text(encoding="utf-8") == teachers_key.render(FOLDER), \
        "notebooks/KEY.md is stale: run python -m kvlab notebooks (it rewrites the key from the saved runs)"


def test_every_prediction_has_its_question_and_its_answer():
    rows = teachers_key.key_rows(FOLDER)
    asked = sum(c.source.count(".against(") for n in NOTEBOOKS
                for c in nbformat.read(FOLDER / n.file, as_version=4).cells if c.cell_type == "code")
    assert len(rows) == asked and asked >= len(NOTEBOOKS)
    for r in rows:
        assert not r["question"].startswith("(") and not r["answer"].startswith("("), r
        assert any(ch.isdigit() for ch in r["answer"]), r


def test_the_learners_edition_never_links_the_key():
    for n in NOTEBOOKS:
        text = (FOLDER / WORKSHOP_DIR / n.file).read_text(encoding="utf-8")
        assert teachers_key.KEY_FILE not in text, f"workshop/{n.file} links the teacher's key"


def test_a_prediction_without_its_box_is_named(tmp_path: Path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%matplotlib inline\nx = 1"),
                                         nbformat.v4.new_code_cell("guess.against(2.0)")])
    assert teachers_key._question(nb.cells[0].source, "guess") is None
    assert teachers_key._question('guess = predict("How many?" " Say.", unit="x")', "guess") == "How many? Say."
