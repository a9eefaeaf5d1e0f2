"""Claims: every measured sentence of the course is checked on a run, and the prose types no measured number.

- every claim of every notebook is checked on the run its notebook showed it on (each notebook executes once per
  session; its example in tests/claim_examples/ where the run did not show it) and listed with its verdict
  (test-artifacts/claims-verdicts.json); a claim on deterministic data that fails, fails here; each wall-clock
  claim is marked false on its counter-example, an edit of that same run;
- every claim a notebook shows is registered, and every registered claim is shown by its notebook;
- no notebook source, exercise text or TEACHING.md line types a number followed by a unit of
  measurement, outside code and outside a labelled authors'-machine example;
- multiple-choice answers are spread over the letters and are not always the longest option.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvlab import authoring
from kvlab.lessons import CLAIMS, Claim, claim, claims_for, verdicts
from kvlab.lessons.common.claims import Verdict
from kvlab.course import NOTEBOOKS
from kvlab.lessons import EXERCISES

from claim_examples import COUNTEREXAMPLES, EXAMPLES, counterexample_of, example_of, module_for
from notebook_run import run_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts"


# --- every claim, with its verdict on this machine -------------------------------------------------

_EXAMPLES: dict = {}


def example_result(c: Claim):
    """The run the claim is checked on: the result its notebook decided it on, in this session's one execution of
    that notebook (tests/notebook_run.py, tests/claim_runs.py); where the notebook did not show it (a condition the
    run did not meet: offline, compile skipped), the claim's example (tests/claim_examples/), made once per
    example function (several claims share one run)."""
    shown = run_notebook(c.notebook).claim_result(c.name)
    if shown is not None:
        return shown
    make = example_of(c)
    if make not in _EXAMPLES:
        _EXAMPLES[make] = make()
    return _EXAMPLES[make]


def failing_deterministic(verdicts_: list[Verdict]) -> list[str]:
    """The deterministic claims among ``verdicts_`` that do not hold (or cannot read their example)."""
    return [f"{v.claim.name}: {v}" for v in verdicts_ if v.claim.clock == "deterministic" and v.holds is not True]


def test_every_claim_has_an_example_and_a_notebook_of_the_course():
    files = {n.file for n in NOTEBOOKS}
    assert CLAIMS, "no claims registered"
    for c in CLAIMS.values():
        assert c.name in EXAMPLES, f"claim {c.name} has no example in {module_for(c)}: the tests cannot check it"
        assert c.notebook in files, f"claim {c.name} belongs to {c.notebook}, which is not in kvlab.course.NOTEBOOKS"


@pytest.mark.notebook_runs
def test_every_claim_with_its_verdict_on_this_machine():
    rows, checked = [], []
    for c in CLAIMS.values():
        v = c.on(example_result(c))
        checked.append(v)
        rows.append({"notebook": c.notebook, "claim": c.name, "clock": c.clock,
                     "verdict": ("shown" if not c.asserts and v.holds is not None
                                 else {True: "holds", False: "does not hold", None: "not checked"}[v.holds]),
                     "text": v.text})
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "claims-verdicts.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    for row in rows:
        print(f"{row['notebook'][:2]} {row['clock']:13s} {row['verdict']:13s} {row['claim']}: {row['text']}")
    assert all(v.holds is not None for v in checked if v.claim.clock == "wall"), \
        [str(v) for v in checked if v.holds is None]
    assert not failing_deterministic(checked)


# A deterministic claim prints the same sentence on every run: tests/test_notebooks.py checks each one the notebooks
# show against the line saved in the committed copy, on the one execution of each notebook.


def test_a_false_claim_on_deterministic_data_is_caught():
    @claim("00_start_here.ipynb", clock="deterministic", says="{n} is even", otherwise="it is odd")
    def three_is_even(n):
        return {"n": n, "holds": n % 2 == 0}

    try:
        v = three_is_even.on(3)
        assert str(v).startswith("✗ not on your run: 3 is even — it is odd")
        assert failing_deterministic([v]) == [f"three_is_even: {v}"]
    finally:
        del CLAIMS["three_is_even"]


def test_a_claim_that_cannot_read_a_run_says_so_instead_of_raising():
    c = Claim("reads_a_column", "00_start_here.ipynb", "{x}", lambda r: {"x": r["missing"], "holds": True},
              "-", "wall")
    v = c.on({})
    assert v.holds is None and "could not read this run" in str(v)
    with pytest.raises(ValueError, match="no claim named"):
        verdicts({}, "no_such_claim")


# --- every wall-clock claim can fail where its sentence is false -----------------------------------

WALL_ASSERTING = [c for c in CLAIMS.values() if c.clock == "wall" and c.asserts]


def test_every_wall_clock_claim_that_asserts_has_a_counterexample_and_only_those_have_one():
    missing = [f"{c.name} ({module_for(c)})" for c in WALL_ASSERTING if c.name not in COUNTEREXAMPLES]
    assert not missing, f"wall-clock claims without a counterexample: {missing}"
    stray = sorted(set(COUNTEREXAMPLES) - {c.name for c in WALL_ASSERTING})
    assert not stray, f"counterexamples of claims that are deterministic or do not assert: {stray}"


@pytest.mark.notebook_runs
@pytest.mark.parametrize("c", WALL_ASSERTING, ids=lambda c: c.name)
def test_a_wall_clock_claim_is_marked_false_on_its_counterexample_and_holds_on_its_example(c):
    """On a run built (or edited) so that the sentence is false, the claim says ✗ (False, not "not checked"),
    and the counter-example leaves the example's own result as it was."""
    import copy

    if c.name not in COUNTEREXAMPLES:
        pytest.fail(f"{c.name} has no counterexample in {module_for(c)}")
    example = example_result(c)
    before = str(c.on(example))
    bad = counterexample_of(c)(copy.deepcopy(example))
    v = c.on(bad)
    assert v.holds is False, f"{c.name} on its counter-example: {v}"
    assert str(v).startswith("✗ not on your run") and "[values" not in v.text, str(v)
    assert str(c.on(example)) == before, f"{c.name}: the counter-example changed the example's own result"
    # On its own example a wall-clock claim is read (✓ or ✗), not asserted to hold: on a machine shared with
    # other programs it fails at the rate scripts/claims_robustness.py records (notebooks/TEACHING.md).
    assert c.on(example).holds is not None, f"{c.name} cannot read its own example: {c.on(example)}"


