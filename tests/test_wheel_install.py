"""kvlab installed from a wheel, away from the checkout: the notebooks that read its shipped data still run.

Learners install kvlab non-editably (Colab's setup cell: ``pip install "kvlab @ git+..."``; a course
host may hand out a wheel) and open the notebooks anywhere. This builds the wheel, installs it into a
fresh venv, copies the notebooks into a folder with no checkout around it, and runs them there under
nbval, as a learner would. One test per notebook, sharing one wheel and one venv.

The fresh venv sees the test venv's dependencies (torch, nbval, ...) through a ``.pth`` file naming
its site-packages folder as a plain path. A plain path is added to ``sys.path`` without reading the
``.pth`` files inside it, so the editable install's finder (``__editable__.kvlab-*.pth``) never runs:
``import kvlab`` can only find the wheel's copy, and the first test checks that it does.

By default no notebook runs here: every notebook runs from a wheel, outside the checkout, in the
Colab twin already (tests/test_browser_classic.py drives them there), so this file checks the install
alone (the data the wheel ships, and that ``import kvlab`` finds the wheel, not the checkout). ``KVLAB_WHEEL_NOTEBOOKS`` picks others: ``all``, a comma list of
prefixes, or ``none`` for the install checks alone. Offline: pip runs with ``--no-index``, Hugging Face
with ``HF_HUB_OFFLINE=1``.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.full  # the full tier: pytest -m full (README, .ci/run)

from colab_twin import REPO, build_wheel
from colab_twin import run as _run

NOTEBOOK_DIR = REPO / "notebooks"
DATA_NOTEBOOKS = "none"  # by default none: the Colab twin runs every notebook from its wheel (the docstring says why)


def _notebooks() -> list[Path]:
    chosen = os.environ.get("KVLAB_WHEEL_NOTEBOOKS", DATA_NOTEBOOKS).strip()
    every = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if chosen == "all":
        return every
    prefixes = [p.strip() for p in chosen.split(",") if p.strip() and p.strip() != "none"]
    return [nb for nb in every if nb.name.startswith(tuple(prefixes))] if prefixes else []


def _learner_env(venv_dir: Path) -> dict:
    """The environment of a learner's shell with the venv activated: no PYTHONPATH, nothing online."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(VIRTUAL_ENV=str(venv_dir), PATH=f"{venv_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> dict:
    """Build the wheel from a clean copy of the sources, install it into a fresh venv; the paths involved."""
    root = tmp_path_factory.mktemp("wheel-install")
    assert not root.resolve().is_relative_to(REPO), f"{root} is inside the checkout; pytest would collect it"

    wheel = build_wheel(root)

    # A bare venv gets the wheel first (so pip sees no other kvlab), then the test venv's dependencies.
    venv_dir = root / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(venv_dir)
    python = venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    env = _learner_env(venv_dir)
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
         cwd=root, env=env)
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=root, env=env).strip())
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    deps = [p for p in site.getsitepackages() + user if Path(p).is_dir()]
    (purelib / "_kvlab_test_dependencies.pth").write_text("".join(f"{p}\n" for p in deps))
    return {"root": root, "wheel": wheel, "venv": venv_dir, "python": python, "env": env}


def test_the_wheel_ships_the_data_kvlab_needs(wheel_venv):
    names = set(zipfile.ZipFile(wheel_venv["wheel"]).namelist())
    shipped = [p.relative_to(REPO).as_posix() for p in (REPO / "kvlab" / "data").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts]
    missing = [f for f in shipped if f not in names]
    assert not missing, f"in kvlab/data but not in {wheel_venv['wheel'].name}: {missing}"
    assert "kvlab/data/recall-tiny/model.safetensors" in names


def test_kvlab_imports_from_the_installed_wheel_not_the_checkout(wheel_venv):
    away = wheel_venv["root"] / "away"
    away.mkdir(exist_ok=True)
    out = _run([wheel_venv["python"], "-c", (
        "import kvlab, kvlab.data as d\n"
        "from kvlab.experiments.recall import load_recall_model\n"
        "from kvlab.serving.cost_model import load_calibration\n"
        "from kvlab.traces import SAMPLE_TRACE, read_trace\n"
        "print(kvlab.__file__); print(d.data_dir())\n"
        "load_recall_model(device='cpu'); load_calibration('llama-30m'); read_trace(SAMPLE_TRACE)")],
        cwd=away, env=wheel_venv["env"])
    package, data_dir = (Path(line) for line in out.split()[:2])
    assert package.is_relative_to(wheel_venv["venv"]), f"kvlab imported from {package}, not the wheel's venv"
    assert not package.is_relative_to(REPO) and not data_dir.is_relative_to(REPO)
    assert data_dir == package.parent / "data"


@pytest.mark.parametrize("notebook", _notebooks(), ids=lambda nb: nb.stem)
def test_the_notebook_runs_from_the_wheel_outside_the_checkout(wheel_venv, notebook, tmp_path):
    assert not tmp_path.resolve().is_relative_to(REPO)
    shutil.copy2(notebook, tmp_path / notebook.name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir: no config from above
    _run([wheel_venv["python"], "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
          "-q", notebook.name], cwd=tmp_path, env=wheel_venv["env"], timeout=600)
