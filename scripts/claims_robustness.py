"""How often each wall-clock claim of the notebooks holds: repeated runs with several seeds, quiet and with every
core busy.

A claim on measured time states a qualitative fact with a margin. Whether that margin is wide enough is itself a
measurement: this script re-runs each claim's example (tests/claim_examples/), quiet and with CPU-bound processes
competing for every core, and counts the runs in which the claim held. A measurement, so a script: no test runs it.

    python scripts/claims_robustness.py                          # 3 runs each, quiet and loaded
    python scripts/claims_robustness.py --runs 5 --json results/claims_robustness.json
    python scripts/claims_robustness.py --quiet-only uncached_tokens_slow_down
    python scripts/claims_robustness.py --json notebooks/claims_hold_rates.json --teaching   # the course's record
    python scripts/claims_robustness.py --teaching                # TEACHING.md rewritten from the committed record
    python scripts/claims_robustness.py --notebooks --runs 2      # the teacher's key's ranges (every notebook)
    python scripts/claims_robustness.py --notebooks --runs 1 --only 00 03 --json results/key_ranges.json
    python scripts/claims_robustness.py --notebooks --runs 10 --quiet-only --only 09 --merge   # 09 again, in the record
    python scripts/claims_robustness.py some_claim --runs 10 --json notebooks/claims_hold_rates.json --merge --teaching

Prints one line per claim and condition with the load average before and after (on a shared machine "quiet"
means only that this script started no competing processes); the JSON also records kvlab's version, the
device, threads, the core count and when it ran. Run it from a checkout: the examples are test fixtures.

The course keeps one such record, ``notebooks/claims_hold_rates.json``; ``--teaching`` writes its figures into
notebooks/TEACHING.md (the paragraph between the ``kvlab:hold-rates`` markers and the columns "example runs
quiet / loaded" of the table of claims), and those of ``notebooks/key_ranges.json`` (below) into its columns "in
the notebook quiet / loaded" and the paragraph's last sentence, so the rates a teacher reads are the ones
measured, never typed. tests/test_teaching_record.py checks that they agree.

``--notebooks`` measures the predictions instead of the claims: it executes each teacher's copy
(``notebooks/NN_name.ipynb``, top to bottom in a fresh kernel of this interpreter, working directory notebooks/,
as a learner's Run All; the copy on disk is never written) ``--runs`` times quiet and as many times loaded, and
reads from each run every prediction's answer (``kvlab.teachers_key.predictions``) and the marks of its claim
lines (✓ ✗ • ·): per execution ``claim_marks`` (how many lines show each mark), ``not_holding`` (the ✗ lines'
text) and ``claims`` ({claim name: mark}, recorded inside the kernel by tests/claim_runs.py, the tests' own
wrapper of ``verdicts(...)``). It writes the record ``notebooks/key_ranges.json`` (or ``--json``): each
prediction's answers of every run, quiet and loaded apart, with the same machine, dates and load averages as the
hold rates and the command that measured them, and rewrites notebooks/KEY.md (the range beside each authors'
answer) and TEACHING.md's notebook columns from it: held/runs, the runs of the claim's notebook whose line for it
said ✓; "shown (•)" where it was an observation; — where the record did not measure that notebook or claim (or
predates ``claims``). With ``--only`` the record holds those notebooks alone, replacing a record of every
notebook (give ``--json`` to keep that one); the key says "not measured" for the others.
"""
from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's kvlab, installed or not
sys.path.insert(0, str(ROOT / "tests"))  # the claims' examples (tests/claim_examples)

from kvlab.lessons import CLAIMS, Claim  # noqa: E402


def _spin(stop_at: float, parent: int | None = None) -> None:  # a CPU-bound competitor: pure Python arithmetic
    x = 0  # until told to stop, or until the script that started it is gone (``parent``: its process id)
    while time.time() < stop_at and (parent is None or os.getppid() == parent):
        for i in range(10_000):
            x += i * i


@contextmanager
def competing_load(processes: int | None = None, max_s: float = 600.0) -> Iterator[int]:
    """CPU-bound processes, one per core by default, busy for the duration of the block (at most ``max_s``)."""
    n = processes or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(time.time() + max_s, os.getpid()), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield n
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(timeout=5)