def test_rises_at_every_level_checks_each_level_with_a_stated_tie():
    from kvlab.lessons.common.checks import TIE, rises_at_every_level, series

    assert rises_at_every_level([0.012, 0.015, 0.030])
    assert not rises_at_every_level([0.012, 0.111, 0.017])  # up then down: the ends alone would say "rises"
    assert rises_at_every_level([0.020, 0.019, 0.040]) and TIE == 0.10  # a 5% dip between light loads: a tie
    assert not rises_at_every_level([0.020, 0.017, 0.040])  # a 15% dip: a fall
    assert not rises_at_every_level([0.020, 0.020, 0.0205])  # no clear rise overall
    assert not rises_at_every_level([0.02])
    with pytest.raises(ValueError, match="tie"):
        rises_at_every_level([1, 2], tie=1.0)
    assert series([0.012, 0.111], "{:.1f}", 1e3) == "12.0 → 111.0"


# --- notebooks and claims name each other ----------------------------------------------------------

_VERDICTS_CALL = re.compile(r"verdicts\(([^)]*)\)", re.S)


def claims_shown(notebook: str) -> set[str]:
    text = authoring.source_path(NOTEBOOK_DIR / notebook).read_text(encoding="utf-8")
    return {name for call in _VERDICTS_CALL.findall(text) for name in re.findall(r'"(\w+)"', call)}


@pytest.mark.parametrize("notebook", [n.file for n in NOTEBOOKS])
def test_the_notebook_shows_exactly_its_registered_claims(notebook):
    shown = claims_shown(notebook)
    registered = {c.name for c in claims_for(notebook)}
    assert shown <= set(CLAIMS), f"{notebook} shows unregistered claims {sorted(shown - set(CLAIMS))}"
    assert not registered - shown, f"{notebook} never shows its claims {sorted(registered - shown)}"
    assert all(CLAIMS[n].notebook == notebook for n in shown), f"{notebook} shows another notebook's claim"


# --- no measured number typed by hand --------------------------------------------------------------

UNIT = r"(?:ms|s|×|x|%|tok/s|tokens/s|req/s|MB|GB|KB|kB|KiB|MiB|GiB|GB/s|MB/s|µs|us)"
MEASURED_NUMBER = re.compile(r"(?<![\w.^/-])\d+(?:[.,]\d+)?\s?" + UNIT + r"(?![\w/])")


def prose_lines(markdown: str) -> list[str]:
    """Lines of ``markdown`` outside fenced code, with inline code spans removed."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return out


def typed_numbers(markdown: str) -> list[str]:
    """Lines that type a number with a unit of measurement, unless labelled as the authors' machine."""
    return [line.strip() for line in prose_lines(markdown)
            if MEASURED_NUMBER.search(line) and "authors' machine" not in line]


def test_the_check_finds_a_typed_measurement_and_spares_code_and_labelled_examples():
    assert typed_numbers("token 194 took 2.5× as long")
    assert typed_numbers("the step took 7.4 ms") and typed_numbers("slower by 1.66–2.27×")
    assert typed_numbers("we measured 40% of requests") and typed_numbers("at 26 req/s")
    assert not typed_numbers("a `max_new_tokens=64` run, `2.5×` in code")
    assert not typed_numbers("```\n7.4 ms\n```")
    assert not typed_numbers("On the authors' machine it took 7.4 ms (`python -m kvlab bench decode`).")
    assert not typed_numbers("a 32-token prompt, 4 slots, 16 tokens per block, 2 layers")


