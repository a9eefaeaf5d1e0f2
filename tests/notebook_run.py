"""Each notebook of the course executed once per test session, for every test that asserts on a run of it.

``run_notebook(name)`` executes the teacher's copy ``notebooks/NN_name.ipynb`` top to bottom in a fresh
kernel of this environment (the interpreter running pytest, as nbval's ``--nbval-current-env``), in
``notebooks/`` like a learner's Run All, and keeps the result for the session: the executed notebook
(outputs of this run), the saved one (outputs of the authors' run), the seconds taken and the errors.
Errors are collected, not raised, so every test of that notebook reports on the same run.
A session whose tests read notebook runs executes them ahead, in a background thread (``Ahead``, started by
tests/conftest.py), while the other tests run: the notebooks spend much of their time waiting on real-time clocks.

``compare_outputs`` is nbval's comparison of one cell (``# NBVAL_CHECK_OUTPUT``): streams coalesced
and keyed by their name, every MIME type compared except images and widget views.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

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
    figure_texts: dict[int, list[str]] = field(default_factory=dict)  # cell index -> texts of the figures it drew
    claim_folder: Path | None = None  # <claim name>.pkl: the result each verdicts(...) call of this run was given

    def claim_result(self, name: str):
        """The result the notebook decided claim ``name`` on, as it was at that call; None where it never showed it."""
        import pickle

        path = self.claim_folder / f"{name}.pkl" if self.claim_folder else None
        return pickle.loads(path.read_bytes()) if path is not None and path.exists() else None

    def shown_before(self, index: int) -> list[tuple[int, str]]:
        """(cell index, text) of everything cells before ``index`` showed: outputs and the text inside figures."""
        found = []
        for i, cell in enumerate(self.executed.cells[:index]):
            for out in cell.get("outputs", []):
                found.append((i, visible_text(out)))
            found += [(i, t) for t in self.figure_texts.get(i, [])]
        return found

    def code_cells(self) -> list[tuple[nbformat.NotebookNode, nbformat.NotebookNode]]:
        """(saved, executed) pairs of the code cells, in order."""
        return [(s, e) for s, e in zip(self.saved.cells, self.executed.cells) if s.cell_type == "code"]


_RUNS: dict[str, Future[NotebookRun]] = {}  # name -> its one run (a thread ahead may still be making it)
_LOCK = threading.Lock()


def _kernel_manager(claim_folder: Path | None = None):
    """A kernel of this very interpreter (never a kernelspec that another Python installed), recording figure text
    and, given ``claim_folder``, the result each claim was decided on (``tests/claim_runs.py``)."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    startup = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import figure_text"
    if claim_folder is not None:
        startup += f"; import claim_runs; claim_runs.start({str(claim_folder)!r})"
    km = KernelManager(kernel_name="python3")
    km._kernel_spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                       f"--IPKernelApp.exec_lines={[startup]!r}"],
                                 display_name="kvlab tests", language="python")
    return km


FIGURE_DUMP = "import figure_text as _ft, json as _json; print(_json.dumps(_ft.RECORDS))"


def visible_text(out) -> str:
    """What a reader sees of one output before clicking anything: a stream, the HTML outside folds, or plain text."""
    from test_predict import shown_without_clicking

    if out.get("output_type") == "stream":
        return out.get("text", "")
    data = out.get("data", {})
    if "text/html" in data:
        return shown_without_clicking(data["text/html"])
    return data.get("text/plain", "") if isinstance(data.get("text/plain", ""), str) else ""


def run_notebook(name: str, env: dict[str, str] | None = None) -> NotebookRun:
    """Execute ``notebooks/<name>`` once per session; later calls, from any thread, wait for and return that run.
    ``env``: the kernel's environment (default: this process's, now)."""
    with _LOCK:
        future = _RUNS.get(name)
        owner = future is None
        if owner:
            future = _RUNS[name] = Future()
    if owner:
        try:
            future.set_result(_execute(name, dict(os.environ) if env is None else env))
        except BaseException as e:  # kept for every test that reads this run, raised to each
            future.set_exception(e)
    return future.result()