def fresh_example(make: Callable[..., Any], seed: int) -> Any:
    """Run an example anew (bypassing any lru_cache), with ``seed`` when it takes one."""
    make = inspect.unwrap(make)
    try:
        takes_seed = "seed" in inspect.signature(make).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return make(seed=seed) if takes_seed else make()


@dataclass
class HoldRate:
    claim: str
    notebook: str
    condition: str  # "quiet" or "loaded (N competing processes)"
    runs: int
    held: int
    unreadable: int
    seconds: float  # run time of the example, shared among the claims that read it
    load_before: float = float("nan")  # the machine's 1-minute load average before and after this condition's runs
    load_after: float = float("nan")  # (other users' programs count too: "quiet" is only as quiet as the machine)

    @property
    def rate(self) -> float:
        return self.held / self.runs if self.runs else float("nan")


def hold_rates(names: list[str] | None = None, runs: int = 3, loaded: bool = True,
               progress: Callable[[str], None] | None = None,
               examples: Mapping[str, Callable[..., Any]] | None = None) -> list[HoldRate]:
    """For each wall-clock claim that asserts (or ``names``): runs with seeds 0..runs-1, quiet and (``loaded``)
    under load. ``examples``: claim name -> example (default: tests/claim_examples)."""
    if examples is None:
        from claim_examples import EXAMPLES as examples
    claims = ([CLAIMS[n] for n in names] if names
              else [c for c in CLAIMS.values() if c.clock == "wall" and c.asserts])  # observations cannot fail
    missing = [c.name for c in claims if c.name not in examples]
    if missing:
        raise ValueError(f"claims {missing} have no example to run; write one in tests/claim_examples/")
    conditions = [("quiet", None)] + ([("loaded", os.cpu_count() or 1)] if loaded else [])
    by_example: dict[Callable, list[Claim]] = {}  # claims that read the same example share each fresh run of it
    for c in claims:
        by_example.setdefault(examples[c.name], []).append(c)
    out = []
    for label, procs in conditions:
        with (competing_load(procs) if procs else nullcontext()) as n:
            condition = f"loaded ({n} competing processes)" if procs else "quiet"
            load_before, first = load_average(), len(out)
            for make, group in by_example.items():
                start = time.perf_counter()
                held = {c.name: 0 for c in group}
                unreadable = {c.name: 0 for c in group}
                for seed in range(runs):
                    result = fresh_example(make, seed)
                    for c in group:
                        v = c.on(result)
                        held[c.name] += v.holds is True
                        unreadable[c.name] += v.holds is None
                seconds = (time.perf_counter() - start) / len(group)
                for c in group:
                    out.append(HoldRate(c.name, c.notebook, condition, runs, held[c.name], unreadable[c.name],
                                        seconds))
                    if progress:
                        progress(f"{c.name} [{condition}]: held {held[c.name]}/{runs}")
            load_after = load_average()
            for r in out[first:]:
                r.load_before, r.load_after = load_before, load_after
            if progress:
                progress(f"[{condition}] load average {load_before:.2f} before, {load_after:.2f} after")
    return out


def load_average() -> float:
    """The machine's 1-minute load average (runnable processes, all users), NaN where the system has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return float("nan")


def as_records(rates: list[HoldRate]) -> list[dict]:
    return [dict(asdict(r), rate=r.rate) for r in rates]


# -- the record in TEACHING.md -------------------------------------------------------------------------
TEACHING = ROOT / "notebooks" / "TEACHING.md"
RECORD = ROOT / "notebooks" / "claims_hold_rates.json"
BEGIN, END = "<!-- kvlab:hold-rates -->", "<!-- /kvlab:hold-rates -->"
# a row of the table of claims: name, notebook, example runs quiet | loaded, in the notebook quiet | loaded, the rest
ROW = re.compile(r"^\| `(\w+)` \| (\d\d) \| ([^|]*) \| ([^|]*) \| ([^|]*) \| ([^|]*) \|(.*)$")
NOT_MEASURED = "—"


def _loads(report: dict, quiet: bool) -> tuple[float, float]:
    rows = [r for r in report["hold_rates"] if (r["condition"] == "quiet") == quiet]
    return (rows[0]["load_before"], rows[0]["load_after"]) if rows else (float("nan"), float("nan"))


def _machine(report: dict) -> str:
    env = report["environment"]
    device = "CUDA " + env["cuda_device"] if env.get("cuda_device") else "CPU PyTorch"
    cpu = f", {env['cpu']}" if env.get("cpu") else ""
    return (f"a machine with {report['cpu_count']} CPU cores{cpu} and {device} ({env['torch_threads']} torch threads, "
            f"kvlab {env['versions']['kvlab']}, torch {env['versions']['torch']})")


def _elsewhere(report: dict, again: dict) -> str:
    """" on <CPU>" when a measurement again ran on another CPU than the record's first (the record mixes machines)."""
    cpu = again.get("cpu")
    return f" on {cpu}" if cpu and cpu != report.get("environment", {}).get("cpu") else ""