RATE_CELL = re.compile(r"\b\d+/\d+ \(\d+–\d+%\)")


def _course_markdown() -> dict[str, str]:
    texts = {}
    for n in NOTEBOOKS:
        src = authoring.from_source(authoring.source_path(NOTEBOOK_DIR / n.file))
        texts[n.file] = "\n".join(c.source for c in src.cells if c.cell_type == "markdown")
    # The hold rates in TEACHING's claims table are written from the records by scripts/claims_robustness.py
    # (rate_cell: "held/runs (low–high%)"), never typed; tests/test_teaching_record.py checks them against the records.
    texts["TEACHING.md"] = RATE_CELL.sub("", (NOTEBOOK_DIR / "TEACHING.md").read_text(encoding="utf-8"))
    return texts


@pytest.mark.parametrize("name", [n.file for n in NOTEBOOKS] + ["TEACHING.md"])
def test_no_measured_number_is_typed_by_hand(name):
    found = typed_numbers(_course_markdown()[name])
    assert not found, (f"{name} types measured numbers; render them from the run with a claim "
                       f"(kvlab.claims), or label the line as the authors' machine with its command: {found}")


# --- multiple choice -------------------------------------------------------------------------------

def choice_exercises() -> list:
    return [e for e in EXERCISES.values() if isinstance(e.solution, str) and re.fullmatch(r"[a-e]", e.solution)]


