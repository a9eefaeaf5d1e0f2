"""The workshop edition: the notebooks as a learner receives them, and no answer shown before the learner acts.

``notebooks/workshop/NN_name.ipynb`` is built from the same source as the teacher's copy
(``python -m kvlab notebooks --workshop``, no kernel): no outputs, solutions folded, links that resolve
from its folder, up to date with its source, and it is what the badges and the README open. It holds the
teacher's code cells, so it is not executed again: tests/test_notebooks.py runs the teacher's copy once.
The teacher's copy keeps its outputs, but a prediction's measured value and the checks gated on it
(``verdicts(..., after=guess)``) stay folded in a ``<details>`` there too.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from kvlab import authoring
from kvlab.course import (NOTEBOOKS, REPO_REF, WORKSHOP_DIR, binder_url, colab_url, course_map, course_map_section,
                          notebook_path)

from test_predict import shown_without_clicking

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
WORKSHOP = NOTEBOOK_DIR / WORKSHOP_DIR
FILES = [n.file for n in NOTEBOOKS]
LINK = re.compile(r"(?:\]\(<?|(?:href|src)=[\"'])([^)\"'\s>]+)")
MEASURED = re.compile(r'<b class="kvlab-measured">([^<]*)</b>')
SOLUTION = re.compile(r"<details>\s*<summary>\s*Solution\s*</summary>")


def teacher(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def workshop(name: str) -> nbformat.NotebookNode:
    path = WORKSHOP / name
    assert path.exists(), f"no workshop edition of {name}: run python -m kvlab notebooks --workshop"
    return nbformat.read(path, as_version=4)


def relative_links(nb) -> list[str]:
    found = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found += [t for t in LINK.findall(cell.source) if not re.match(r"^[a-zA-Z][\w+.-]*:", t)
                      and not t.startswith("#")]
    return found


# --- built by one command, the same every time ---------------------------------------------------

@pytest.mark.parametrize("name", FILES, ids=lambda n: n[:2])
def test_the_workshop_edition_is_up_to_date_with_its_source(name):
    built = authoring.workshop_text(authoring.source_path(NOTEBOOK_DIR / name))
    assert (WORKSHOP / name).exists() and (WORKSHOP / name).read_text(encoding="utf-8") == built, \
        f"notebooks/{WORKSHOP_DIR}/{name} differs from its source: run python -m kvlab notebooks --workshop {name[:2]}"


def test_the_folder_holds_the_course_and_nothing_else():
    assert sorted(p.name for p in WORKSHOP.iterdir()) == sorted(FILES)


def test_check_reports_a_workshop_edition_that_drifted_and_a_build_brings_it_back(tmp_path):
    shutil.copy(NOTEBOOK_DIR / "07_memory_is_capacity.py", tmp_path)
    notebook = tmp_path / "07_memory_is_capacity.ipynb"  # the teacher's copy is not needed: no kernel runs
    assert authoring.build_workshop(notebook, check=True).action == "out of date"
    assert authoring.build_workshop(notebook).action == "written"
    first = (tmp_path / WORKSHOP_DIR / notebook.name).read_bytes()
    assert authoring.build_workshop(notebook, check=True).action == "unchanged"
    assert authoring.build_workshop(notebook).action == "unchanged"
    (tmp_path / WORKSHOP_DIR / notebook.name).write_text(first.decode().replace("Workshop edition", "Edited"))
    drift = authoring.build_workshop(notebook, check=True)
    assert drift.action == "out of date" and "markdown" in drift.detail
    assert authoring.build_workshop(notebook).action == "written"
    assert (tmp_path / WORKSHOP_DIR / notebook.name).read_bytes() == first  # deterministic: no timestamp, no random id


# --- what a learner receives --------------------------------------------------------------------

@pytest.mark.parametrize("name", FILES, ids=lambda n: n[:2])
def test_the_workshop_edition_has_no_outputs_and_says_which_edition_it_is(name):
    nb = workshop(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code), \
        f"{name}: the workshop edition must carry no outputs (nothing measured, nothing answered)"
    assert nb.metadata["kvlab"]["edition"] == "workshop" and "widgets" not in nb.metadata
    assert nb.metadata["kvlab"]["teacher_copy"] == notebook_path(name, "teacher") == f"notebooks/{name}"
    first_line = nb.cells[0].source.splitlines()[0]
    assert "Workshop edition" in first_line, first_line
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert f"](../{name})" not in text and f"notebooks/{name})" not in text, \
        f"{name}: the learner's edition links the teacher's copy, the answer sheet"


@pytest.mark.parametrize("name", FILES, ids=lambda n: n[:2])
def test_the_workshop_edition_has_the_teachers_cells_with_solutions_folded(name):
    ours, theirs = workshop(name), authoring.from_source(authoring.source_path(NOTEBOOK_DIR / name))
    assert [c.cell_type for c in ours.cells] == [c.cell_type for c in theirs.cells]
    strip = re.compile(r"^# NBVAL_(CHECK|IGNORE)_OUTPUT[ \t]*\n?", re.M)
    assert [c.source for c in ours.cells if c.cell_type == "code"] == \
        [strip.sub("", c.source) for c in theirs.cells if c.cell_type == "code"]
    text = "\n".join(c.source for c in ours.cells if c.cell_type == "markdown")
    assert len(SOLUTION.findall(text)) == len(SOLUTION.findall("\n".join(c.source for c in theirs.cells))) >= 1
    assert "NBVAL_" not in "\n".join(c.source for c in ours.cells)  # nothing saved to compare with, or to ignore


@pytest.mark.parametrize("edition", ["workshop", "teacher"])
@pytest.mark.parametrize("name", FILES, ids=lambda n: n[:2])
def test_every_relative_link_resolves_from_the_notebooks_folder(name, edition):
    nb = workshop(name) if edition == "workshop" else authoring.from_source(authoring.source_path(NOTEBOOK_DIR / name))
    folder = WORKSHOP if edition == "workshop" else NOTEBOOK_DIR
    links = relative_links(nb)
    assert links, f"{name}: no relative link found (navigation at least); is LINK still right?"
    broken = [t for t in links if not (folder / t.split("#")[0]).resolve().exists()]
    assert not broken, f"{edition} edition of {name}: links that resolve to nothing from {folder.name}/: {broken}"


def test_links_are_rewritten_for_the_workshop_folder_and_course_links_stay_siblings():
    md = ('[map](../README.md#course-map) [next](01_the_slowdown.ipynb) [guide](TEACHING.md) '
          '[web](https://example.org/a.md) [here](#top) <img src="fig.png"> [pkg](../kvlab/course.py)')
    assert authoring.workshop_links(md) == (
        '[map](../../README.md#course-map) [next](01_the_slowdown.ipynb) [guide](../TEACHING.md) '
        '[web](https://example.org/a.md) [here](#top) <img src="../fig.png"> [pkg](../../kvlab/course.py)')


# --- the badges and the README send learners to it ------------------------------------------------

@pytest.mark.parametrize("name", FILES, ids=lambda n: n[:2])
def test_the_badges_of_both_editions_open_the_workshop_edition(name):
    assert colab_url(name).endswith(f"/notebooks/{WORKSHOP_DIR}/{name}")
    assert binder_url(name).endswith(f"urlpath=lab/tree/notebooks/{WORKSHOP_DIR}/{name}")
    assert colab_url(name, edition="teacher").endswith(f"/blob/{REPO_REF}/notebooks/{name}")  # for teachers
    for nb in (workshop(name), teacher(name)):
        assert f"({colab_url(name)})" in nb.cells[0].source and f"({binder_url(name)})" in nb.cells[0].source


def test_the_readme_sends_learners_to_the_workshop_edition_and_names_the_teachers_copy():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert course_map_section() in readme
    for name in FILES:
        assert f"](notebooks/{WORKSHOP_DIR}/{name})" in course_map() and f"](notebooks/{name})" not in course_map()
    assert "](notebooks/00_start_here.ipynb)" in course_map_section()  # the teacher's copy, named for teachers
    assert f"jupyter lab notebooks/{WORKSHOP_DIR}/00_start_here.ipynb" in readme
    assert "one at a time" in readme and "Run all* would run it before you guessed" in readme  # no false promise
    from kvlab.authoring import workshop_note

    assert "one at a time" in workshop_note(name) and "Run all is fine" not in workshop_note(name)


def test_pytest_runs_no_notebook_twice():
    """The default run executes each teacher's copy once (tests/test_notebooks.py); nbval collects nothing."""
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "notebooks" not in " ".join(options["testpaths"]) and "nbval" not in options["addopts"]


