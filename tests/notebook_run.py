"""Each notebook of the course executed once per test session, for every test that asserts on a run of it.

``run_notebook(name)`` executes the teacher's copy ``notebooks/NN_name.ipynb`` top to bottom in a fresh
kernel of this environment (the interpreter running pytest, as nbval's ``--nbval-current-env``), in
``notebooks/`` like a learner's Run All, and keeps the result for the session: the executed notebook
(outputs of this run), the saved one (outputs of the authors' run), the seconds taken and the errors.
Errors are collected, not raised, so every test of that notebook reports on the same run.

``compare_outputs`` is nbval's comparison of one cell (``# NBVAL_CHECK_OUTPUT``): streams coalesced
and keyed by their name, every MIME type compared except images and widget views.
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts"
CHECK_OUTPUT = "NBVAL_CHECK_OUTPUT"
NOT_COMPARED = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}
CELL_TIMEOUT_S = 600


@dataclass
class NotebookRun:
    """One execution of one notebook: what it showed, against what the committed copy holds."""

    name: str
    saved: nbformat.NotebookNode  # the committed teacher's copy
    executed: nbformat.NotebookNode  # the same cells, with this run's outputs
    seconds: float
    errors: list[str] = field(default_factory=list)  # "cell N: Type: message", one per failing cell

    def code_cells(self) -> list[tuple[nbformat.NotebookNode, nbformat.NotebookNode]]:
        """(saved, executed) pairs of the code cells, in order."""
        return [(s, e) for s, e in zip(self.saved.cells, self.executed.cells) if s.cell_type == "code"]


_RUNS: dict[str, NotebookRun] = {}


def _kernel_manager():
    """A kernel of this very interpreter (never a kernelspec that another Python installed)."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km._kernel_spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                 display_name="kvlab tests", language="python")
    return km


def run_notebook(name: str) -> NotebookRun:
    """Execute ``notebooks/<name>`` once per session (later calls return the same run)."""
    if name in _RUNS:
        return _RUNS[name]
    from nbclient import NotebookClient

    saved = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    executed = nbformat.from_dict(json.loads(json.dumps(saved)))
    for cell in executed.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    start = time.perf_counter()
    client = NotebookClient(executed, km=_kernel_manager(), timeout=CELL_TIMEOUT_S, allow_errors=True,
                            store_widget_state=False, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()
    seconds = time.perf_counter() - start
    errors = [f"cell {i}: {out.get('ename')}: {out.get('evalue')}"
              for i, cell in enumerate(executed.cells) if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    run = _RUNS[name] = NotebookRun(name, saved, executed, seconds, errors)
    _record_time(run)
    return run


def _record_time(run: NotebookRun) -> None:
    """test-artifacts/notebook-times.json: each notebook's Run All time in this session (a record, not a test)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "notebook-times.json"
    times = json.loads(path.read_text()) if path.exists() else {}
    times[run.name] = round(run.seconds, 1)
    path.write_text(json.dumps(dict(sorted(times.items())), indent=1))


def _comparable(outputs: list) -> dict[str, list]:
    """nbval's view of a cell's outputs: MIME type (or stream name) -> values, in order."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    outputs = transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs]))
    found: dict[str, list] = defaultdict(list)
    for out in outputs:
        for key, value in out.items():
            if key in NOT_COMPARED:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in NOT_COMPARED:
                        found[mime].append(data)
            else:
                found[key].append(value)
    return dict(found)


def compare_outputs(saved: list, executed: list) -> list[str]:
    """Where the outputs of a checked cell differ from the saved ones (empty: the same), as nbval compares."""
    want, got = _comparable(saved), _comparable(executed)
    problems = []
    if set(want) != set(got):
        problems.append(f"output kinds differ: saved {sorted(want)}, this run {sorted(got)}")
    for key in sorted(set(want) & set(got)):
        if want[key] != got[key]:
            problems.append(f"{key}:\n--- saved\n{_text(want[key])}\n+++ this run\n{_text(got[key])}")
    return problems


def _text(values: list) -> str:
    return "\n".join(v if isinstance(v, str) else "".join(v) if isinstance(v, list) else repr(v) for v in values)[:1500]