def options(question: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^- \*\*([a-e])\*\*[ :]*(.+)$", question, re.M)}


def test_no_letter_holds_more_than_half_of_the_right_answers():
    letters = [e.solution for e in choice_exercises()]
    assert len(letters) >= 3
    top = max(set(letters), key=letters.count)
    assert letters.count(top) <= len(letters) / 2, f"right answers by letter: {sorted(letters)}"


def test_the_right_answer_is_not_always_the_longest_option():
    longest = []
    for e in choice_exercises():
        opts = options(e.question)
        assert e.solution in opts, f"{e.name}: the question lists no option {e.solution!r} ({sorted(opts)})"
        longest.append(max(opts, key=lambda k: len(opts[k])) == e.solution)
    assert not all(longest), "the right answer is the longest option in every multiple-choice question"


# --- the examples' registry, and how scripts/claims_robustness.py counts -----------------------------

def test_an_example_is_registered_by_claim_name_and_a_wrong_name_or_a_second_one_is_refused():
    from claim_examples import example

    with pytest.raises(ValueError, match="no claim has that name"):
        example("no_such_claim")(lambda: 1)
    with pytest.raises(ValueError, match="two examples"):
        example("uncached_tokens_slow_down")(lambda: 1)

    @claim("00_start_here.ipynb", clock="wall", says="{n}", otherwise="-")
    def has_no_example_yet(n):
        return {"n": n, "holds": True}

    try:
        with pytest.raises(LookupError, match=r"tests/claim_examples/l00_start_here\.py"):
            example_of(has_no_example_yet)
    finally:
        del CLAIMS["has_no_example_yet"]


def _claims_robustness():
    """scripts/claims_robustness.py as a module (a maintainer script, not part of the package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("claims_robustness", ROOT / "scripts" / "claims_robustness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["claims_robustness"] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("claims_robustness", None)
    return module


def test_hold_rates_count_fresh_seeded_runs_of_an_example_shared_by_its_claims():
    """The counting alone, quiet (no competing processes are started): seeds 0..runs-1, one fresh run of the
    example per seed for all the claims that read it, held and unreadable runs counted apart."""
    import functools

    robustness = _claims_robustness()
    seeds = []

    @functools.lru_cache(maxsize=4)
    def coin(seed: int = 0) -> int:
        seeds.append(seed)
        return seed

    @claim("00_start_here.ipynb", clock="wall", says="{seed} is even", otherwise="-")
    def seed_is_even(seed):
        return {"seed": seed, "holds": seed % 2 == 0}

    @claim("00_start_here.ipynb", clock="wall", says="read", otherwise="-")
    def seed_is_read(seed):
        return {"holds": None if seed == 2 else True}

    coin(seed=0)  # cached: a fresh run bypasses the cache
    seeds.clear()
    try:
        rates = robustness.hold_rates(["seed_is_even", "seed_is_read"], runs=3, loaded=False,
                                      examples={"seed_is_even": coin, "seed_is_read": coin})
        with pytest.raises(ValueError, match="no example"):
            robustness.hold_rates(["seed_is_even"], loaded=False, examples={})
    finally:
        del CLAIMS["seed_is_even"], CLAIMS["seed_is_read"]
    assert seeds == [0, 1, 2]
    even, read = rates
    assert (even.claim, even.condition, even.runs, even.held, even.unreadable) == ("seed_is_even", "quiet", 3, 2, 0)
    assert even.rate == pytest.approx(2 / 3)
    assert (read.held, read.unreadable) == (2, 1)
    assert robustness.as_records(rates)[0]["rate"] == pytest.approx(2 / 3)


def test_a_notebook_measured_again_replaces_its_runs_and_the_record_says_so():
    """``--notebooks --only 09 --merge``: 09's executions and answers replace the record's, the other notebooks'
    stay, and the teacher's sentence names what was measured again and when; a different number of runs is refused
    (every notebook keeps the same number of executions per condition), and the first loaded runs of some notebooks
    join a quiet record, named with the notebooks they cover."""
    robustness = _claims_robustness()
    cond = [{"condition": "quiet", "processes": 0, "started": "a", "finished": "b", "load_before": 1.0,
             "load_after": 1.0}]

    def run(nb, mark):
        return {"notebook": nb, "condition": "quiet", "run": 0, "claims": {"c": mark}}

    record = {"runs": 1, "conditions": cond, "command": "first", "notebooks": ["00.ipynb", "09.ipynb"],
              "executions": [run("00.ipynb", "✓"), run("09.ipynb", "✗")],
              "predictions": [{"notebook": "00.ipynb"}, {"notebook": "09.ipynb", "old": True}],
              "environment": {"cuda_device": None, "torch_threads": 1, "versions": {"kvlab": "0", "torch": "0"}},
              "cpu_count": 2}
    again = {"runs": 1, "conditions": cond, "command": "again --only 09 --merge", "notebooks": ["09.ipynb"],
             "started": "c", "finished": "d", "executions": [run("09.ipynb", "✓")],
             "predictions": [{"notebook": "09.ipynb"}]}
    out = robustness.merged(record, again)
    assert [e["claims"]["c"] for e in out["executions"]] == ["✓", "✓"]
    assert out["predictions"] == [{"notebook": "00.ipynb"}, {"notebook": "09.ipynb"}]
    assert "09 measured again after a change with `again --only 09 --merge`, from c to d" in \
        robustness.notebook_sentence(out)
    with pytest.raises(SystemExit, match="same number of executions"):
        robustness.merged(record, {**again, "runs": 2})
    loaded = {**cond[0], "condition": "loaded", "processes": 2}
    both = robustness.merged(record, {**again, "conditions": cond + [loaded],
                                      "executions": [run("09.ipynb", "✓"), {**run("09.ipynb", "✓"),
                                                                            "condition": "loaded"}]})
    assert [c["condition"] for c in both["conditions"]] == ["quiet", "loaded"]
    assert both["conditions"][1]["notebooks"] == ["09.ipynb"]
    assert "loaded (2 competing processes) for 09 only" in robustness.notebook_sentence(both)
    assert robustness.notebook_columns(both, "09", "c")[1].startswith("1/1")
    assert robustness.notebook_columns(both, "00", "c")[1] == robustness.NOT_MEASURED
    more = robustness.merged(both, {**again, "notebooks": ["00.ipynb"], "conditions": cond + [loaded],
                                    "executions": [run("00.ipynb", "✓")]})
    assert more["conditions"][1]["notebooks"] == ["00.ipynb", "09.ipynb"]  # the partial condition grows


def test_a_claim_measured_again_replaces_its_rows_and_the_paragraph_says_so():
    robustness = _claims_robustness()
    row = lambda claim, held, cond="quiet": {"claim": claim, "condition": cond, "held": held, "runs": 10,  # noqa: E731
                                            "load_before": 1.0, "load_after": 1.0}
    env = {"cuda_device": None, "torch_threads": 1, "versions": {"kvlab": "0", "torch": "0"}}
    record = {"runs": 10, "started": "a", "finished": "b", "cpu_count": 2, "environment": env,
              "hold_rates": [row("x", 10), row("y", 7), row("y", 5, "loaded")]}
    again = {"runs": 10, "started": "c", "finished": "d", "hold_rates": [row("y", 10), row("y", 9, "loaded")]}
    out = robustness.merged_rates(record, again, ["y"], "python scripts/claims_robustness.py y --merge")
    assert [(r["claim"], r["held"]) for r in out["hold_rates"]] == [("x", 10), ("y", 10), ("y", 9)]
    assert "`y` measured again after a change of rule with `python scripts/claims_robustness.py y --merge`, " \
           "from c to d." in robustness.measured_paragraph(out)
    with pytest.raises(SystemExit, match="--runs 10"):
        robustness.merged_rates(record, {**again, "runs": 3}, ["y"], "")
