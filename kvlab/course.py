"""The course around the package: where the repository lives, the notebook sequence, and the setup check.

``REPO_URL`` is the one place the project's address is written; the notebook generator
(scripts/build_notebooks.py) copies it into each notebook's badges and first cell, because that
cell must install kvlab on Colab before kvlab can be imported.
"""
from __future__ import annotations

import os
import sys
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
    Lesson("03_cache_strategies.ipynb", "Cache strategies",
           "dynamic, static, quantized (8/4/2 bits) and offloaded side by side on a tiny trained recall model: "
           "memory saved, latency paid, bytes moved, accuracy by bits and by distance; what fixed shapes allow "
           "(torch.compile); which constraint dominates for your workload", 25),
    Lesson("04_four_clocks.ipynb", "The four clocks",
           "one request's journey from arrival to last token with queue wait, TTFT, TPOT and E2E drawn on it; "
           "cold vs warm start measured in a fresh process; why a mean hides the wait (quantiles with n)", 20),
    Lesson("05_batching.ipynb", "Batching",
           "static vs continuous batching on the same requests, equal and mixed lengths; Gantt charts on one "
           "time axis; what each step's batch holds; the wait-for-a-fuller-batch knob", 20),
    Lesson("06_under_load.ipynb", "Under load",
           "the service curve (the four clocks, achieved vs offered throughput, failures) for each profile and the "
           "mixture, its knee; a simulator calibrated on your machine checked against the real model; two real "
           "policies where the one with more throughput starts answers later; sent/completed/failed/waiting counts", 25),
    Lesson("07_memory_is_capacity.ipynb", "Memory is capacity",
           "paged blocks vs max-length reservation (sequences that fit, waste of each); block size; max context "
           "and max new tokens as levers; preemption; prefix caching; chunked prefill", 25),
    Lesson("08_measure_a_real_server.ipynb", "Measure a real server",
           "kvlab's engine behind an OpenAI-compatible HTTP server on loopback, measured at the client; every "
           "request accounted for; client and engine TTFT side by side (what HTTP and streaming add); a service "
           "curve over the wire with 429 backpressure; the same command against vLLM and other servers", 20),
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


def setup_cell(ref: str = REPO_REF) -> str:
    """The source of every notebook's first code cell: install kvlab where it is missing (Colab), then report.

    Locally and on Binder kvlab is already installed, so the cell only reports where it runs.
    """
    return f'''# Setup: runs as is locally, on Binder and on Colab (where it first installs kvlab).
import importlib, importlib.util, subprocess, sys
if importlib.util.find_spec("kvlab") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "{pip_spec(ref)}"])
    importlib.invalidate_caches()
import kvlab
from kvlab.course import setup_report
print(setup_report())'''


def where() -> str:
    """Where this kernel runs: "colab", "binder" or "local" (from the markers Colab and mybinder.org set)."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG"):
        return "colab"
    if any(os.environ.get(k) for k in ("BINDER_LAUNCH_HOST", "BINDER_REQUEST", "BINDER_SERVICE_HOST")):
        return "binder"
    return "local"


_NO_GPU = {
    "colab": "This Colab runtime has no GPU, and that is fine: every notebook of this lab runs on CPU. "
             "For a GPU: Runtime > Change runtime type > a GPU (e.g. T4), then run the notebook again from the top.",
    "binder": "Binder machines have no GPU, and that is fine: every notebook of this lab runs on CPU (the "
              "defaults are sized for 2 cores). For a GPU, open this notebook on Colab (badge at the top) and "
              "choose Runtime > Change runtime type > a GPU.",
    "local": "No GPU found, and that is fine: every notebook of this lab runs on CPU (the defaults are sized "
             "for 2 cores). For a GPU: on a machine with an NVIDIA GPU install a CUDA build of torch, or open "
             "this notebook on Colab (badge at the top) and choose Runtime > Change runtime type > a GPU.",
}


def setup_report() -> str:
    """A few lines on where this notebook runs: place, versions, device, threads, and what to do without a GPU."""
    from .device import pick_device
    from .env import environment

    env = environment()
    device = pick_device()
    v = env["versions"]
    place = where()
    lines = [
        f"running {'on ' + place.capitalize() if place != 'local' else 'locally'} · kvlab {v.get('kvlab')} · "
        f"torch {v.get('torch')} · transformers {v.get('transformers')} · Python {env['python']}",
        f"device: {device} ({env['device']}), {env.get('torch_threads')} torch threads on "
        f"{env['cpu_count']} CPU cores",
    ]
    if device.type == "cpu":
        lines.append(_NO_GPU[place])
    else:
        lines.append("A GPU is in use; set KVLAB_DEVICE=cpu before starting Jupyter to run on CPU instead.")
    return "\n".join(lines)


# --- the course map in the README ----------------------------------------------------------------

COURSE_MAP_HEADING = "## Course map"


def course_map(link_prefix: str = "notebooks/") -> str:
    """The notebook sequence as a markdown table: number, title (a link), what it shows, minutes, and the total.

    ``link_prefix`` is the path from the page that shows the table to notebooks/ ("" inside notebooks/).
    """
    rows = [f"| {n.file[:2]} | [{n.title}]({link_prefix}{n.file}) | {n.shows} | {n.minutes} |" for n in NOTEBOOKS]
    total = sum(n.minutes for n in NOTEBOOKS)
    return ("| # | notebook | what it shows | minutes |\n|---|---|---|---|\n" + "\n".join(rows)
            + f"\n| | **all {len(NOTEBOOKS)} notebooks** | | **{total}** |")


def course_map_section() -> str:
    """The README's whole "## Course map" section, generated from NOTEBOOKS (scripts/course_map.py writes it)."""
    return (f"{COURSE_MAP_HEADING}\n\n"
            "<!-- generated from kvlab.course.NOTEBOOKS by `python scripts/course_map.py`; edit NOTEBOOKS, "
            "then run it -->\n"
            "The notebooks, in order. Each runs in about a minute on 2 CPU cores; the minutes are reading "
            "and trying time. Every notebook opens on Colab or Binder from the badges at its top; "
            "a teacher's plan for a 90-minute or half-day workshop is in "
            "[notebooks/TEACHING.md](notebooks/TEACHING.md).\n\n"
            f"{course_map()}\n")


def readme_course_map(readme: str) -> str | None:
    """The "## Course map" section of ``readme`` (up to the next "## " heading), or None when absent."""
    lines = readme.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip() == COURSE_MAP_HEADING]
    if not starts:
        return None
    end = next((j for j in range(starts[0] + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    return "".join(lines[starts[0]:end]).rstrip("\n") + "\n"


def with_course_map(readme: str, before: str = "## The lab in ten lines") -> str:
    """``readme`` with its course map section replaced by (or, when absent, inserted as) ``course_map_section()``."""
    section = course_map_section()
    current = readme_course_map(readme)
    if current is not None:
        return readme.replace(current, section, 1)
    if before in readme:
        return readme.replace(before, f"{section}\n{before}", 1)
    return readme.rstrip("\n") + "\n\n" + section
