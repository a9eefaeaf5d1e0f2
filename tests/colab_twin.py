"""A twin of Colab's runtime: a fresh venv holding Colab's package set, with kvlab's wheel installed into it.

Colab's versions are kept in one file, ``tests/environments/colab.txt`` (its source and date at its
top). The twin is built once per test session (``colab_twin`` fixture in conftest.py):

1. a venv on Colab's Python (found with pyenv or on PATH; the running Python where it is missing),
   with Colab's packages installed exactly, and, for what kvlab needs that Colab's list does not
   name, the lower bound pyproject.toml declares (so each declared lower bound is installed here);
2. kvlab's wheel, built from a clean copy of the sources; ``pip install --dry-run`` of it with its
   dependencies is recorded, then it is installed for real, with its dependencies, from the index;
3. the test tools (pytest, nbval at requirements.txt's pins), installed last.

Every step's pip freeze is kept, so a test can say which of Colab's versions changed and when.
The twin is the full tier (``pytest -m full``; ``-m "full and not colab_twin"`` leaves it out): it downloads
Colab's torch, a CUDA build of ~3 GB.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLAB_FILE = REPO / "tests" / "environments" / "colab.txt"
BUILD_FILES = ("pyproject.toml", "README.md")
TEST_TOOLS = ("pytest", "nbval")  # at requirements.txt's pins


def canonical(name: str) -> str:
    """A package name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_packages(path: Path = COLAB_FILE) -> tuple[str, dict[str, str]]:
    """Colab's Python version and its packages {name: version}, from the one file that lists them."""
    python, packages = "", {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{path}: pin {line!r} with == (the twin installs exactly Colab's version)")
        if canonical(name) == "python":
            python = version.strip()
        else:
            packages[canonical(name)] = version.strip()
    return python, packages


def declared_requirements() -> dict[str, str]:
    """pyproject.toml's dependencies and its serve extra: {name: requirement string}."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("serve", []))
    return {canonical(re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0]): r for r in reqs}


def lower_bound(requirement: str) -> str | None:
    """The version after ``>=`` in a requirement string, or None."""
    m = re.search(r">=\s*([0-9][^,;\s]*)", requirement)
    return m.group(1) if m else None


def requirement_pins() -> dict[str, str]:
    """requirements.txt's pins {name: version}."""
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def find_python(version: str) -> tuple[str, str]:
    """An interpreter of ``version`` ("3.13") and where it came from; the running one when none is found."""
    if shutil.which("pyenv"):
        bare = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split()
        found = sorted((v for v in bare if re.fullmatch(rf"{re.escape(version)}\.\d+", v)),
                       key=lambda v: int(v.rsplit(".", 1)[1]))
        if found:
            prefix = subprocess.run(["pyenv", "prefix", found[-1]], capture_output=True, text=True).stdout.strip()
            exe = Path(prefix) / "bin" / f"python{version}"
            if exe.exists():
                return str(exe), f"pyenv {found[-1]}"
    exe = shutil.which(f"python{version}")
    if exe and subprocess.run([exe, "--version"], capture_output=True).returncode == 0:
        return exe, "PATH"
    return sys.executable, f"no Python {version} here: the running Python {sys.version.split()[0]}"


def run(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 1200) -> str:
    """Run ``cmd``; on failure raise with the command and the end of its output."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{out[-6000:]}")
    return out


def build_wheel(root: Path) -> Path:
    """kvlab's wheel, built from a clean copy of the sources (an in-tree build could package stale files)."""
    src = root / "src"
    shutil.copytree(REPO / "kvlab", src / "kvlab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in BUILD_FILES:
        shutil.copy2(REPO / name, src / name)
    wheels = root / "wheels"
    run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", wheels], cwd=root)
    (wheel,) = wheels.glob("kvlab-*.whl")
    return wheel


@dataclass
class Twin:
    """The built twin: its interpreter, its environment, and what pip said at every step."""

    root: Path
    venv: Path
    python: Path
    env: dict
    python_source: str
    colab_python: str
    colab: dict[str, str]  # Colab's packages, as the file lists them
    extra_pins: dict[str, str]  # the lower bounds installed for what Colab's list does not name
    wheel: Path
    would_install: list[dict] = field(default_factory=list)  # pip install --dry-run of kvlab[serve]
    freeze: dict[str, dict[str, str]] = field(default_factory=dict)  # step -> {name: version}

    def site_packages(self) -> Path:
        return Path(run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=self.root, env=self.env).strip())

    def installed(self) -> dict[str, str]:
        out = run([self.python, "-m", "pip", "list", "--format", "json"], cwd=self.root, env=self.env)
        return {canonical(p["name"]): p["version"] for p in json.loads(out)}

    def report(self) -> dict:
        """What a closing note quotes: versions, what the dry run would install, what changed."""
        return dict(python=self.python_source, colab_python=self.colab_python, colab=self.colab,
                    extra_pins=self.extra_pins,
                    would_install={p["metadata"]["name"]: p["metadata"]["version"] for p in self.would_install},
                    freeze=self.freeze)


def twin_env(venv: Path) -> dict:
    """A learner's shell with the twin activated: no PYTHONPATH, no pip cap of this machine, hubs offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def build_twin(root: Path) -> Twin:
    """Build the twin under ``root`` (steps in the module docstring)."""
    colab_python, colab = colab_packages()
    python, source = find_python(colab_python)
    venv = root / "venv"
    run([python, "-m", "venv", venv], cwd=root)
    exe = venv / "bin" / "python"
    env = twin_env(venv)
    declared = declared_requirements()
    extra = {name: lower_bound(req) for name, req in declared.items() if name not in colab and lower_bound(req)}
    run([exe, "-m", "pip", "install", "-q", *(f"{n}=={v}" for n, v in {**colab, **extra}.items())], cwd=root, env=env)
    twin = Twin(root, venv, exe, env, source, colab_python, colab, extra, build_wheel(root))
    twin.freeze["colab"] = twin.installed()
    spec = f"kvlab[serve] @ {twin.wheel.as_uri()}"
    report = root / "dry-run.json"
    run([exe, "-m", "pip", "install", "--dry-run", "--quiet", "--report", report, spec], cwd=root, env=env)
    twin.would_install = json.loads(report.read_text())["install"]
    run([exe, "-m", "pip", "install", "-q", spec], cwd=root, env=env)
    twin.freeze["kvlab"] = twin.installed()
    pins = requirement_pins()
    run([exe, "-m", "pip", "install", "-q", *(f"{t}=={pins[t]}" for t in TEST_TOOLS)], cwd=root, env=env)
    twin.freeze["test tools"] = twin.installed()
    return twin


def changed(before: dict[str, str], after: dict[str, str], names) -> dict[str, tuple[str, str | None]]:
    """{name: (before, after)} for each of ``names`` whose version differs (after is None when removed)."""
    return {n: (before[n], after.get(n)) for n in names if after.get(n) != before[n]}
