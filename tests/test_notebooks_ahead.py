"""The session's notebook runs are made ahead (tests/conftest.py, tests/notebook_run.py): the tests that read them
run last, and exactly the notebooks they read are executed meanwhile, none when no selected test reads one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvlab.course import NOTEBOOKS

ROOT = Path(__file__).resolve().parent.parent
RECORDER = '''
import json, sys
def pytest_collection_finish(session):
    key = sys.modules["conftest"].NOTEBOOKS_AHEAD
    print("ORDER " + json.dumps({"items": [[i.nodeid, i.get_closest_marker("notebook_runs") is not None]
                                           for i in session.items],
                                 "ahead": session.config.stash.get(key, [])}))
'''


def collected(tmp_path: Path, *args: str) -> dict:
    """The selected tests in the order they would run, whether each reads notebook runs, and the notebooks ahead."""
    (tmp_path / "order_recorder.py").write_text(RECORDER)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "order_recorder", "--collect-only", "-q", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ORDER ")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(line[len("ORDER "):])


def test_the_tests_that_read_notebook_runs_come_last_and_their_notebooks_are_made_ahead(tmp_path):
    files = ["tests/test_claims.py", "tests/test_two_engines.py", "tests/test_cache_quantized.py"]
    run = collected(tmp_path, *files)
    reads = [r for _, r in run["items"]]
    assert any(reads) and not all(reads)
    assert reads == sorted(reads), "a test that reads a notebook run comes before one that does not"
    assert run["ahead"] == [n.file for n in NOTEBOOKS]  # test_claims reads every notebook's run
    only_09 = collected(tmp_path, "tests/test_two_engines.py")
    assert only_09["ahead"] == ["09_measure_a_real_server.ipynb"]
    assert collected(tmp_path, *files, "-m", "full")["ahead"] == []  # deselected readers start nothing
