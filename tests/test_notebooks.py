"""Every notebook, executed once, and every check made on that one run.

Each notebook's teacher's copy runs top to bottom once per session (``tests/notebook_run.py``), and
these tests read that run: it raised nothing; every cell marked ``# NBVAL_CHECK_OUTPUT`` (a
deterministic output: virtual clocks, counts, byte formulas) shows what the committed copy shows,
compared as nbval compares; each ``verdicts(...)`` call shows one line per claim it names and every
claim could read the run; each panel's default run is also shown as a plain table or figure (the
static view, for a renderer without widgets); no answer to a prediction shows outside its fold; no
output holds a path of this machine. The workshop edition has the same code cells and no outputs
(``tests/test_workshop_edition.py``), so it is not run again. The run times go to
``test-artifacts/notebook-times.json`` (a record: these machines are too noisy for a timed test).
"""
from __future__ import annotations

import html
import json
import re

import pytest

from kvlab.course import NOTEBOOKS
from kvlab.lessons import CLAIMS
from kvlab.teachers_key import MEASURED  # the answer a prediction's fold hides

from notebook_run import CHECK_OUTPUT, compare_outputs, run_notebook
from test_course import ANY_MACHINE_PATH, PANEL_CELL, machine_paths, output_texts
from test_workshop_edition import assert_answers_folded

pytestmark = pytest.mark.notebook_runs  # each test reads the run of the notebook it is parametrised on
FILES = [n.file for n in NOTEBOOKS]
VERDICTS_CALL = re.compile(r"verdicts\(([^)]*)\)", re.S)
CLAIM_LINE = re.compile(r'<div class="kvlab-claim"')
CLAIM_TEXT = re.compile(r'<div class="kvlab-claim"[^>]*>(.*?)</div>', re.S)


@pytest.fixture(scope="module", params=FILES, ids=lambda n: n[:2])
def run(request):
    return run_notebook(request.param)


def test_the_notebook_runs_top_to_bottom_without_an_error(run):
    assert not run.errors, f"{run.name}: " + "; ".join(run.errors)


def test_deterministic_outputs_are_the_saved_ones(run):
    checked = [(i, s, e) for i, (s, e) in enumerate(run.code_cells()) if CHECK_OUTPUT in s.source]
    if not checked:
        pytest.skip(f"{run.name} marks no output as deterministic")
    differ = [f"code cell {i}:\n" + "\n".join(problems) for i, s, e in checked
              if (problems := compare_outputs(s.outputs, e.outputs))]
    assert not differ, (f"{run.name}: outputs differ from the committed copy (a change of behaviour, or the copy "
                        f"is stale: python -m kvlab notebooks --execute {run.name[:2]}):\n" + "\n\n".join(differ))


def test_each_verdicts_call_shows_a_line_per_claim_and_every_claim_reads_the_run(run):
    for i, (_, cell) in enumerate(run.code_cells()):
        for call in VERDICTS_CALL.findall(cell.source):
            named = re.findall(r'"(\w+)"', call)
            page = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
            line = next(ln for ln in cell.source.splitlines() if "verdicts(" in ln)
            if line.startswith((" ", "\t")) and not CLAIM_LINE.search(page):
                continue  # shown under a condition the run did not meet (offline, compile skipped): said in the cell
            assert len(CLAIM_LINE.findall(page)) >= len(named), (
                f"{run.name}, code cell {i}: verdicts of {named} show {len(CLAIM_LINE.findall(page))} lines")
            assert "could not read this run" not in page, (
                f"{run.name}, code cell {i}: a claim cannot read the experiment's result: {page[:600]}")


def test_each_panels_default_run_is_shown_without_widgets(run):
    code = [cell for _, cell in run.code_cells()]
    for i, cell in enumerate(code):
        for panel in PANEL_CELL.findall(cell.source):
            shown = next((c for c in code[i + 1:] if f"{panel}.run(" in c.source and (".show()" in c.source or ".fold(" in c.source)), None)
            assert shown is not None, f"{run.name}: {panel} is never run and shown (result = {panel}.run(); result.show())"
            plain = [o for o in shown.outputs if o.get("output_type") == "display_data"
                     and "application/vnd.jupyter.widget-view+json" not in o.get("data", {})]
            assert any("image/png" in o["data"] or "text/html" in o["data"] for o in plain), \
                f"{run.name}: the cell that shows {panel}'s default run shows no plain table or figure"


