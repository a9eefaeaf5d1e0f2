"""The teacher's key: each prediction of the course with its answer in the authors' run, read from the runs.

``notebooks/KEY.md`` is generated, never typed: for every ``guess.against(...)`` cell of each teacher's copy
(``notebooks/NN_name.ipynb``, with the outputs of the authors' run), the question its ``predict("...")`` box asks
and the measured answer its output folds away, with the run's machine from the notebook's metadata. Where the
answer comes from a virtual clock or a count it is the same on every machine ("every machine"); otherwise it is
the authors' machine's, and a room's will differ (the room view, ``kvlab.room``, shows the spread). Beside it, the
range of answers seen when the teacher's copies were executed again and again, quiet and under competing CPU load:
read from the record ``notebooks/key_ranges.json`` that ``python scripts/claims_robustness.py --notebooks`` writes
(a prediction the record lacks says "not measured"). ``python -m kvlab notebooks`` rewrites the key whenever a
notebook is executed; ``tests/test_teachers_key.py`` checks it is current. The learner's edition never links it.
"""
from __future__ import annotations

import ast
import html
import json
import math
import re
from pathlib import Path

import nbformat

from kvlab.course import NOTEBOOKS
from kvlab.lessons.common.predict import MEASURED_CLASS

KEY_FILE = "KEY.md"
RANGES_FILE = "key_ranges.json"  # the record of answers across runs (scripts/claims_robustness.py --notebooks)
CONDITIONS = ("quiet", "loaded")
REMEASURE = "python scripts/claims_robustness.py --notebooks --runs 2"
MEASURED = re.compile(rf'<b class="{MEASURED_CLASS}">([^<]*)</b>')  # what a prediction's fold hides
# An answer as Comparison._fmt writes it: f"{x:,.3g}" then the unit ("3.7×", "57.7%", "2.06 ms", "4,096 tokens",
# "1.23e+03 ms", "inf×"); the suffix keeps its leading space, so a number formats back into the same text.
ANSWER = re.compile(r"^\s*([-+]?(?:inf|nan|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?))(.*)$", re.I)


def _question(source: str, var: str) -> str | None:
    """The first argument of ``var = predict("...")`` in a cell's source (string literals joined)."""
    if "predict(" not in source:
        return None
    try:
        tree = ast.parse("\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var for t in node.targets)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "predict"
                and node.value.args and isinstance(node.value.args[0], ast.Constant)):
            return str(node.value.args[0].value)
    return None


def predictions(nb: nbformat.NotebookNode) -> list[dict]:
    """One row per ``.against(...)`` cell of one notebook (saved or just executed): question, answer (None where
    the outputs hold none), whether it is machine-free."""
    rows = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for j, cell in enumerate(code):
        m = re.search(r"(\w+)\.against\(", cell.source)
        if not m:
            continue
        question = next((q for c in reversed(code[:j]) if (q := _question(c.source, m.group(1)))), None)
        answers = [html.unescape(a) for o in cell.get("outputs", [])
                   for a in MEASURED.findall(o.get("data", {}).get("text/html", ""))]
        rows.append({"question": question or "(no predict(...) found before it)",
                     "answer": answers[0] if answers else None, "every_machine": "NBVAL_CHECK_OUTPUT" in cell.source})
    return rows


def key_rows(folder: Path) -> list[dict]:
    """One row per prediction of the course: notebook, question, the authors' answer, whether it is machine-free."""
    return [{"notebook": entry.file, **r, "answer": r["answer"] or "(not in the saved run: execute the notebook)"}
            for entry in NOTEBOOKS for r in predictions(nbformat.read(folder / entry.file, as_version=4))]


def parse_answer(text: str | None) -> tuple[float, str] | None:
    """An answer's number and unit suffix ("6.89×" -> (6.89, "×"), "2.06 ms" -> (2.06, " ms")); None without one."""
    m = ANSWER.match(text or "")
    return (float(m.group(1).replace(",", "")), m.group(2).rstrip()) if m else None


def format_answer(value: float, unit: str) -> str:
    """``value`` with its unit suffix, as the notebooks show an answer (the inverse of ``parse_answer``)."""
    return f"{value:,.3g}{unit}"


def read_record(folder: Path) -> dict | None:
    """The record of answers across runs (``folder/key_ranges.json``), None when there is none."""
    path = folder / RANGES_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def record_mismatches(rows: list[dict], record: dict) -> list[str]:
    """Where the record and the notebooks disagree: a row naming an unknown prediction, or a measured notebook
    with a prediction the record has no row for (re-measure after a question changes)."""
    known = {(r["notebook"], r["question"]) for r in rows}
    listed = {(p["notebook"], p["question"]) for p in record.get("predictions", [])}
    measured = {p["notebook"] for p in record.get("predictions", [])} | set(record.get("notebooks", []))
    return ([f"the record names an unknown prediction: {n}: {q!r}" for n, q in sorted(listed - known)]
            + [f"the record has no row for {n}: {q!r}" for n, q in sorted(known - listed) if n in measured])


