"""A notebook's saved outputs are checked against the modules behind them, not only against its source.

An executed notebook records a hash of each file its lesson names (``Lesson.modules`` in kvlab/course.py,
its lesson folder kvlab/lessons/lNN_*/). When its cells are unchanged but one of those files is
not, ``python -m kvlab notebooks`` re-executes it, and ``--check`` names it in a warning line: a
refactor that moves code changes no output, so only ``--check --strict`` fails on it. No kernel starts
here: ``execute`` is replaced, and the decision is tested on temporary copies.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import nbformat
import pytest

from kvlab import authoring
from kvlab.course import lesson

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "00_start_here.ipynb"


def test_the_hash_covers_the_lessons_modules_and_its_claims():
    hashes = authoring.source_hashes("06_under_load.ipynb")
    assert {"kvlab/experiments/service_curves.py", "kvlab/lessons/l06_under_load/figures.py", "kvlab/lessons/l06_under_load/panel.py",
            "kvlab/lessons/l06_under_load/claims.py"} <= set(hashes)
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in hashes.values())
    assert authoring.source_hashes("06_under_load.ipynb") == hashes, "the same files hash the same"


@pytest.fixture
def checkout(tmp_path):
    """A copy of the files behind notebook 00 (its modules and its claims), laid out as in the repository."""
    files = [*authoring.module_files(lesson(NOTEBOOK).modules)]
    for f in files:
        target = tmp_path / f.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, target)
    return tmp_path


def test_editing_a_module_changes_its_hash_and_only_its_own(checkout):
    before = authoring.source_hashes(NOTEBOOK, checkout)
    assert before == authoring.source_hashes(NOTEBOOK), "a copy hashes as the original"
    env = checkout / "kvlab" / "env.py"
    env.write_text(env.read_text(encoding="utf-8") + "\n# a comment\n", encoding="utf-8")
    after = authoring.source_hashes(NOTEBOOK, checkout)
    assert authoring.stale_sources(before, after) == ["kvlab/env.py"]


def test_line_endings_do_not_change_the_hash(checkout):
    before = authoring.source_hashes(NOTEBOOK, checkout)
    env = checkout / "kvlab" / "env.py"
    env.write_bytes(env.read_bytes().replace(b"\n", b"\r\n"))
    assert authoring.source_hashes(NOTEBOOK, checkout) == before


def test_stale_sources_names_changed_added_and_removed_files():
    recorded = {"kvlab/a.py": "1" * 16, "kvlab/b.py": "2" * 16}
    assert authoring.stale_sources(recorded, dict(recorded)) == []
    assert authoring.stale_sources(recorded, {**recorded, "kvlab/b.py": "3" * 16}) == ["kvlab/b.py"]
    assert authoring.stale_sources(recorded, {**recorded, "kvlab/c.py": "4" * 16}) == ["kvlab/c.py"]
    assert authoring.stale_sources(recorded, {"kvlab/a.py": "1" * 16}) == ["kvlab/b.py"]
    assert authoring.stale_sources(None, recorded) == [], "a notebook executed before hashes were recorded is not stale"


def test_an_unknown_module_in_a_lesson_names_the_fix():
    with pytest.raises(ValueError, match=r"'kvlab.nowhere'.*Lesson.modules.*kvlab/nowhere.py"):
        authoring.module_files(("kvlab.nowhere",))


@pytest.fixture
def stale_notebook(tmp_path):
    """A copy of notebook 00 whose recorded hashes say kvlab/env.py changed since its outputs were made."""
    for suffix in (".ipynb", ".py"):
        shutil.copy(ROOT / "notebooks" / f"00_start_here{suffix}", tmp_path / f"00_start_here{suffix}")
    (tmp_path / "workshop").mkdir()  # --check also compares the workshop edition built beside it
    shutil.copy(ROOT / "notebooks" / "workshop" / NOTEBOOK, tmp_path / "workshop" / NOTEBOOK)
    path = tmp_path / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    nb.metadata.setdefault("kvlab", {})["sources"] = {**authoring.source_hashes(NOTEBOOK), "kvlab/env.py": "0" * 16}
    nbformat.write(nb, path)
    return path


def test_a_notebook_older_than_its_modules_is_re_executed_and_records_the_new_hashes(stale_notebook, monkeypatch):
    ran = []
    monkeypatch.setattr(authoring, "execute", lambda nb, cwd: ran.append(1) or 0.0)
    result = authoring.build(stale_notebook)
    assert result.action == "executed" and ran and "kvlab/env.py" in result.detail
    saved = nbformat.read(stale_notebook, as_version=4).metadata["kvlab"]
    assert saved["sources"] == authoring.source_hashes(NOTEBOOK)
    assert authoring.build(stale_notebook, check=True).action == "unchanged"


def test_check_reports_staleness_as_a_warning_and_strict_makes_it_a_failure(stale_notebook, monkeypatch, capsys):
    monkeypatch.setattr(authoring, "execute", lambda nb, cwd: pytest.fail("--check never starts a kernel"))
    monkeypatch.setattr(authoring, "selected", lambda prefixes: [stale_notebook])
    result = authoring.build(stale_notebook, check=True)
    assert result.action == "stale" and result.detail == "outputs older than kvlab/env.py"
    args = argparse.Namespace(only=[], execute=False, check=True, strict=False)
    assert authoring.main(args) == 0
    out, err = capsys.readouterr()
    assert f"{NOTEBOOK}: stale (outputs older than kvlab/env.py)" in out and err.startswith("warning: 1 notebook(s)")
    assert authoring.main(argparse.Namespace(only=[], execute=False, check=True, strict=True)) == 1


def test_every_saved_copy_is_current_with_its_source_and_the_modules_behind_it():
    """``python -m kvlab notebooks --check --strict`` in the default suite: a teacher's copy whose outputs are older
    than a module behind them (a stale run, e.g. after a claim's rule changed) fails here, not in a reader's hands.
    Re-execute with ``python -m kvlab notebooks``."""
    results = [authoring.build(p, check=True) for p in authoring.selected([])]
    results += [authoring.build_workshop(p, check=True) for p in authoring.selected([])]
    stale = [f"{r.notebook}: {r.action} ({r.detail.splitlines()[0] if r.detail else ''})"
             for r in results if r.action != "unchanged"]
    assert not stale, "run python -m kvlab notebooks:\n" + "\n".join(stale)