def test_no_answer_shows_before_its_prediction(run):
    assert_answers_folded(run.name, run.executed)


def test_no_output_holds_a_path_of_this_machine(run):
    for i, text in output_texts(run.executed):
        leaked = [p for p in machine_paths() if p in text]
        match = ANY_MACHINE_PATH.search(text)
        assert not leaked and not match, (f"{run.name}, cell {i}: an output shows a machine path "
                                           f"({leaked or match.group(0)}): {text[:200]!r}")


def test_every_deterministic_claim_says_what_the_committed_copy_says(run):
    """Virtual clocks, counts and byte formulas: the same sentence on this run as on the authors' (line by line)."""
    checked = 0
    for i, (saved, cell) in enumerate(run.code_cells()):
        for call in VERDICTS_CALL.findall(cell.source):
            named = re.findall(r'"(\w+)"', call)
            ours = [t for o in cell.outputs for t in CLAIM_TEXT.findall(o.get("data", {}).get("text/html", ""))]
            theirs = [t for o in saved.outputs for t in CLAIM_TEXT.findall(o.get("data", {}).get("text/html", ""))]
            if len(VERDICTS_CALL.findall(cell.source)) != 1 or len(ours) != len(named) or len(theirs) != len(named):
                continue  # several calls in one cell, or a conditional one: lines cannot be matched to names
            for name, mine, saved_line in zip(named, ours, theirs):
                if CLAIMS[name].clock == "deterministic":
                    checked += 1
                    assert mine == saved_line, f"{run.name}, code cell {i}, {name}:\n saved: {saved_line}\n   run: {mine}"
    if not checked:
        pytest.skip(f"{run.name} shows no deterministic claim in a cell of its own")


def answer_needles(measured: str) -> tuple[list[str], list[str]]:
    """What would give ``measured`` away: (its text as shown, searched everywhere before the guess; its number alone
    when that is specific enough and its rounding as a legend rounds it, searched in the prediction's own section).

    A bare "3.3" or "175" in another section's experiment is another quantity that happens to share digits (04's
    p95/mean ratio of 3.3× beside its Chinese/English tokens of 3.32×); in the section that asks, it is the answer.
    """
    shown = html.unescape(measured).strip()
    number = re.search(r"\d[\d,]*(?:\.\d+)?", shown)
    near = []
    if number and len(number.group(0).replace(",", "").replace(".", "")) >= 3:  # "175" or "3.72", not "2"
        near.append(number.group(0))
    if number and "." in number.group(0):  # rounded as a legend rounds it: 4.26× is "4.3×" there
        unit = shown[number.end():].strip()
        rounded = f"{float(number.group(0).replace(',', '')):.1f}"
        near += [f"{rounded}{unit}", f"{rounded} {unit}"] if unit else []
    return [shown], near


def section_start(cells, index: int) -> int:
    """The cell that opens the section (a ``## `` heading, or the notebook's top) holding cell ``index``."""
    for i in range(index, -1, -1):
        if cells[i].cell_type == "markdown" and re.search(r"^##\s", cells[i].source, re.M):
            return i
    return 0