class Ahead:
    """The notebooks ``names`` executed one after another in a background thread (``run_notebook``), each in a kernel
    with the environment the session had when this started (a test's monkeypatched variables never reach it).
    ``stop()``: start no other notebook, and wait for the one running."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.env, self.stopping = names, dict(os.environ), threading.Event()
        self.thread = threading.Thread(target=self._run, name="notebooks ahead", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for name in self.names:
            if self.stopping.is_set():
                return
            try:
                run_notebook(name, self.env)
            except BaseException:  # kept in the run's future: the tests that read it report it
                pass

    def stop(self, timeout_s: float = CELL_TIMEOUT_S) -> None:
        self.stopping.set()
        self.thread.join(timeout_s)


def _execute(name: str, env: dict[str, str]) -> NotebookRun:
    from nbclient import NotebookClient

    saved = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    executed = nbformat.from_dict(json.loads(json.dumps(saved)))
    for cell in executed.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    executed.cells.append(new_code_cell(FIGURE_DUMP))  # read back after the run, then removed
    claims = ARTIFACTS / "claim-runs" / Path(name).stem
    shutil.rmtree(claims, ignore_errors=True)
    start = time.perf_counter()
    # vLLM: tests/conftest.py gives every test, and so this kernel, an empty KVLAB_VLLM_HOME (not set up).
    km = _kernel_manager(claims)
    client = NotebookClient(executed, km=km, timeout=CELL_TIMEOUT_S, allow_errors=True,
                            store_widget_state=False, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute(env=env)
        seconds = time.perf_counter() - start
    finally:  # the kernel is ours (a manager we made): ended with its run, not left for the session's end
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    dump = executed.cells.pop()
    records = json.loads("".join(o.get("text", "") for o in dump.outputs if o.get("output_type") == "stream") or "[]")
    by_count = {cell.execution_count: i for i, cell in enumerate(executed.cells) if cell.cell_type == "code"}
    figure_texts: dict[int, list[str]] = {}
    for count, texts in records:
        if count in by_count:
            figure_texts.setdefault(by_count[count], []).extend(texts)
    errors = [f"cell {i}: {out.get('ename')}: {out.get('evalue')}"
              for i, cell in enumerate(executed.cells) if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    run = NotebookRun(name, saved, executed, seconds, errors, figure_texts, claims)
    with _LOCK:
        _record_time(run)
    return run


def _record_time(run: NotebookRun) -> None:
    """test-artifacts/notebook-times.json: each notebook's Run All time in this session (a record, not a test)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "notebook-times.json"
    times = json.loads(path.read_text()) if path.exists() else {}
    times[run.name] = round(run.seconds, 1)
    path.write_text(json.dumps(dict(sorted(times.items())), indent=1))


def _comparable(outputs: list, only: tuple[str, ...] | None = None) -> dict[str, list]:
    """nbval's view of a cell's outputs: MIME type (or stream name) -> values, in order (``only``: these MIME types
    and the streams)."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    outputs = transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs]))
    found: dict[str, list] = defaultdict(list)
    for out in outputs:
        for key, value in out.items():
            if key in NOT_COMPARED:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in NOT_COMPARED and (only is None or mime in only):
                        found[mime].append("".join(data) if isinstance(data, list) else data)
            else:
                found[key].append("".join(value) if isinstance(value, list) else value)
    return dict(found)


def compare_outputs(saved: list, executed: list, only: tuple[str, ...] | None = None) -> list[str]:
    """Where the outputs of a checked cell differ from the saved ones (empty: the same), as nbval compares.

    ``only``: compare these MIME types (and the streams) alone, e.g. ``("text/plain",)`` for outputs read back
    from a browser, whose front end may serialise HTML its own way."""
    want, got = _comparable(saved, only), _comparable(executed, only)
    problems = []
    if set(want) != set(got):
        problems.append(f"output kinds differ: saved {sorted(want)}, this run {sorted(got)}")
    for key in sorted(set(want) & set(got)):
        if want[key] != got[key]:
            problems.append(f"{key}:\n--- saved\n{_text(want[key])}\n+++ this run\n{_text(got[key])}")
    return problems


def _text(values: list) -> str:
    return "\n".join(v if isinstance(v, str) else "".join(v) if isinstance(v, list) else repr(v) for v in values)[:1500]
