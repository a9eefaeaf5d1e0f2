"""Each notebook has one readable source (notebooks/NN_name.py, jupytext percent) and stays in sync with it.

The committed ``.ipynb`` must hold exactly the cells its source describes (after the shared pieces are
expanded): editing one without the other fails here. ``python -m kvlab notebooks`` brings them back in line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from kvlab import authoring
from kvlab.course import NOTEBOOKS

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
FILES = [n.file for n in NOTEBOOKS]


@pytest.mark.parametrize("name", FILES)
def test_the_committed_notebook_matches_its_source(name):
    notebook = NOTEBOOK_DIR / name
    source = authoring.source_path(notebook)
    assert source.exists(), f"{name} has no source {source.name}; every notebook is written as a percent .py"
    drift = authoring.differences(nbformat.read(notebook, as_version=4), authoring.from_source(source))
    assert not drift, (f"{name} differs from {source.name}:\n" + "\n".join(drift)
                       + "\nedit the source, then run: python -m kvlab notebooks " + name[:2])


@pytest.mark.parametrize("name", FILES)
def test_the_source_reads_as_markdown_and_code(name):
    text = authoring.source_path(NOTEBOOK_DIR / name).read_text(encoding="utf-8")
    assert text.startswith("# %% [markdown]\n# <!-- kvlab:header -->"), "a source opens with the shared header"
    assert "\n# %%\n# kvlab:setup\n" in text, "the setup cell is the shared one"
    assert text.rstrip().endswith("# <!-- kvlab:navigation -->"), "a source ends with the shared navigation"
    compile(text, name, "exec")  # the code cells are plain Python (magics are commented by jupytext)


@pytest.fixture
def workdir(tmp_path):
    """A copy of notebook 00 and its source in a folder of its own.

    The copy forgets the module hashes its outputs were made from, so the tests below see only the
    edits they make, whatever changed in kvlab since the last rebuild (tests/test_notebook_staleness.py
    tests the hashes).
    """
    for suffix in (".ipynb", ".py"):
        shutil.copy(NOTEBOOK_DIR / f"00_start_here{suffix}", tmp_path / f"00_start_here{suffix}")
    nb = nbformat.read(tmp_path / "00_start_here.ipynb", as_version=4)
    if nb.metadata.get("kvlab", {}).pop("sources", None) is not None:
        nbformat.write(nb, tmp_path / "00_start_here.ipynb")
    return tmp_path / "00_start_here.ipynb"


def test_a_notebook_edited_without_its_source_is_caught(workdir):
    nb = nbformat.read(workdir, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and "## 1. Your machine" in c.source)
    cell.source += "\n\nA sentence typed into the notebook in Jupyter."
    nbformat.write(nb, workdir)
    result = authoring.build(workdir, check=True)
    assert result.action == "out of date" and "replace" in result.detail


def test_a_text_edit_changes_only_its_cell_and_keeps_every_output(workdir, monkeypatch):
    monkeypatch.setattr(authoring, "execute", lambda nb, cwd: pytest.fail("a text-only edit must not start a kernel"))
    before = json.loads(workdir.read_text(encoding="utf-8"))
    source = authoring.source_path(workdir)
    text = source.read_text(encoding="utf-8")
    assert "# ## 1. Your machine" in text
    source.write_text(text.replace("# ## 1. Your machine", "# ## 1. The machine you are on"), encoding="utf-8")
    assert authoring.build(workdir).action == "text"
    after = json.loads(workdir.read_text(encoding="utf-8"))
    changed = [i for i, (a, b) in enumerate(zip(before["cells"], after["cells"])) if a != b]
    assert len(before["cells"]) == len(after["cells"]) and len(changed) == 1
    assert after["cells"][changed[0]]["source"][0] == "## 1. The machine you are on\n"
    assert authoring.build(workdir, check=True).action == "unchanged"


def test_a_code_edit_re_executes_the_notebook(workdir, monkeypatch):
    ran = []
    monkeypatch.setattr(authoring, "execute", lambda nb, cwd: ran.append(len(nb.cells)) or 0.0)
    source = authoring.source_path(workdir)
    source.write_text(source.read_text(encoding="utf-8").replace("result.frame.head()", "result.frame.head(3)"),
                      encoding="utf-8")
    assert authoring.build(workdir).action == "executed" and ran


def test_shared_pieces_come_from_the_package(workdir):
    built = authoring.from_source(authoring.source_path(workdir))
    from kvlab.course import header, lesson, navigation, setup_cell

    entry = lesson("00_start_here.ipynb")
    assert built.cells[0].source.startswith(header(entry, "00"))
    assert built.cells[1].source == setup_cell()
    assert built.cells[-1].source == navigation(entry)
    assert any(c.source.startswith("### Exercise 1: ") for c in built.cells)


def test_an_unknown_exercise_directive_names_the_fix(workdir):
    source = authoring.source_path(workdir)
    source.write_text(source.read_text(encoding="utf-8") + "\n# %% [markdown]\n# <!-- kvlab:exercise check_nothing -->\n",
                      encoding="utf-8")
    with pytest.raises(ValueError, match="not registered"):
        authoring.from_source(source)


def test_saved_notebooks_carry_no_widget_state():
    for name in FILES:
        nb = json.loads((NOTEBOOK_DIR / name).read_text(encoding="utf-8"))
        assert "widgets" not in nb["metadata"], f"{name}: run python -m kvlab notebooks {name[:2]} to drop widget state"