def answer_range(values: list[float | None], unit: str) -> str:
    """"lo–hi unit (n runs)" of one prediction in one condition; the runs without an answer are counted apart."""
    found = [v for v in values if v is not None and not math.isnan(v)]
    missing = len(values) - len(found)
    if not found:
        return f"no answer in {missing} run{'s' * (missing != 1)}" if missing else "not measured"
    lo, hi = min(found), max(found)
    text = format_answer(lo, unit) if format_answer(lo, "") == format_answer(hi, "") else \
        f"{format_answer(lo, '')}–{format_answer(hi, unit)}"
    n = len(found)
    return f"{text} ({n} run{'s' * (n != 1)}" + (f", {missing} without an answer)" if missing else ")")


def _ranges(row: dict, record: dict | None) -> tuple[str, str]:
    found = next((p for p in (record or {}).get("predictions", [])
                  if (p["notebook"], p["question"]) == (row["notebook"], row["question"])), None)
    if found is None:
        return "not measured", "not measured"
    parsed = parse_answer(row["answer"])
    unit = found.get("unit") or (parsed[1] if parsed else "")
    quiet, loaded = (answer_range(found[c]["values"], unit) if found.get(c) else "not measured" for c in CONDITIONS)
    return quiet, loaded


def ranges_paragraph(record: dict | None, record_path: str = f"notebooks/{RANGES_FILE}") -> str:
    """Where the key's ranges come from: the record's dates, machine, load averages and command."""
    if not record:
        return (f"*Quiet* and *loaded*: the range of answers when the teacher's copies are executed again, quiet "
                f"and with one CPU-bound competing process per core. No such record exists yet (`{record_path}`), "
                f"so every prediction says *not measured*; measure them with `{REMEASURE}` (several minutes: it "
                f"runs every notebook top to bottom, each time).")
    env, conditions = record["environment"], {c["condition"]: c for c in record.get("conditions", [])}
    device = "CUDA " + env["cuda_device"] if env.get("cuda_device") else "CPU PyTorch"
    loads = "; ".join(f"{name} {c['load_before']:.2f} before and {c['load_after']:.2f} after"
                      for name, c in conditions.items() if c.get("load_before") is not None
                      and c.get("load_after") is not None)
    loaded = conditions.get("loaded", {}).get("processes")
    loaded_for = conditions.get("loaded", {}).get("notebooks")  # a merged record: loaded runs of some notebooks only
    only = f" (notebooks {', '.join(n[:2] for n in loaded_for)} only)" if loaded_for else ""
    names = record.get("notebooks") or sorted({p["notebook"] for p in record.get("predictions", [])})
    which = "" if set(names) >= {n.file for n in NOTEBOOKS} else f" (notebooks {', '.join(n[:2] for n in names)} only)"
    return (f"*Quiet* and *loaded*: the range of answers (lowest–highest, and in how many runs) when the teacher's "
            f"copies{which} were executed {record['runs']} time{'s' * (record['runs'] != 1)} each quiet (no competing "
            f"processes started by the script; other programs on the machine count too) and "
            + (f"as many times with {loaded} CPU-bound competing processes, one per core{only}, "
               if loaded else "never under competing load, ")
            + f"from {record['started']} to {record['finished']}, with `{record['command']}` on a machine with "
            f"{record['cpu_count']} CPU cores and {device} ({env.get('torch_threads')} torch threads, kvlab "
            f"{env['versions']['kvlab']}, torch {env['versions']['torch']}); 1-minute load average: "
            f"{loads or 'not recorded'}. Read from `{record_path}`; a prediction it lacks says *not measured*. "
            f"To measure again: `{REMEASURE}` (then `python -m kvlab notebooks` or the script rewrites this page).")


def render(folder: Path, record: dict | None = None) -> str:
    """The text of notebooks/KEY.md; ``record``: the ranges' record (None: ``folder/key_ranges.json`` if any,
    ``{}``: none)."""
    record = (read_record(folder) if record is None else record) or None
    lines = ["# The teacher's key (generated)", "",
             "Each prediction of the course with its answer in the authors' run (the teacher's copies in this "
             "folder), generated by `python -m kvlab notebooks` from the saved outputs (`kvlab/teachers_key.py`): "
             "never edit it by hand. *Every machine*: the answer comes from a count or a virtual clock and is the "
             "same on every machine. Otherwise it is the authors' machine's (see each notebook's setup cell for "
             "which), and a room's answers spread around it: the room view (`notebooks/room/room_view.ipynb`) "
             "shows that spread. Not for learners: the workshop edition does not link this page.", "",
             ranges_paragraph(record), "",
             "| notebook | prediction | authors' run | | quiet runs | loaded runs |", "|---|---|---|---|---|---|"]
    for r in key_rows(folder):
        question = r["question"].replace("|", "\\|")
        where = "every machine" if r["every_machine"] else "the authors' machine"
        quiet, loaded = _ranges(r, record)
        lines.append(f"| {r['notebook'][:2]} | {question} | {r['answer']} | {where} | {quiet} | {loaded} |")
    return "\n".join(lines) + "\n"


def write(folder: Path) -> bool:
    """Rewrite ``folder/KEY.md``; True when it changed."""
    path, text = folder / KEY_FILE, render(folder)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


__all__ = ["CONDITIONS", "KEY_FILE", "RANGES_FILE", "answer_range", "format_answer", "key_rows", "parse_answer",
           "predictions", "ranges_paragraph", "read_record", "record_mismatches", "render", "write"]