def test_nothing_before_a_prediction_states_its_answer(run):
    """Each prediction's answer, as this run measured it, shows nowhere before the learner can have typed a guess.

    Run All runs past the empty box, so everything from the top of the notebook to the cell that compares the
    guess (``guess.against(...)``) is seen first: every output outside a fold, and the text inside every figure.
    The answer as shown is looked for from the top; its bare number and roundings from the section that asks.
    """
    cells = run.executed.cells
    for j, cell in enumerate(cells):
        if cell.cell_type != "code" or ".against(" not in cell.source:
            continue
        var = re.search(r"(\w+)\.against\(", cell.source).group(1)
        asked = [i for i, c in enumerate(cells[:j + 1]) if c.cell_type == "code"
                 and re.search(rf"^{var}\s*=\s*predict\(", c.source, re.M)]
        assert asked, f"{run.name}: {var}.against(...) in cell {j} but no `{var} = predict(...)` before it"
        answers = [m for o in cell.outputs for m in MEASURED.findall(o.get("data", {}).get("text/html", ""))]
        start = section_start(cells, asked[-1])
        for measured in answers:
            everywhere, near = answer_needles(measured)
            for needle, first in [(n, 0) for n in everywhere] + [(n, start) for n in near]:
                pattern = re.compile(rf"(?<![\d.]){re.escape(needle)}(?![\d])")
                leaks = [(i, t) for i, t in run.shown_before(j + 1) if i >= first and pattern.search(t)]
                assert not leaks, (f"{run.name}: the answer to {var} (asked in cell {asked[-1]}, compared in cell "
                                   f"{j}), {measured!r}, shows unfolded in cell {leaks[0][0]}: "
                                   f"...{leaks[0][1][:300]!r}")


PROVENANCE = re.compile(r'<div class="kvlab-prediction" data-asked-ago="(-?\d*)" data-produced-ago="(-?\d*)" '
                        r'data-inputs="([^"]*)"')


def code_cell_back(cells, j: int, ago: int) -> int:
    """The index of the code cell ``ago`` cells run before cell ``j`` (a kernel runs no empty cell); -1 before all."""
    ran = [i for i, c in enumerate(cells[:j + 1]) if c.cell_type == "code" and c.source.strip()]
    return ran[-1 - ago] if 0 <= ago < len(ran) else -1


def input_needles(value: float) -> list[str]:
    """How a number an answer is computed from would show: as an integer, or to 3 significant figures and to 1 and
    2 decimals; only forms of at least 3 digits (a bare "4" is every other number's digit)."""
    forms = {f"{value:,.0f}", f"{value:.0f}"} if float(value).is_integer() else {
        f"{value:.3g}", f"{value:.2f}", f"{value:.1f}"}
    return sorted(f for f in forms if len(re.sub(r"\D", "", f)) >= 3)


def test_every_prediction_is_asked_before_the_experiment_that_answers_it(run):
    """By construction: ``guess.against(result, measure)`` notes the cell that asked and the cell whose experiment
    produced ``result`` (kvlab.provenance); the result must come after the question. And nothing
    shown before the question states a number the answer is computed from (the ``measure``'s inputs)."""
    cells = run.executed.cells
    found = 0
    for j, cell in enumerate(cells):
        for out in cell.get("outputs", []):
            page = out.get("data", {}).get("text/html", "")
            if "kvlab-prediction" not in page:
                continue
            m = PROVENANCE.search(page)
            assert m and m.group(1) and m.group(2), (
                f"{run.name}, cell {j}: a prediction compared without its experiment's result; write "
                f"guess.against(result, measure) with a result from an @experiment")
            asked, made = code_cell_back(cells, j, int(m.group(1))), code_cell_back(cells, j, int(m.group(2)))
            assert asked >= 0 and made >= 0, f"{run.name}, cell {j}: {m.group(0)} points before the first cell"
            assert made > asked, (f"{run.name}: the result compared in cell {j} was produced in cell {made}, "
                                  f"before its question was asked in cell {asked}")
            inputs = json.loads(html.unescape(m.group(3)))
            for name, value in inputs.items():
                for needle in input_needles(float(value)):
                    pattern = re.compile(rf"(?<![\d.]){re.escape(needle)}(?![\d])")
                    leaks = [(i, t) for i, t in run.shown_before(asked) if pattern.search(t)]
                    assert not leaks, (f"{run.name}: {name} = {needle}, from which the answer compared in cell {j} "
                                       f"is computed, shows in cell {leaks[0][0]} before the question (cell {asked}): "
                                       f"...{leaks[0][1][:300]!r}")
            found += 1
    if not found:
        pytest.skip(f"{run.name} asks no prediction")