def measured_paragraph(report: dict, key: dict | None = None,
                       record: str = "notebooks/claims_hold_rates.json") -> str:
    """The paragraph saying when, where and how the records were measured, from the records themselves: the
    examples' (``report``), then in one sentence the notebooks' (``key``, notebooks/key_ranges.json)."""
    runs = report["runs"]
    qb, qa = _loads(report, True)
    lb, la = _loads(report, False)
    return (f"**How often each claim holds.** Measured from {report['started']} to {report['finished']} with\n"
            f"`python scripts/claims_robustness.py --runs {runs} --json {record} --teaching`\n"
            f"on {_machine(report)}: each claim's example re-run with "
            f"seeds 0 to {runs - 1}, first \"quiet\" (no competing processes started by the script), then \"loaded\" "
            f"(one CPU-bound competing process per core). Its 1-minute load average was {qb:.2f} before and "
            f"{qa:.2f} after the quiet runs, {lb:.2f} and {la:.2f} around the loaded ones (other programs on the "
            f"machine count too: \"quiet\" is only as quiet as the machine was)."
            + "".join(f" {', '.join(f'`{c}`' for c in r['claims'])} measured again after a change of rule with "
                      f"`{r['command']}`, from {r['started']} to {r['finished']}{_elsewhere(report, r)}."
                      for r in report.get("remeasured", []))
            + f"\n{notebook_sentence(key)}")


def notebook_sentence(key: dict | None) -> str:
    """Where the columns "in the notebook" come from: the command, dates and load averages of ``key``."""
    if key is None:
        return f"The columns \"in the notebook\" say {NOT_MEASURED}: there is no record notebooks/key_ranges.json."
    around = "; ".join(f"{c['condition']}" + (f" ({c['processes']} competing processes)" if c["processes"] else "")
                       + (f" for {', '.join(n[:2] for n in c['notebooks'])} only" if c.get("notebooks") else "")
                       + f" from {c['started']} to {c['finished']}, load average {c['load_before']:.2f} before and "
                         f"{c['load_after']:.2f} after" for c in key["conditions"])
    kept = any("claims" in e for e in key["executions"])
    quiet_only = all(c["condition"] == "quiet" for c in key["conditions"])
    return (f"The columns \"in the notebook\" count the executions of each teacher's notebook itself (top to bottom "
            f"in a fresh kernel, as a learner's Run All) in which the claim's line said ✓, from "
            f"`notebooks/key_ranges.json`, measured with `{key['command']}` on {_machine(key)}, {key['runs']} "
            f"run{'s' if key['runs'] != 1 else ''} of each notebook per condition: {around}"
            + (" (never under competing load: beside one CPU-bound process per core a Run All takes many times a "
               "quiet one, so every notebook that often is hours; the loaded rates are the examples')"
               if quiet_only else "")
            + "".join(f"; {', '.join(n[:2] for n in r['notebooks'])} measured again after a change with "
                      f"`{r['command']}`, from {r['started']} to {r['finished']}{_elsewhere(key, r)}"
                      for r in key.get("remeasured", []))
            + (f"; {NOT_MEASURED} where it did not measure the notebook or the claim." if kept else
               f". That record predates the script's recording of each line's claim, so they say {NOT_MEASURED} until "
               f"it is measured again."))


