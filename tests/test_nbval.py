"""The course under plain nbval, as a teacher checks it: ``pytest --nbval-lax --nbval-current-env notebooks/NN.ipynb``.

nbval runs every cell without storing history, so IPython's execution count stands still (1, 1, 1, ...), while
the project's runner (nbclient) stores it, and IPython 9 advances it before a cell where IPython 7 did after. A
prediction's comparison therefore numbers cells with kvlab's own count (``kvlab.provenance``) and shows
them counted back from the comparing cell, so the HTML nbval compares with the saved copy is the same whichever
runner made either.

Default tier: the count under a runner that advances nothing, one that stores history, and a button between cells
(IPython in a subprocess, so no shell lingers in this process); one small notebook saved by nbclient and checked by
real nbval. Full tier: nbval on every teacher's copy, in this environment and in the Colab twin (Colab's packages,
kvlab from its wheel, the notebooks in a folder with no checkout around it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from colab_twin import run as run_command

REPO = Path(__file__).resolve().parents[1]
TEACHERS_COPIES = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NBVAL = ["-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider", "-q"]


def _ipython(script: str) -> str:
    """``script`` run in a fresh interpreter that has an IPython shell; its standard output."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_cell_count_advances_where_ipythons_count_stands_still():
    """nbval stores no history: IPython's count reads the same in every cell, kvlab's advances one a cell; with
    history stored (JupyterLab, nbclient) the two runs agree; a button pressed between cells is the next cell; an
    experiment run after the question is in order, one run before it is flagged."""
    out = _ipython("""
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        for store in (False, True):
            shell.execution_count = 1
            shell.run_cell("from kvlab.provenance import current_cell; seen = [current_cell()]",
                           store_history=store)
            shell.run_cell("seen.append(current_cell())", store_history=store)
            shell.run_cell("seen.append(current_cell())", store_history=store)
            between = shell.user_ns["current_cell"]()  # a widget callback runs outside any cell
            print(store, shell.user_ns["seen"], between, shell.execution_count)
            del shell._kvlab_cells  # a fresh kernel for the second runner
        shell.run_cell("from kvlab.provenance import experiment; run = experiment(lambda: [1, 2, 3]); "
                       "early = run()", store_history=False)
        shell.run_cell("from kvlab.lessons.common.predict import predict; guess = predict('how many?')",
                       store_history=False)
        shell.run_cell("later = run()", store_history=False)
        shell.run_cell("c, seen_first = guess.against(later, len), guess.against(early, len)", store_history=False)
        c, seen_first = shell.user_ns["c"], shell.user_ns["seen_first"]
        print(c.asked_in, c.produced_in, c.compared_in, c.in_order, seen_first.in_order,
              "⚠" in c._repr_html_(), "⚠" in seen_first._repr_html_())
    """).splitlines()
    assert out[0] == "False [1, 2, 3] 4 1", out  # IPython's own count never moved under nbval's way of running
    assert out[1].startswith("True [1, 2, 3] 4 "), out
    assert out[2] == "2 3 4 True False False True", out


def _notebook(*sources: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


ASK = "from kvlab.lessons.common.predict import predict\nguess = predict('How many?', unit='sequences')\nguess"
EXPERIMENT = ("from kvlab.provenance import experiment\n\n@experiment\ndef count():\n    return [1, 2, 3]\n\n"
              "result = count()")
COMPARE = "# NBVAL_CHECK_OUTPUT\nguess.against(result, lambda r: float(len(r)))"


def test_nbval_passes_a_notebook_whose_outputs_nbclient_saved(tmp_path):
    """The saved copy is made the way ``python -m kvlab notebooks`` makes it (nbclient, history stored); plain nbval
    runs it again with no history and finds the comparison's HTML unchanged, counted back from the comparing cell.
    The same notebook with its question asked after the experiment warns under both runners, alike."""
    from nbclient import NotebookClient

    for name, cells, ago in [("in_order", ("import kvlab", ASK, EXPERIMENT, COMPARE), ("2", "1")),
                             ("asked_late", ("import kvlab", EXPERIMENT, ASK, COMPARE), ("1", "2"))]:
        nb = _notebook(*cells)
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                       ).execute()
        page = nb.cells[-1].outputs[0]["data"]["text/html"]
        assert f'data-asked-ago="{ago[0]}" data-produced-ago="{ago[1]}"' in page, page
        assert ("⚠" in page) is (name == "asked_late"), page
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir: no config from above
    out = run_command([sys.executable, *NBVAL, "in_order.ipynb", "asked_late.ipynb"], cwd=tmp_path,
                      env=_nbval_env(), timeout=300)
    assert "8 passed" in out, out


def _nbval_env() -> dict:
    """This environment as a teacher's shell has it; vLLM not set up, as when the saved copies were made."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVLAB_TEST"))}
    env["KVLAB_VLLM_HOME"] = os.environ["KVLAB_VLLM_HOME"]  # tests/conftest.py: an empty home
    return env


@pytest.mark.full
@pytest.mark.parametrize("notebook", TEACHERS_COPIES, ids=lambda nb: nb.stem)
def test_plain_nbval_passes_the_teachers_copy(notebook, tmp_path):
    """``python -m pytest --nbval-lax --nbval-current-env notebooks/NN.ipynb``, exactly as README's teacher runs it
    (a copy in a scratch folder, so nothing the run writes lands in the checkout)."""
    shutil.copy2(notebook, tmp_path / notebook.name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = run_command([sys.executable, *NBVAL, notebook.name], cwd=tmp_path, env=_nbval_env(), timeout=900)
    print(out.strip().splitlines()[-1])


@pytest.mark.full
@pytest.mark.colab_twin
@pytest.mark.parametrize("notebook", TEACHERS_COPIES, ids=lambda nb: nb.stem)
def test_plain_nbval_passes_the_teachers_copy_in_the_colab_twin(colab_twin, notebook, tmp_path):
    """The same in Colab's package set (its Python, IPython and ipykernel; kvlab from its wheel), outside the
    checkout."""
    shutil.copy2(notebook, tmp_path / notebook.name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**colab_twin.env, "KVLAB_VLLM_HOME": os.environ["KVLAB_VLLM_HOME"]}
    out = run_command([colab_twin.python, *NBVAL, notebook.name], cwd=tmp_path, env=env, timeout=900)
    print(out.strip().splitlines()[-1])
