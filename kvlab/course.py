"""The course around the package: where the repository lives, the notebook sequence, and the setup check.

``REPO_URL`` is the one place the project's address is written; the notebook generator
(scripts/build_notebooks.py) copies it into each notebook's badges and first cell, because that
cell must install kvlab on Colab before kvlab can be imported.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import __version__

REPO_URL = "https://github.com/kvlab/kvlab"
REPO_REF = f"v{__version__}"  # the tag Colab installs from: notebooks and package move together
BRANCH = "main"  # what the Colab and Binder badges open


@dataclass(frozen=True)
class Lesson:
    """One notebook of the course: its file, title, what it shows and how long it takes."""

    file: str  # file name inside notebooks/
    title: str
    shows: str
    minutes: int


# In order. Engineers adding a notebook append its Lesson here; navigation links follow this list.
NOTEBOOKS: list[Lesson] = [
    Lesson("00_start_here.ipynb", "Start here",
           "your machine (device, versions, threads), how the lab is laid out, how a panel works", 10),
    Lesson("01_the_slowdown.ipynb", "The slowdown",
           "without a cache each token takes longer than the last; time per token and cumulative time, "
           "none vs dynamic; expected (work) vs measured ratio", 15),
    Lesson("02_kv_cache.ipynb", "The KV cache",
           "what K and V are, the cache as K/V tensors per layer, same tokens with and without it, "
           "the memory formula vs measured bytes, a calculator for published models", 20),
]


def pip_spec(ref: str = REPO_REF) -> str:
    """What Colab's first cell installs: kvlab from the repository at a pinned tag."""
    return f"kvlab @ git+{REPO_URL}@{ref}"


def colab_url(notebook: str, branch: str = BRANCH) -> str:
    """Open ``notebook`` (a file in notebooks/) on Google Colab."""
    return f"https://colab.research.google.com/github/{REPO_URL.removeprefix('https://github.com/')}" \
           f"/blob/{branch}/notebooks/{notebook}"


def binder_url(notebook: str, branch: str = BRANCH) -> str:
    """Open ``notebook`` in JupyterLab on mybinder.org."""
    return f"https://mybinder.org/v2/gh/{REPO_URL.removeprefix('https://github.com/')}/{branch}" \
           f"?urlpath=lab/tree/notebooks/{notebook}"


def lesson(notebook: str) -> Lesson:
    """The Lesson entry of ``notebook``."""
    for entry in NOTEBOOKS:
        if entry.file == notebook:
            return entry
    raise ValueError(f"{notebook!r} is not in kvlab.course.NOTEBOOKS; add a Lesson for it there")


def setup_report() -> str:
    """A few lines on where this notebook runs: versions, device, threads, and what to do without a GPU."""
    from .device import pick_device
    from .env import environment

    env = environment()
    device = pick_device()
    v = env["versions"]
    lines = [
        f"kvlab {v.get('kvlab')} · torch {v.get('torch')} · transformers {v.get('transformers')} · "
        f"Python {env['python']}",
        f"device: {device} ({env['device']}), {env.get('torch_threads')} torch threads on "
        f"{env['cpu_count']} CPU cores",
    ]
    if device.type == "cpu":
        lines.append("No GPU here, and that is fine: every notebook of this lab runs on CPU (the defaults are "
                     "sized for 2 cores). For a GPU on Colab: Runtime > Change runtime type > a GPU, then "
                     "run this cell again.")
    else:
        lines.append("A GPU is in use; set KVLAB_DEVICE=cpu before starting Jupyter to run on CPU instead.")
    return "\n".join(lines)