def wilson(held: int, runs: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a hold rate of ``held`` in ``runs``: honest at 0/n and n/n."""
    if runs <= 0:
        return 0.0, 1.0
    p = held / runs
    centre = (p + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * ((p * (1 - p) / runs + z * z / (4 * runs * runs)) ** 0.5) / (1 + z * z / runs)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_cell(held: int, runs: int) -> str:
    """A hold rate as TEACHING.md's table shows it: "held/runs (low–high%)", the Wilson 95% interval."""
    low, high = wilson(held, runs)
    return f"{held}/{runs} ({100 * low:.0f}–{100 * high:.0f}%)"


def held_columns(report: dict) -> dict[str, tuple[str, str]]:
    """{claim: ("held/runs (interval)" quiet, loaded)} of the record."""
    out: dict[str, list[str]] = {}
    for r in report["hold_rates"]:
        cols = out.setdefault(r["claim"], ["", ""])
        cols[r["condition"] != "quiet"] = rate_cell(r["held"], r["runs"])
    return {k: (v[0], v[1]) for k, v in out.items()}


def notebook_columns(key: dict | None, notebook: str, claim: str) -> tuple[str, str]:
    """("held/runs" quiet, loaded) of ``claim`` over the executions of ``notebook`` (its number, "01") in the record
    ``key`` that kept each line's claim: the runs whose line for it said ✓, of them all; "shown (•)" where it was
    an observation each time; — where none measured it."""
    out = []
    for condition in ("quiet", "loaded"):
        runs = [e["claims"] for e in (key or {}).get("executions", [])
                if e["notebook"][:2] == notebook and e["condition"] == condition and "claims" in e]
        marks = [r.get(claim) for r in runs]
        shown = [m for m in marks if m]
        out.append(NOT_MEASURED if not shown else "shown (•)" if all(m == "•" for m in shown)
                   else rate_cell(marks.count("✓"), len(runs)))
    return out[0], out[1]


def rewrite_teaching(text: str, report: dict, key: dict | None = None) -> str:
    """``text`` (TEACHING.md) with the records' paragraph between the markers, the examples' rates (``report``)
    and the notebooks' (``key``) in the claims' rows; the rest of each row as it was."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"TEACHING.md has no {BEGIN} ... {END} section to write the record into")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    text = f"{head}{BEGIN}\n{measured_paragraph(report, key)}\n{END}{tail}"
    columns = held_columns(report)
    lines = []
    for line in text.splitlines(keepends=True):
        m = ROW.match(line.rstrip("\n"))
        if m:
            name, nb = m.group(1), m.group(2)
            observed = name in CLAIMS and not CLAIMS[name].asserts  # an observation cannot fail: nothing to count
            quiet, loaded = ("shown (•)", "shown (•)") if observed else columns.get(name, (m.group(3), m.group(4)))
            nb_quiet, nb_loaded = notebook_columns(key, nb, name)
            end = "\n" if line.endswith("\n") else ""
            line = f"| `{name}` | {nb} | {quiet} | {loaded} | {nb_quiet} | {nb_loaded} |{m.group(7)}{end}"
        lines.append(line)
    return "".join(lines)


def write_teaching(report_path: Path = RECORD) -> None:
    """Rewrite TEACHING.md from the examples' record at ``report_path`` and the committed notebooks/key_ranges.json."""
    from kvlab.teachers_key import read_record

    text = rewrite_teaching(TEACHING.read_text(encoding="utf-8"), json.loads(Path(report_path).read_text()),
                            read_record(NOTEBOOKS_DIR))
    TEACHING.write_text(text, encoding="utf-8")
    print(f"rewrote {_shown_path(str(TEACHING))} from {_shown_path(str(report_path))} and "
          f"{_shown_path(str(KEY_RECORD))}")


# -- the teacher's key: each prediction's answer across executed notebooks --------------------------------
NOTEBOOKS_DIR = ROOT / "notebooks"
KEY_RECORD = NOTEBOOKS_DIR / "key_ranges.json"
NOTEBOOK_TIMEOUT_S = 3600  # per cell: generous, a loaded 2-core machine runs 09's sweeps several times slower
CLAIM_LINE = re.compile(r'<div class="kvlab-claim"[^>]*>([^<]*)</div>')
MARKS = ("✓", "✗", "•", "·")  # holds, does not hold, an observation, not checked (kvlab.lessons.common.claims)


def _kernel(claims: Path):
    """A kernel of this very interpreter, never a kernelspec another Python installed (as tests/notebook_run.py),
    recording each claim line's mark into the folder ``claims`` (tests/claim_runs.py, imported from tests/ and
    tests/ taken off the kernel's path again, so the notebook imports what a learner's would)."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    tests = str(ROOT / "tests")
    startup = (f"import sys; sys.path.insert(0, {tests!r}); import claim_runs; sys.path.remove({tests!r}); "
               f"claim_runs.start({str(claims)!r}, results=False)")
    km = KernelManager(kernel_name="python3")
    km._kernel_spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                       f"--IPKernelApp.exec_lines={[startup]!r}"],
                                 display_name="kvlab key ranges", language="python")
    return km


def execute_notebook(name: str, timeout_s: int = NOTEBOOK_TIMEOUT_S) -> tuple[Any, float, list[str], dict[str, str]]:
    """``notebooks/<name>`` executed in memory, outputs cleared first: (the executed copy, seconds, errors,
    {claim name: the mark of its line})."""
    import nbformat
    from claim_runs import read_marks
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    with tempfile.TemporaryDirectory(prefix="kvlab-claims-") as folder:
        km, start = _kernel(Path(folder)), time.perf_counter()
        try:  # a kernel handed to nbclient is the caller's to shut down: else each run's would live on with its model
            NotebookClient(nb, km=km, timeout=timeout_s, allow_errors=True, store_widget_state=False,
                           record_timing=False, resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
        seconds, claims = time.perf_counter() - start, read_marks(folder)
    errors = [f"cell {i}: {out.get('ename')}: {out.get('evalue')}" for i, cell in enumerate(nb.cells)
              if cell.cell_type == "code" for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    return nb, seconds, errors, claims


def claim_marks(nb: Any) -> tuple[dict[str, int], list[str]]:
    """How many claim lines of an executed notebook show each mark, and the text of those that do not hold (✗)."""
    import html

    lines = [html.unescape(t).strip() for cell in nb.cells for out in cell.get("outputs", [])
             for t in CLAIM_LINE.findall(out.get("data", {}).get("text/html", ""))]
    return {m: sum(t.startswith(m) for t in lines) for m in MARKS}, [t for t in lines if t.startswith("✗")]


def notebook_answers(names: list[str], runs: int = 2, loaded: bool = True, timeout_s: int = NOTEBOOK_TIMEOUT_S,
                     progress: Callable[[str], None] | None = None) -> dict:
    """Each notebook in ``names`` executed ``runs`` times quiet, then (``loaded``) as many times under competing
    load: {"conditions": [...], "executions": [one per run], "predictions": [answers per condition]}."""
    from kvlab.teachers_key import parse_answer, predictions

    conditions, executions = [], []
    answers: dict[tuple[str, str], dict] = {}
    for label, procs in [("quiet", None)] + ([("loaded", os.cpu_count() or 1)] if loaded else []):
        started, load_before = time.strftime("%Y-%m-%d %H:%M:%S"), load_average()
        with (competing_load(procs, max_s=24 * 3600.0) if procs else nullcontext()) as n:
            for name in names:
                for run in range(runs):
                    before = load_average()
                    nb, seconds, errors, claims = execute_notebook(name, timeout_s)
                    marks, not_holding = claim_marks(nb)
                    found = predictions(nb)
                    executions.append({"notebook": name, "condition": label, "run": run, "seconds": seconds,
                                       "load_before": before, "load_after": load_average(), "errors": errors,
                                       "claim_marks": marks, "not_holding": not_holding, "claims": claims})
                    for p in found:
                        row = answers.setdefault((name, p["question"]), {
                            "notebook": name, "question": p["question"], "every_machine": p["every_machine"],
                            "unit": None, **{c: {"values": [], "answers": []} for c in ("quiet", "loaded")}})
                        parsed = parse_answer(p["answer"])
                        row[label]["answers"].append(p["answer"])
                        row[label]["values"].append(parsed[0] if parsed else None)
                        row["unit"] = row["unit"] or (parsed[1] if parsed else None)
                    if progress:
                        shown = ", ".join(str(p["answer"]) for p in found)
                        progress(f"{name} [{label} {run + 1}/{runs}]: {seconds:.1f} s, answers {shown or 'none'}, "
                                 f"claims {' '.join(f'{m}{k}' for m, k in marks.items() if k)}"
                                 + (f" ({sum(marks.values()) - len(claims)} line(s) without their claim recorded)"
                                    if sum(marks.values()) != len(claims) else "")
                                 + (f", {len(errors)} error(s): {errors[0]}" if errors else ""))
        conditions.append({"condition": label, "processes": n if procs else 0, "started": started,
                           "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": load_before,
                           "load_after": load_average()})
        if progress:
            progress(f"[{label}] load average {load_before:.2f} before, {conditions[-1]['load_after']:.2f} after")
    for row in answers.values():
        if not loaded:
            del row["loaded"]
    return {"conditions": conditions, "executions": executions, "predictions": list(answers.values())}


def _shown_path(path: str) -> str:
    """``path`` as the record's command names it: relative to the checkout when inside it (no machine paths)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def merged_rates(record: dict, again: dict, claims: list[str], command: str) -> dict:
    """The examples' ``record`` with the rows of ``claims`` replaced by ``again``'s (claims measured again after
    their rule changed), and what was measured again, with what command and when, kept under "remeasured"."""
    if again["runs"] != record["runs"]:
        raise SystemExit(f"--merge needs the record's --runs {record['runs']} (every claim the same number of runs)")
    out = dict(record)
    out["hold_rates"] = [r for r in record["hold_rates"] if r["claim"] not in claims] + again["hold_rates"]
    out["remeasured"] = record.get("remeasured", []) + [
        {"claims": list(claims), "command": command, "started": again["started"], "finished": again["finished"],
         "cpu": again.get("environment", {}).get("cpu")}]
    return out


def check_mergeable(record: dict, runs: int) -> None:
    """Refuse a --merge before any notebook runs (a measurement of many minutes must not end refused): the record
    must hold ``runs`` runs per notebook and condition."""
    if runs != record["runs"]:
        raise SystemExit(f"--merge needs the record's --runs {record['runs']} (every notebook the same number of "
                         f"executions per condition); nothing was run")


def merged(record: dict, again: dict) -> dict:
    """``record`` (a notebooks' record) with the notebooks ``again`` measured replaced by its executions and
    answers, and ``again``'s command, dates and conditions kept under "remeasured" (``--only NN --merge``: one
    notebook measured again after a change, the others as they were). A condition the record lacks (the first
    loaded runs, of some notebooks) is added with the notebooks it covers; the others say "—" under it."""
    check_mergeable(record, again["runs"])
    names = set(again["notebooks"])
    out = dict(record)
    have = {c["condition"] for c in record["conditions"]}
    measured = {c["condition"] for c in again["conditions"]}
    out["conditions"] = [c if "notebooks" not in c else  # a partial condition: which notebooks it covers now
                         {**c, "notebooks": sorted((set(c["notebooks"]) - names)
                                               | (names if c["condition"] in measured else set()))}
                         for c in record["conditions"]]
    out["conditions"] += [{**c, "notebooks": sorted(names)} for c in again["conditions"] if c["condition"] not in have]
    out["executions"] = [e for e in record["executions"] if e["notebook"] not in names] + again["executions"]
    out["predictions"] = [p for p in record["predictions"] if p["notebook"] not in names] + again["predictions"]
    out["remeasured"] = record.get("remeasured", []) + [
        {**{k: again[k] for k in ("notebooks", "command", "started", "finished", "conditions")},
         "cpu": again.get("environment", {}).get("cpu")}]
    return out


def measure_key(args: argparse.Namespace) -> None:
    """``--notebooks``: execute the teacher's copies, write the record, rewrite KEY.md from the course's record."""
    from kvlab import teachers_key
    from kvlab.authoring import selected
    from kvlab.env import environment
    from kvlab.results_io import write_json

    names = [p.name for p in selected(args.only)]
    out = Path(args.json) if args.json else KEY_RECORD
    command = " ".join(["python scripts/claims_robustness.py --notebooks --runs", str(args.runs)]
                       + (["--only", *args.only] if args.only else []) + (["--quiet-only"] if args.quiet_only else [])
                       + (["--json", _shown_path(args.json)] if args.json else [])
                       + (["--merge"] if args.merge else []))
    if args.merge:
        if not out.exists():
            raise SystemExit(f"--merge needs an existing record at {_shown_path(str(out))}; nothing was run")
        check_mergeable(json.loads(out.read_text(encoding="utf-8")), args.runs)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    found = notebook_answers(names, runs=args.runs, loaded=not args.quiet_only, timeout_s=args.timeout,
                             progress=print)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"environment": environment(), "runs": args.runs, "cpu_count": os.cpu_count(),
              "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
              "notebooks": names, **found}
    if args.merge:
        record = merged(json.loads(out.read_text(encoding="utf-8")), record)
    write_json(out, record)
    print(f"wrote {_shown_path(str(out))}")
    if out.resolve() == KEY_RECORD.resolve():
        if teachers_key.write(NOTEBOOKS_DIR):
            print(f"rewrote notebooks/{teachers_key.KEY_FILE} from {_shown_path(str(out))}")
        write_teaching()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="claim names (default: every wall-clock claim)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per claim (seeds 0..runs-1) or notebook, and condition")
    parser.add_argument("--quiet-only", action="store_true", help="skip the runs under competing load")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--teaching", action="store_true",
                        help="write the record (--json's, else notebooks/claims_hold_rates.json) and "
                             "notebooks/key_ranges.json into TEACHING.md")
    parser.add_argument("--notebooks", action="store_true",
                        help="execute the teacher's copies and record each prediction's answers and claim's mark "
                             "(default record: notebooks/key_ranges.json, then KEY.md and TEACHING.md rewritten "
                             "from it)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NN",
                        help="with --notebooks: only the notebooks whose names start so (e.g. 00 03)")
    parser.add_argument("--merge", action="store_true",
                        help="replace the named claims (or, with --notebooks --only, those notebooks) in the existing "
                             "record; the rest is kept as measured, and the record notes what was measured again")
    parser.add_argument("--timeout", type=int, default=NOTEBOOK_TIMEOUT_S,
                        help="with --notebooks: seconds one cell may take")
    args = parser.parse_args()
    if args.notebooks:
        if args.merge and not args.only:
            parser.error("--merge replaces the notebooks named by --only in the record")
        if args.names or args.teaching:
            parser.error("--notebooks runs notebooks, not claims: no claim names, no --teaching")
        measure_key(args)
        return
    if args.only:
        parser.error("--only goes with --notebooks")
    if args.merge and not (args.names and args.json):
        parser.error("--merge replaces the named claims' rows in the record --json names")
    unknown = [n for n in args.names if n not in CLAIMS]
    if unknown:
        parser.error(f"unknown claim(s) {unknown}; known: {sorted(CLAIMS)}")
    if args.teaching and not args.json:  # only rewrite TEACHING.md from the committed records
        write_teaching()
        return
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rates = hold_rates(args.names or None, runs=args.runs, loaded=not args.quiet_only, progress=print)
    print(f"\n{'claim':45s} {'condition':35s} held  load average before → after")
    for r in rates:
        print(f"{r.claim:45s} {r.condition:35s} {r.held}/{r.runs}   {r.load_before:.2f} → {r.load_after:.2f}")
    if args.json:
        from kvlab.env import environment
        from kvlab.results_io import write_json

        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        record = {"environment": environment(), "runs": args.runs, "cpu_count": os.cpu_count(),
                  "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "hold_rates": as_records(rates)}
        if args.merge:
            command = " ".join(["python scripts/claims_robustness.py", *args.names, "--runs", str(args.runs),
                                "--json", _shown_path(args.json), "--merge"])
            record = merged_rates(json.loads(Path(args.json).read_text(encoding="utf-8")), record, args.names,
                                  command)
        write_json(args.json, record)
        print(f"wrote {args.json}")
        if args.teaching:
            write_teaching(Path(args.json))


if __name__ == "__main__":
    main()
