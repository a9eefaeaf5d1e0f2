"""The first cell of every notebook cannot break a class: it installs only where kvlab is missing, a failed
install is one line that says what to do, a fork is one line away, and a GPU that fails the start-up check
falls back to the CPU."""
from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from kvlab import authoring, course
from kvlab.course import setup_cell, setup_report
from kvlab.device import pick_device
from kvlab.serving import device_check as check_module
from kvlab.serving.device_check import device_check

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def test_where_kvlab_imports_the_setup_cell_installs_nothing_and_reports(monkeypatch, capsys):
    real_run = subprocess.run

    def no_pip(cmd, *args, **kwargs):
        assert "pip" not in cmd, f"the setup cell ran {cmd} although kvlab imports"
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", no_pip)
    monkeypatch.setenv("KVLAB_DEVICE", "cpu")
    exec(setup_cell(), {})
    out = capsys.readouterr().out
    assert out.startswith("running ") and "device: cpu" in out


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A venv without kvlab that can still run pip (the test venv's packages on a plain path: no editable finder)."""
    root = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(root / "venv")
    python = root / "venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_test_site.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return python


def test_a_failed_install_prints_one_line_that_says_what_to_do_and_no_traceback(bare_python, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(GIT_ALLOW_PROTOCOL="file", PIP_NO_INDEX="1", GIT_TERMINAL_PROMPT="0")  # offline: git refuses https
    probe = subprocess.run([bare_python, "-c", "import kvlab"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode != 0, "kvlab must not import in the bare venv, or the install path is not tested"
    cell = tmp_path / "cell.py"
    cell.write_text(setup_cell())
    proc = subprocess.run([bare_python, cell], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    lines = proc.stdout.strip().splitlines()
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("kvlab is not ready (")
    assert "online" in lines[0] and f"pip install '{course.pip_spec()}'" in lines[0]


def test_notebooks_built_for_a_fork_carry_its_address_and_ref_everywhere(monkeypatch):
    old = course.REPO_URL.removeprefix("https://github.com/")
    monkeypatch.setattr(course, "REPO_URL", "https://github.com/a-school/kvlab-fork")
    monkeypatch.setattr(course, "REPO_REF", "workshop-2026-12")
    for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py")):
        nb = authoring.from_source(path)
        text = "\n".join(c.source for c in nb.cells)
        assert old not in text, f"{path.name} still names {old}"
        assert "git+https://github.com/a-school/kvlab-fork@workshop-2026-12" in nb.cells[1].source
        assert "github/a-school/kvlab-fork/blob/workshop-2026-12/notebooks/" in nb.cells[0].source
        assert "gh/a-school/kvlab-fork/workshop-2026-12?urlpath=" in nb.cells[0].source


def test_a_gpu_that_fails_the_start_up_check_falls_back_to_the_cpu_with_one_line(monkeypatch):
    # This torch has no CUDA: told CUDA is there, kvlab picks it, the check's first copy to the GPU raises.
    monkeypatch.delenv("KVLAB_DEVICE", raising=False)
    monkeypatch.delenv("KVLAB_DEVICE_CHECK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if torch.backends.cuda.is_built():
        pytest.skip("this torch has CUDA: the forced failure below needs a CPU-only build")
    assert pick_device().type == "cuda"
    report = setup_report()
    warning = [line for line in report.splitlines() if line.startswith("⚠")]
    assert len(warning) == 1 and "did not compute what the CPU computes" in warning[0], report
    assert os.environ["KVLAB_DEVICE"] == "cpu" and pick_device().type == "cpu"
    assert "device: cpu" in report


def test_the_check_names_a_cache_whose_tokens_differ_from_the_cpus(monkeypatch):
    real = check_module.generate
    calls = {"n": 0}

    def drifting(model, prompt, cache, **kw):  # every second call is "the device": its last token is off by one
        calls["n"] += 1
        result = real(model, prompt, cache=cache, **kw)
        if calls["n"] % 2 == 0 and cache == "quantized":
            result.tokens[-1] += 1
        return result

    monkeypatch.setattr(check_module, "generate", drifting)
    check = device_check("cpu")
    assert not check.ok and len(check.problems) == 1 and "the quantized cache generated" in check.problems[0]
    assert check.line().startswith("cpu did not compute what the CPU computes: the quantized cache")


def test_the_check_passes_where_the_device_is_the_cpu():
    check = device_check("cpu")
    assert check.ok and not check.problems, check.problems
