"""The course around the notebooks: every notebook opens, teaches and ends the same way; checkers check;
the README's course map, the teacher's guide and the Binder environment stay in step with the code.

Parametrised over the notebooks on disk and the checkers registered in kvlab.lessons, so a new
notebook or exercise is covered without editing this file.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import ipywidgets as widgets
import nbformat
import pandas as pd
import pytest

import kvlab.lessons  # registers every lesson's exercises
import kvlab.lessons.common.exercises as exercises
from kvlab.course import (NOTEBOOKS, binder_url, colab_url, course_map_section, pip_spec, readme_course_map,
                          setup_cell, where)
from kvlab.lessons.common.panel import ExperimentPanel

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
ON_DISK = sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
CHECKER_IMPORT = re.compile(r"from kvlab\.lessons\.l\d\d_\w+\.exercises import ([\w, ()]+)")
DETAILS = re.compile(r"<details>\s*<summary>\s*Solution\s*</summary>(.*?)</details>", re.S)


def load(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def checkers_used(nb) -> list[str]:
    """Checker names imported from a lesson's exercises module by the notebook's code cells, in order."""
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for match in CHECKER_IMPORT.finditer(cell.source):
                names += [n.strip(" ()") for n in match.group(1).split(",") if n.strip(" ()").startswith("check_")]
    return names


# --- the sequence ---------------------------------------------------------------------------------

def test_the_course_lists_exactly_the_notebooks_on_disk_in_order():
    listed = [n.file for n in NOTEBOOKS]
    assert sorted(set(listed)) == sorted(listed), f"a notebook is listed twice in kvlab.course.NOTEBOOKS: {listed}"
    missing = sorted(set(listed) - set(ON_DISK))
    unlisted = sorted(set(ON_DISK) - set(listed))
    assert not missing, f"listed in kvlab.course.NOTEBOOKS but not in notebooks/: {missing}"
    assert not unlisted, f"in notebooks/ but not in kvlab.course.NOTEBOOKS (add a Lesson): {unlisted}"
    assert listed == sorted(listed), f"NOTEBOOKS must follow the numbering of the files: {listed}"
    assert all(n.minutes > 0 and n.title and n.shows for n in NOTEBOOKS)


@pytest.mark.parametrize("entry", NOTEBOOKS, ids=lambda e: e.file[:2])
def test_each_lesson_has_its_folder_and_what_it_names_imports(entry):
    folder = ROOT / Path(*entry.package.split("."))
    assert (folder / "__init__.py").is_file() and (folder / "claims.py").is_file(), (
        f"{entry.file}: its code lives in {folder.relative_to(ROOT)}/ (an __init__.py and claims.py at least)")
    for name in entry.modules:
        assert importlib.util.find_spec(name) is not None, \
            f"{entry.file} names {name}, which does not exist; fix its Lesson in kvlab.course.NOTEBOOKS"
        importlib.import_module(name)


def test_every_lesson_folder_is_a_row_of_the_course():
    import kvlab.lessons

    assert [f"kvlab.lessons.{name}" for name in kvlab.lessons.LESSONS] == [n.package for n in NOTEBOOKS]


# --- every notebook -------------------------------------------------------------------------------

@pytest.fixture(params=ON_DISK)
def notebook(request) -> tuple[str, nbformat.NotebookNode]:
    return request.param, load(request.param)


def test_notebook_opens_with_colab_and_binder_badges(notebook):
    name, nb = notebook
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), f"{name}: cell 0 is the title"
    assert f"({colab_url(name)})" in first.source and "colab-badge.svg" in first.source, f"{name}: Colab badge"
    assert f"({binder_url(name)})" in first.source and "mybinder.org/badge" in first.source, f"{name}: Binder badge"


def test_the_first_code_cell_is_the_setup_cell(notebook):
    name, nb = notebook
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and code[0] is nb.cells[1], f"{name}: the setup cell must come right after the title"
    assert code[0].source == setup_cell(), (f"{name}: the first code cell differs from kvlab.course.setup_cell(); "
                                            "write the cell `# kvlab:setup` in its source")
    outputs = "".join(o.get("text", "") for o in code[0].get("outputs", []))
    assert "device:" in outputs, f"{name}: the saved setup cell should show the device report"


def test_the_setup_cell_installs_the_configured_repository_at_the_ref_the_badges_open():
    from kvlab import course

    cell = setup_cell()
    assert pip_spec() in cell and pip_spec() == f"kvlab[serve] @ git+{course.REPO_URL}@{course.REPO_REF}"
    assert f"/blob/{course.REPO_REF}/notebooks/" in colab_url("00_start_here.ipynb")
    assert f"/{course.REPO_REF}?urlpath=" in binder_url("00_start_here.ipynb")


@pytest.mark.parametrize("env, place", [({"COLAB_RELEASE_TAG": "release-colab"}, "colab"),
                                        ({"BINDER_LAUNCH_HOST": "https://mybinder.org/"}, "binder"), ({}, "local")])
def test_the_setup_report_names_the_place_and_how_to_get_a_gpu(monkeypatch, env, place):
    from kvlab.course import setup_report

    for key in ("COLAB_RELEASE_TAG", "BINDER_LAUNCH_HOST", "BINDER_REQUEST", "BINDER_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KVLAB_DEVICE", "cpu")
    assert where() == place
    report = setup_report()
    assert "device: cpu" in report and "runs on CPU" in report and "Runtime > Change runtime type" in report
    assert ("locally" if place == "local" else place.capitalize()) in report.splitlines()[0]


def test_notebook_ends_with_links_to_the_previous_and_next_notebooks(notebook):
    name, nb = notebook
    files = [n.file for n in NOTEBOOKS]
    if name not in files:
        pytest.skip(f"{name} is not in NOTEBOOKS (reported by the sequence test)")
    i = files.index(name)
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and "**Previous:**" in last.source and "**Next:**" in last.source, \
        f"{name}: the last cell is the navigation (`<!-- kvlab:navigation -->` in its source)"
    if i > 0:
        assert f"]({files[i - 1]})" in last.source, f"{name}: no link back to {files[i - 1]}; regenerate it"
    if i + 1 < len(files):
        assert f"]({files[i + 1]})" in last.source, f"{name}: no link on to {files[i + 1]}; regenerate it"


def test_notebook_runs_on_the_python3_kernel(notebook):
    name, nb = notebook
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{name}: kernelspec name must be python3"


def test_notebook_has_objectives_try_it_and_a_summary(notebook):
    name, nb = notebook
    text = markdown(nb)
    assert "## What you will be able to do" in text, f"{name}: learning objectives"
    assert "Try it" in text, f"{name}: 'Try it' prompts"
    assert "## Summary" in text, f"{name}: a summary"


def test_notebook_has_exercises_with_registered_checkers_and_folded_solutions(notebook):
    name, nb = notebook
    used = checkers_used(nb)
    registered = [e.name for e in exercises.exercises_for(name)]
    assert 1 <= len(used) <= 4, f"{name}: one to four exercises, each calling a checker from its lesson's exercises.py; found {used}"
    unknown = [u for u in used if u not in exercises.EXERCISES]
    assert not unknown, f"{name}: {unknown} not registered in kvlab.lessons (decorate them with @exercise)"
    elsewhere = [u for u in used if exercises.EXERCISES[u].notebook != name]
    assert not elsewhere, f"{name}: {elsewhere} are registered for another notebook"
    assert sorted(registered) == sorted(set(used)), f"{name}: registered {registered} but the notebook uses {used}"
    solutions = DETAILS.findall(markdown(nb))
    assert len(solutions) >= len(used), f"{name}: each exercise needs a folded <details><summary>Solution</summary>"


def test_the_saved_notebook_shows_a_figure_to_readers_who_do_not_run_it(notebook):
    name, nb = notebook
    pngs = sum("image/png" in o.get("data", {}) or "data:image/png;base64," in o.get("data", {}).get("text/html", "")
               for c in nb.cells if c.cell_type == "code" for o in c.outputs)  # shown, or folded until a prediction
    assert pngs >= 1, f"{name}: no saved figure; run its generator with --execute"


PANEL_CELL = re.compile(r"^(\w+) = \w+_panel\(", re.M)


def test_every_panel_also_shows_its_default_run_as_plain_output(notebook):
    # A front end that renders no widgets (Colab with the wrong ipywidgets, a viewer, an old kernel)
    # still teaches the lesson: each panel's default run is shown as a plain table and figure too.
    name, nb = notebook
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        for panel in PANEL_CELL.findall(cell.source):
            later = code[i + 1:]
            shown = next((c for c in later if re.search(rf"{panel}\.run\(.*\)(\.show\(\)|\s*#.*)?", c.source)
                          and (".show()" in c.source or ".fold(" in c.source)), None)
            assert shown is not None, f"{name}: {panel} is never run and shown (result = {panel}.run(); result.show())"
            plain = [o for o in shown.outputs if o.get("output_type") == "display_data"
                     and "application/vnd.jupyter.widget-view+json" not in o.get("data", {})]
            assert any("image/png" in o["data"] or "text/html" in o["data"] for o in plain), \
                f"{name}: the saved cell that shows {panel}'s default run has no plain table or figure"


def machine_paths() -> list[str]:
    here = {str(ROOT), str(Path.home()), sys.prefix, sys.base_prefix, os.getcwd()}
    return sorted((p for p in here if p and p != "/"), key=len, reverse=True)


# A path of some machine: a home or work directory, a temp dir, a virtual environment, a Windows drive.
ANY_MACHINE_PATH = re.compile(r"(?<![\w.:/])(/home/|/Users/|/root/|/tmp/|/private/var/|/work/|/opt/|/srv/|"
                              r"[A-Z]:\\Users\\)|site-packages|\.venv/")


def output_texts(nb):
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            texts = [out.get("text", ""), "\n".join(out.get("traceback", [])), out.get("evalue", "")]
            texts += [v if isinstance(v, str) else "\n".join(v) for k, v in out.get("data", {}).items()
                      if k.startswith("text/") or k == "application/json"]
            yield i, "\n".join(t for t in texts if isinstance(t, str))


def test_no_output_holds_an_absolute_machine_path(notebook):
    name, nb = notebook
    for i, text in output_texts(nb):
        leaked = [p for p in machine_paths() if p in text]
        match = ANY_MACHINE_PATH.search(text)
        assert not leaked and not match, (f"{name}, cell {i}: an output shows a machine path "
                                           f"({leaked or match.group(0)}): {text[:200]!r}")


# --- exercises and their checkers -----------------------------------------------------------------

ALL_EXERCISES = list(exercises.EXERCISES.values())


@pytest.mark.parametrize("ex", ALL_EXERCISES, ids=[e.name for e in ALL_EXERCISES])
def test_checker_confirms_the_solution_and_explains_a_wrong_answer(ex):
    ok = ex.ask(ex.solution)
    assert isinstance(ok, exercises.Feedback) and ok.correct, f"{ex.name} rejects its own solution: {ok}"
    bad = ex.ask(ex.wrong)
    assert isinstance(bad, exercises.Feedback) and not bad.correct, f"{ex.name} accepts the wrong answer {ex.wrong!r}"
    assert len(bad.message) > 20 and bad.message != ok.message, f"{ex.name}: say why it is wrong: {bad.message!r}"
    assert str(bad).startswith("❌") and str(ok).startswith("✅")
    unanswered = ex.check(None)
    assert not unanswered.correct and "None" in unanswered.message


@pytest.mark.parametrize("ex", ALL_EXERCISES, ids=[e.name for e in ALL_EXERCISES])
def test_every_exercise_belongs_to_a_notebook_of_the_course(ex):
    assert ex.notebook in [n.file for n in NOTEBOOKS], f"{ex.name} is registered for {ex.notebook}, not in NOTEBOOKS"


def test_a_checker_never_raises_on_an_answer_it_cannot_use():
    for ex in ALL_EXERCISES:
        for odd in ("nonsense", [], object(), lambda *a, **k: 1 / 0):
            feedback = ex.check(odd)  # also for checkers that need data beside the answer (too few arguments)
            assert isinstance(feedback, exercises.Feedback) and not feedback.correct, (ex.name, odd, feedback)


def test_a_checker_that_prints_and_returns_a_bool_is_shown_as_one_feedback():
    @exercises.exercise("00_start_here.ipynb", solution=2, wrong=3)
    def check_printing_style(answer):
        print("✅ Right: two" if answer == 2 else "❌ Not yet: count again")
        return answer == 2

    try:
        assert check_printing_style(2) == exercises.Feedback(True, "two")
        assert check_printing_style(3) == exercises.Feedback(False, "count again")
    finally:
        del exercises.EXERCISES["check_printing_style"]


@pytest.mark.parametrize("name", ON_DISK)
def test_the_folded_solutions_that_run_on_their_own_pass_their_checkers(name):
    """A solution written as `answer = ...` that needs nothing from the notebook is run and checked."""
    import kvlab

    nb = load(name)
    checked = 0
    for i, cell in enumerate(nb.cells[:-1]):
        used = checkers_used(nbformat.v4.new_notebook(cells=[cell])) if cell.cell_type == "code" else []
        if len(used) != 1 or "answer = None" not in cell.source:
            continue
        solution = next((DETAILS.search(c.source) for c in nb.cells[i + 1:i + 3]
                         if c.cell_type == "markdown" and DETAILS.search(c.source)), None)
        code = re.search(r"```python\n(.*?)```", solution.group(1), re.S) if solution else None
        if code is None:
            continue
        namespace = {"kvlab": kvlab}
        try:
            exec(code.group(1), namespace)  # noqa: S102 - the notebook's own solution
        except NameError:  # a later line needs the notebook's state; `answer` may already be set
            pass
        if "answer" in namespace:
            feedback = exercises.EXERCISES[used[0]].check(namespace["answer"])
            assert feedback.correct, f"{name}: the folded solution of {used[0]} fails its checker: {feedback}"
            checked += 1
    if checked == 0:
        pytest.skip(f"{name}: no self-contained `answer = ...` solution")


# --- widgets that behave ----------------------------------------------------------------------------

def test_panels_carry_the_classes_the_browser_tests_press():
    panel = ExperimentPanel({"n": widgets.IntSlider(value=2, min=1, max=3)},
                            lambda progress, n: pd.DataFrame({"n": [n]}))
    assert "kvlab-panel" in panel.widget._dom_classes and "kvlab-run" in panel.button._dom_classes
    assert "kvlab-output" in panel.output._dom_classes and "kvlab-status" in panel.status._dom_classes


def test_an_interrupted_run_says_so_in_the_panel_and_keeps_nothing():
    def interrupted(progress, n):
        for _ in progress(range(3), total=3):
            raise KeyboardInterrupt

    panel = ExperimentPanel({"n": widgets.IntSlider(value=2, min=1, max=3)}, interrupted)
    with pytest.raises(KeyboardInterrupt):
        panel.run()
    assert "Interrupt" in panel.error and not panel.cache and not panel.button.disabled
    assert [o["data"]["text/plain"] for o in panel.output.outputs] == [f"⚠ {panel.error}"]


# --- the README's course map and the teacher's guide ------------------------------------------------

def test_the_readme_course_map_matches_the_notebook_list():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme_course_map(readme)
    assert section is not None, "README.md has no '## Course map' section: run python scripts/course_map.py"
    assert section == course_map_section(), ("README.md's course map differs from kvlab.course.NOTEBOOKS: "
                                             "run python scripts/course_map.py")


def test_the_teaching_guide_covers_every_notebook_and_the_misconceptions():
    guide = (NOTEBOOK_DIR / "TEACHING.md").read_text(encoding="utf-8")
    for n in NOTEBOOKS:
        assert n.file in guide, f"notebooks/TEACHING.md does not mention {n.file}"
    for heading in ("90-minute", "half-day", "Binder", "Colab"):
        assert heading.lower() in guide.lower(), f"TEACHING.md: no {heading!r} section"
    for misconception in ("not a response cache", "throughput is not latency", "quantized cache is not free"):
        assert misconception in guide.lower(), f"TEACHING.md: the misconception {misconception!r}"


# --- Binder ------------------------------------------------------------------------------------------

def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.txt pins every package with ==, not {line!r}"
            pins[name.strip().lower()] = version.strip()
    return pins


def binder_pins() -> tuple[dict[str, str], dict[str, str]]:
    """(conda packages, pip packages) of binder/environment.yml, name -> version."""
    import yaml

    env = yaml.safe_load((ROOT / "binder" / "environment.yml").read_text())
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for spec in dep.get("pip", []):
                name, sep, version = spec.partition("==")
                assert sep, f"binder/environment.yml: pin pip package {spec!r} with =="
                pip[name.strip().lower()] = version.strip()
        else:
            name, _, version = dep.partition("=")
            conda[name.strip().lower()] = version.lstrip("=").strip()
    return conda, pip


def test_binder_pins_agree_with_requirements():
    req = requirement_pins()
    conda, pip = binder_pins()
    assert conda.get("pytorch-cpu") == req["torch"], "binder's pytorch-cpu must be requirements.txt's torch (CPU build)"
    assert "torch" not in pip and "pytorch" not in conda, "Binder takes torch from conda-forge's pytorch-cpu only"
    differ = {n: (v, req[n]) for n, v in pip.items() if n in req and v != req[n]}
    assert not differ, f"binder/environment.yml vs requirements.txt (binder, requirements): {differ}"


@pytest.mark.full
def test_binder_pins_a_notebook_whose_own_requirements_admit_the_pinned_jupyterlab(tmp_path):
    """repo2docker's base environment has a Jupyter Notebook of its own (7.4.7, which requires jupyterlab < 4.5); the
    pinned notebook replaces it, and its own Requires-Dist (read from its wheel on the index) admits the pinned
    jupyterlab and jupyter-server, so pip installs Binder's environment without a conflict."""
    import subprocess
    import sys
    import zipfile

    from packaging.requirements import Requirement

    _, pip = binder_pins()
    assert "notebook" in pip, "binder/environment.yml must pin notebook beside jupyterlab (repo2docker ships one)"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp_path,
                    f"notebook=={pip['notebook']}"], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("notebook-*.whl")
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("METADATA"))
    needs = [Requirement(line.split(":", 1)[1].strip()) for line in
             zipfile.ZipFile(wheel).read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    refused = [str(r) for r in needs if r.marker is None and r.name.lower() in pip
               and not r.specifier.contains(pip[r.name.lower()], prereleases=True)]
    assert not refused, f"notebook {pip['notebook']} refuses Binder's pins: {refused}"


def test_binder_has_everything_kvlab_imports_and_widgets_for_jupyterlab_4():
    import tomllib

    conda, pip = binder_pins()
    have = set(pip) | set(conda) | {"torch"}  # pytorch-cpu provides torch
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {re.split(r"[<>=!~ \[]", d)[0].lower() for d in project["dependencies"]}
    assert needed <= have, f"postBuild installs kvlab with --no-deps, so binder needs {sorted(needed - have)}"
    # ipywidgets 8 brings jupyterlab_widgets, a prebuilt JupyterLab 4 extension: no build step, no npm.
    assert pip["jupyterlab"].split(".")[0] == "4" and pip["ipywidgets"].split(".")[0] == "8"
    assert "ipykernel" in pip
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install" in post and "-e ." in post and "--no-deps" in post
    assert "jupyter labextension" not in post and "jupyter lab build" not in post


def test_notebook_00s_table_quotes_no_run_time_that_a_later_build_would_make_stale():
    from kvlab.course import course_map

    plain, timed = course_map(link_prefix="", run_times=False), course_map(link_prefix="")
    assert "run time" not in plain and "run time" in timed
    assert len(plain.splitlines()) == len(timed.splitlines()) == len(NOTEBOOKS) + 3
    assert all(f"[{n.title}]({n.file})" in plain for n in NOTEBOOKS)
    assert f"**{sum(n.minutes for n in NOTEBOOKS)}**" in plain
