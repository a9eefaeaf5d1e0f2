"""The course around the package: where the repository lives, the notebook sequence, and the setup check.

``REPO_URL`` is the one place the project's address is written; the notebook builder
(:mod:`kvlab.authoring`) copies it into each notebook's badges and first cell, because that
cell must install kvlab on Colab before kvlab can be imported. The pieces every notebook shares
(header, setup cell, navigation) are written here once.
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
    """One notebook of the course: its file, title, what it shows, how long it takes, and the modules behind it."""

    file: str  # file name inside notebooks/
    title: str
    shows: str
    minutes: int
    # the kvlab modules the notebook runs (experiments, then plots, then widgets), so a reader of
    # 06_under_load finds kvlab.experiments.load without searching; tests/test_course.py imports each
    modules: tuple[str, ...] = ()


# In order. Engineers adding a notebook append its Lesson here; navigation links follow this list.
NOTEBOOKS: list[Lesson] = [
    Lesson("00_start_here.ipynb", "Start here",
           "your machine (device, versions, threads), how the lab is laid out, how a panel works", 10,
           modules=("kvlab.course", "kvlab.env", "kvlab.widgets.panel")),
    Lesson("01_the_slowdown.ipynb", "The slowdown",
           "without a cache each token takes longer than the last; time per token and cumulative time, "
           "none vs dynamic; expected (work) vs measured ratio", 15,
           modules=("kvlab.experiments.slowdown", "kvlab.plots.slowdown", "kvlab.widgets.slowdown")),
    Lesson("02_kv_cache.ipynb", "The KV cache",
           "what K and V are, the cache as K/V tensors per layer, same tokens with and without it, "
           "the memory formula vs measured bytes, a calculator for published models; write the cache yourself; "
           "a real published model where the machine is online", 25,
           modules=("kvlab.experiments.memory", "kvlab.plots.memory", "kvlab.widgets.memory",
                    "kvlab.experiments.real_model", "kvlab.claims.c02_kv_cache", "kvlab.exercises.ex02_kv_cache")),
    Lesson("03_cache_strategies.ipynb", "Cache strategies",
           "dynamic, static, quantized (8/4/2 bits) and offloaded side by side on a tiny trained recall model: "
           "memory saved, latency paid, bytes moved, accuracy by bits and by distance; what fixed shapes allow "
           "(torch.compile); a slow link whose transfer time shows in the step; offloading under load (step and "
           "token-gap distributions, on device vs offloaded); which constraint dominates for your workload", 30,
           modules=("kvlab.experiments.strategies", "kvlab.experiments.cache_accuracy",
                    "kvlab.experiments.static_compile", "kvlab.plots.strategies", "kvlab.widgets.strategies",
                    "kvlab.experiments.offload_load", "kvlab.plots.offload_load")),
    Lesson("04_four_clocks.ipynb", "The four clocks",
           "one request's journey from arrival to last token with queue wait, TTFT, TPOT and E2E drawn on it; "
           "cold vs warm start measured in a fresh process; why a mean hides the wait (quantiles with n); tokens "
           "are not words: tokens per word by language and tokenizer, and what that does to tokens/s", 25,
           modules=("kvlab.experiments.four_clocks", "kvlab.plots.journey", "kvlab.plots.distribution",
                    "kvlab.plots.startup", "kvlab.plots.gantt", "kvlab.widgets.four_clocks",
                    "kvlab.experiments.tokens_words", "kvlab.plots.tokens")),
    Lesson("05_batching.ipynb", "Batching",
           "static vs continuous batching on the same requests, equal and mixed lengths; Gantt charts on one "
           "time axis; what each step's batch holds; the wait-for-a-fuller-batch knob; why batching works "
           "(decode step time and GB/s by batch size, prompts batched); write the admission rule yourself", 30,
           modules=("kvlab.experiments.batching", "kvlab.plots.gantt", "kvlab.plots.batches", "kvlab.plots.policies",
                    "kvlab.widgets.batching", "kvlab.experiments.batch_scaling", "kvlab.plots.batch_scaling",
                    "kvlab.experiments.admission")),
    Lesson("06_under_load.ipynb", "Under load",
           "the service curve (the four clocks, achieved vs offered throughput, failures) for each profile and the "
           "mixture, its knee; a simulator calibrated on your machine checked against the real model; two real "
           "policies where the one with more throughput starts answers later; sent/completed/failed/waiting counts", 25,
           modules=("kvlab.experiments.load", "kvlab.plots.load", "kvlab.widgets.load")),
    Lesson("07_memory_is_capacity.ipynb", "Memory is capacity",
           "paged blocks vs max-length reservation (sequences that fit, waste of each), counted by hand and by the "
           "engine's block manager; block size and its waste; max context and max new tokens as capacity levers", 15,
           modules=("kvlab.experiments.capacity", "kvlab.plots.capacity", "kvlab.widgets.paged_capacity")),
    Lesson("08_prefix_and_chunks.ipynb", "Preemption, prefixes and chunks",
           "a KV budget that runs out: preemption by recompute and what it costs; prefix caching on a shared system "
           "prompt (blocks reused, a sooner first token); chunked prefill keeping the gaps between tokens steady "
           "when a long prompt arrives; a replayed trace with shared prefixes: ideal vs achieved hit ratio by KV "
           "capacity, caching on vs off on the four clocks", 20,
           modules=("kvlab.experiments.capacity", "kvlab.plots.kv_blocks", "kvlab.plots.gantt",
                    "kvlab.plots.token_gaps", "kvlab.widgets.capacity", "kvlab.traces",
                    "kvlab.experiments.prefix_traces", "kvlab.plots.prefix_traces", "kvlab.widgets.prefix_traces")),
    Lesson("09_measure_a_real_server.ipynb", "Measure a real server",
           "kvlab's engine behind an OpenAI-compatible HTTP server on loopback, measured at the client; every "
           "request accounted for; client and engine TTFT side by side (what HTTP and streaming add); a service "
           "curve over the wire with 429 backpressure; the same command against vLLM and other servers", 20,
           modules=("kvlab.experiments.wire", "kvlab.plots.wire", "kvlab.widgets.wire")),
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


def header(entry: Lesson, number: str) -> str:
    """The top of a notebook: number and title, Colab and Binder badges, minutes and what it shows."""
    return (f"# {number} · {entry.title}\n\n"
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(entry.file)}) "
            f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder_url(entry.file)})\n\n"
            f"*About {entry.minutes} minutes. {entry.shows[0].upper()}{entry.shows[1:]}.*")


def navigation(entry: Lesson) -> str:
    """The bottom of a notebook: links to the previous and the next one."""
    i = [n.file for n in NOTEBOOKS].index(entry.file)
    prev = f"[← {NOTEBOOKS[i - 1].title}]({NOTEBOOKS[i - 1].file})" if i > 0 else "(this is the first notebook)"
    nxt = (f"[{NOTEBOOKS[i + 1].title} →]({NOTEBOOKS[i + 1].file})" if i + 1 < len(NOTEBOOKS)
           else "the next notebooks are listed in the [course map](../README.md#course-map)")
    return f"---\n**Previous:** {prev} · **Next:** {nxt}"


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
    from .device import lesson_scale, pick_device
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
        lines.append(f"A GPU is in use, so the lessons are sized for it: {lesson_scale(device).describe()}. "
                     "Set KVLAB_DEVICE=cpu before starting Jupyter to run on CPU (with the CPU sizes) instead.")
    return "\n".join(lines)


# --- the course map in the README ----------------------------------------------------------------

COURSE_MAP_HEADING = "## Course map"


def run_seconds(notebook: str) -> int | None:
    """How long ``notebook`` took to run top to bottom when it was last built (``python -m kvlab notebooks``).

    Read from the saved notebook's metadata, where the builder records the seconds and the machine's
    core count; None outside a checkout (an installed package has no notebooks folder).
    """
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "notebooks" / notebook
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("kvlab", {})
    except (OSError, ValueError):
        return None
    return meta.get("run_s")


def course_map(link_prefix: str = "notebooks/") -> str:
    """The notebook sequence as a markdown table: number, title (a link), what it shows, run time, minutes, total.

    ``link_prefix`` is the path from the page that shows the table to notebooks/ ("" inside notebooks/).
    The run time is the one measured when the notebook was last built (2 cores, the authors' machine).
    """
    def run(n: Lesson) -> str:
        s = run_seconds(n.file)
        return "–" if s is None else f"{s} s"

    rows = [f"| {n.file[:2]} | [{n.title}]({link_prefix}{n.file}) | {n.shows} | {run(n)} | {n.minutes} |"
            for n in NOTEBOOKS]
    runs = [run_seconds(n.file) for n in NOTEBOOKS]
    total_run = "–" if None in runs else f"{round(sum(runs) / 60)} min"
    total = sum(n.minutes for n in NOTEBOOKS)
    return ("| # | notebook | what it shows | run time | minutes |\n|---|---|---|---|---|\n" + "\n".join(rows)
            + f"\n| | **all {len(NOTEBOOKS)} notebooks** | | **{total_run}** | **{total}** |")


def course_map_section() -> str:
    """The README's whole "## Course map" section, generated from NOTEBOOKS (scripts/course_map.py writes it)."""
    return (f"{COURSE_MAP_HEADING}\n\n"
            "<!-- generated from kvlab.course.NOTEBOOKS by `python scripts/course_map.py`; edit NOTEBOOKS, "
            "then run it -->\n"
            "The notebooks, in order. *Run time* is how long Run All took when the notebook was last built, on "
            "the authors' machine (2 CPU cores; `python -m kvlab notebooks` records it); *minutes* is what a "
            "workshop should plan per notebook: reading, pressing Run, trying the knobs and the exercises. "
            "Every notebook opens on Colab or Binder from the badges at its top; "
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