# --- the teacher's copy keeps its outputs, but no answer shows before a click ---------------------

def gated_outputs(nb):
    """(cell index, output) of every saved prediction comparison and of every verdicts(..., after=...)."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or (".against(" not in cell.source and "after=" not in cell.source):
            continue
        for out in cell.outputs:
            page = out.get("data", {}).get("text/html", "")
            if "kvlab-prediction" in page or "kvlab-claim" in page:
                yield i, out


@pytest.mark.parametrize("name", FILES, ids=lambda n: n[:2])
def test_no_saved_output_shows_a_predictions_answer_outside_a_fold(name):
    assert_answers_folded(name, teacher(name))


def assert_answers_folded(name: str, nb) -> None:
    """Every prediction comparison and every verdicts(..., after=guess) of ``nb`` folded, no number outside."""
    found = list(gated_outputs(nb))
    comparisons = [o for _, o in found if "kvlab-prediction" in o["data"]["text/html"]]
    assert comparisons, f"{name}: no saved prediction comparison (guess.against(...)); run python -m kvlab notebooks"
    for i, out in found:
        plain, page = out["data"].get("text/plain", ""), out["data"]["text/html"]
        hint = f"{name}, cell {i}: saved before the answer was folded? run python -m kvlab notebooks --execute {name[:2]}"
        assert 'class="kvlab-reveal"' in page, f"{hint}\n{page[:300]}"
        assert not re.search(r"\d", plain), f"{hint}: its plain text gives a number away: {plain[:200]!r}"
        visible = shown_without_clicking(page)
        assert not re.search(r"\d", visible), f"{hint}: a number shows before the click: {visible[:200]!r}"
        for measured in MEASURED.findall(page):  # the value itself, as it was formatted
            digits = re.search(r"\d[\d,.]*", measured)
            assert digits and digits.group(0) not in plain + visible, (hint, measured)
