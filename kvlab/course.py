"""The course around the package: where the repository lives, the notebook sequence, and the setup check.

``REPO_URL`` is the one place the project's address is written; the notebook builder (:mod:`kvlab.authoring`) copies it
into each notebook's badges and first cell, because that cell must install kvlab on Colab before kvlab can be imported.
The pieces every notebook shares (header, setup cell, navigation) are written here once. Each notebook comes in two
editions built from one source: the teacher's copy with saved outputs, and the workshop edition with none, which is
what the badges and the README's course map open (``notebook_path``, ``colab_url``, ``binder_url``).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

# Where the course lives: the one place to change for a fork or a pinned workshop (then rebuild the
# notebooks: `python -m kvlab notebooks`). The badges open REPO_REF and Colab's setup cell installs
# REPO_REF, so the notebook a learner opens and the package it installs are the same commit's.
REPO_URL, REPO_REF = "https://github.com/kvlab/kvlab", "main"

# The two editions of every notebook, built from the one source notebooks/NN_name.py (kvlab.authoring):
# the teacher's copy notebooks/NN_name.ipynb keeps the outputs of the authors' run; the workshop edition
# notebooks/workshop/NN_name.ipynb has none (no answer before the learner predicts), and is the one the
# badges, the README and a learner open.
WORKSHOP_DIR = "workshop"
EDITIONS = ("workshop", "teacher")


@dataclass(frozen=True)
class Lesson:
    """One notebook of the course: its file, title, what it shows, how long it takes, and the modules behind it."""

    file: str  # file name inside notebooks/
    title: str
    shows: str
    minutes: int
    # the experiments it is the lesson of (modules of kvlab.experiments): `pytest -m lNN` runs their tests
    experiments: tuple[str, ...] = ()
    # other kvlab modules outside the lesson's folder behind its outputs: an experiment another lesson teaches or
    # several share (kvlab.experiments.serving_run), code the notebook shows directly (kvlab.traces in 08)
    uses: tuple[str, ...] = ()

    @property
    def package(self) -> str:
        """The lesson's folder, ``kvlab.lessons.lNN_<name>``: its panel, figures, claims, exercises."""
        return f"kvlab.lessons.l{self.file.removesuffix('.ipynb')}"

    @property
    def word_budget(self) -> int:
        """The most words its main path may hold: READING_SHARE of its minutes at READING_WPM."""
        return int(self.minutes * READING_SHARE * READING_WPM)

    @property
    def modules(self) -> tuple[str, ...]:
        """Every kvlab module behind the notebook's outputs: its folder, the lessons' shared frameworks, its
        experiments, ``uses``."""
        return (self.package, "kvlab.lessons.common", *(f"kvlab.experiments.{e}" for e in self.experiments), *self.uses)


# A notebook's minutes cover at least reading its markdown at READING_WPM, its Run All and each exercise at its price
# (kvlab.lessons.common.exercises.EXERCISE_MINUTES, by what it asks for); tests/test_plans.py checks it, and that the
# TEACHING.md plans' slots fit what they name.
READING_WPM = 150  # words per minute: technical prose read with figures beside it
# The main path (kvlab.reading: markdown outside folds and Going deeper sections, plus the claim lines shown
# unfolded) reads at READING_WPM within READING_SHARE of a notebook's minutes; the rest is for running, trying
# the knobs and the exercises (tests/test_reading.py). Depth goes into folds, never into more minutes.
READING_SHARE = 0.4
MAIN_PATH_CLAIMS = 6  # claim lines a notebook shows on its main path; the others in "every check on your run"

# In order. Adding a notebook: its folder kvlab/lessons/lNN_<name>/, its experiments in kvlab/experiments/ and its
# Lesson here; navigation follows this list.
NOTEBOOKS: list[Lesson] = [
    Lesson("00_start_here.ipynb", "Start here",
           "your machine (device, versions, threads), how the lab is laid out, how a panel works", 15,
           uses=("kvlab.course", "kvlab.env", "kvlab.experiments.slowdown")),
    Lesson("01_the_slowdown.ipynb", "The slowdown",
           "without a cache each token takes longer than the last; time per token and cumulative time, "
           "none vs dynamic; expected (work) vs measured ratio", 20, experiments=("slowdown", "long_context")),
    Lesson("02_kv_cache.ipynb", "The KV cache",
           "what K and V are, the cache as K/V tensors per layer, same tokens with and without it, "
           "the memory formula vs measured bytes, a calculator for published models; write the cache yourself; "
           "a real published model where the machine is online", 30, experiments=("memory", "real_model")),
    Lesson("03_cache_strategies.ipynb", "Cache strategies",
           "dynamic, static, quantized (8/4/2 bits) and offloaded side by side on a tiny trained recall model: "
           "memory saved, latency paid, bytes moved, accuracy by bits and by distance; what fixed shapes allow "
           "(torch.compile); a slow link whose transfer time shows in the step; offloading under load (step and "
           "token-gap distributions, on device vs offloaded); which constraint dominates for your workload", 35,
           experiments=("strategies", "cache_accuracy", "offload_load", "static_compile", "transformers_caches",
                        "transformers_steps", "quality", "recall")),
    Lesson("04_four_clocks.ipynb", "The four clocks",
           "one request's journey from arrival to last token with queue wait, TTFT, TPOT and E2E drawn on it; "
           "cold vs warm start measured in a fresh process; why a mean hides the wait (quantiles with n); tokens "
           "are not words: tokens per word by language and tokenizer, and what that does to tokens/s", 25,
           experiments=("four_clocks", "tokens_words"), uses=("kvlab.experiments.serving_run",)),
    Lesson("05_batching.ipynb", "Batching",
           "static vs continuous batching on the same requests, equal and mixed lengths; Gantt charts on one "
           "time axis; what each step's batch holds; the wait-for-a-fuller-batch knob; why batching works "
           "(decode step time and GB/s by batch size, prompts batched); write the admission rule yourself", 30,
           experiments=("batching", "admission", "batch_scaling", "bandwidth"),
           uses=("kvlab.experiments.serving_run",)),
    Lesson("06_under_load.ipynb", "Under load",
           "the service curve (the four clocks, achieved vs offered throughput, failures) for each profile and the "
           "mixture, its knee; a simulator calibrated on your machine checked against the real model; two real "
           "policies where the one with more throughput starts answers later; sent/completed/failed/waiting counts", 25,
           experiments=("service_curves",), uses=("kvlab.experiments.slowdown",)),
    Lesson("07_memory_is_capacity.ipynb", "Memory is capacity",
           "paged blocks vs max-length reservation (sequences that fit, waste of each), counted by hand and by the "
           "engine's block manager; block size and its waste; max context and max new tokens as capacity levers", 30,
           experiments=("capacity",), uses=("kvlab.experiments.serving_run",)),
    Lesson("08_prefix_and_chunks.ipynb", "Preemption, prefixes and chunks",
           "a KV budget that runs out: preemption by recompute and what it costs; prefix caching on a shared system "
           "prompt (blocks reused, a sooner first token); chunked prefill keeping the gaps between tokens steady "
           "when a long prompt arrives; a replayed trace with shared prefixes: ideal vs achieved hit ratio by KV "
           "capacity, caching on vs off on the four clocks", 30,
           experiments=("prefix_and_chunks", "prefix_traces"), uses=("kvlab.experiments.serving_run", "kvlab.traces")),
    Lesson("09_measure_a_real_server.ipynb", "Measure a real server",
           "kvlab's engine behind an OpenAI-compatible HTTP server on loopback, measured at the client; every "
           "request accounted for; client and engine TTFT side by side (what HTTP and streaming add); a service "
           "curve over the wire with 429 backpressure; the same client against transformers' own server on the same "
           "weights (cold and warm, both service curves); the same command against vLLM and other servers", 30,
           experiments=("wire", "two_engines", "three_engines"),
           uses=("kvlab.http.peer", "kvlab.http.shared_checkpoint")),
]


def _github_path() -> str:
    """``owner/name`` of REPO_URL (Colab and Binder open GitHub repositories by that path)."""
    return REPO_URL.removeprefix("https://github.com/").removesuffix(".git").strip("/")


def pip_spec(ref: str | None = None) -> str:
    """What Colab's first cell installs: kvlab with its server extra, from the repository at REPO_REF."""
    return f"kvlab[serve] @ git+{REPO_URL}@{ref or REPO_REF}"


def notebook_path(notebook: str, edition: str = "workshop") -> str:
    """Where ``notebook`` (``NN_name.ipynb``) lies in the repository: the workshop edition or the teacher's copy."""
    if edition not in EDITIONS:
        raise ValueError(f"edition must be one of {EDITIONS}, got {edition!r}")
    return f"notebooks/{WORKSHOP_DIR}/{notebook}" if edition == "workshop" else f"notebooks/{notebook}"


def colab_url(notebook: str, ref: str | None = None, edition: str = "workshop") -> str:
    """Open ``notebook`` on Google Colab, at REPO_REF: the workshop edition (what learners open) by default."""
    return (f"https://colab.research.google.com/github/{_github_path()}/blob/{ref or REPO_REF}/"
            f"{notebook_path(notebook, edition)}")


def binder_url(notebook: str, ref: str | None = None, edition: str = "workshop") -> str:
    """Open ``notebook`` in JupyterLab on mybinder.org, at REPO_REF: the workshop edition by default."""
    return (f"https://mybinder.org/v2/gh/{_github_path()}/{ref or REPO_REF}?urlpath=lab/tree/"
            f"{notebook_path(notebook, edition)}")


def lesson(notebook: str) -> Lesson:
    """The Lesson entry of ``notebook``."""
    for entry in NOTEBOOKS:
        if entry.file == notebook:
            return entry
    raise ValueError(f"{notebook!r} is not in kvlab.course.NOTEBOOKS; add a Lesson for it there")


def setup_cell(ref: str | None = None) -> str:
    """The source of every notebook's first code cell: install kvlab where it does not import (Colab), then report.

    Locally and on Binder kvlab imports, so the cell installs nothing and only reports where it runs. Where the install
    fails (no network, a wrong address) it prints one line that says what to do, never a traceback.
    """
    spec = pip_spec(ref)
    return f'''# Setup: installs kvlab only where it does not import yet (Colab), then says where this notebook runs.
import importlib, subprocess, sys
why = ""
try:
    import kvlab
except ImportError:
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "{spec}"], capture_output=True, text=True)
    why = (pip.stderr.strip().splitlines() or ["pip failed"])[-1] if pip.returncode else ""
    importlib.invalidate_caches()
except Exception as err:
    why = f"{{type(err).__name__}}: {{err}}"
try:
    from kvlab.course import setup_report
    print(setup_report())
except Exception as err:
    print(f"kvlab is not ready ({{why or err}}): check that this runtime is online and run this cell again, "
          f"or install it yourself: pip install '{spec}'")'''


def header(entry: Lesson, number: str) -> str:
    """The top of a notebook: number and title, Colab and Binder badges (to the workshop edition), minutes, what it shows."""
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


def checked_device():
    """The device the lessons will use, and the start-up check's verdict when that is a GPU (else None).

    When ``pick_device()`` gives CUDA, ``kvlab.serving.device_check`` compares it with the CPU first;
    if anything differs or raises, KVLAB_DEVICE is set to "cpu" for this kernel (and the processes it
    starts), so every lesson after the setup cell runs on the CPU. KVLAB_DEVICE_CHECK=0 skips the check.
    """
    from kvlab.device import pick_device

    device = pick_device()
    if device.type != "cuda" or os.environ.get("KVLAB_DEVICE_CHECK") == "0":
        return device, None
    from kvlab.serving.device_check import device_check

    check = device_check(device)
    if not check.ok:
        os.environ["KVLAB_DEVICE"] = "cpu"
        device = pick_device()
    return device, check


def setup_report() -> str:
    """A few lines on where this notebook runs: place, versions, device, threads, and what to do without a GPU."""
    from kvlab.env import environment
    from kvlab.model.lessons import lesson_scale

    device, check = checked_device()
    env = environment()
    v = env["versions"]
    place = where()
    lines = [
        f"running {'on ' + place.capitalize() if place != 'local' else 'locally'} · kvlab {v.get('kvlab')} · "
        f"torch {v.get('torch')} · transformers {v.get('transformers')} · Python {env['python']}",
        f"device: {device} ({env['device'] if device.type == 'cuda' else env.get('cpu', env['device'])}), "
        f"{env.get('torch_threads')} torch threads on {env['cpu_count']} CPU cores",
    ]
    if check is not None and not check.ok:
        lines.append(f"⚠ {check.line()}. So this notebook runs on the CPU, with the CPU sizes (every lesson "
                     "does). To skip the check and use the GPU anyway: KVLAB_DEVICE_CHECK=0, then restart the kernel.")
    elif device.type == "cpu":
        lines.append(_NO_GPU[place])
    else:
        lines.append(f"A GPU is in use ({check.line() if check else 'not checked: KVLAB_DEVICE_CHECK=0'}), so the "
                     f"lessons are sized for it: {lesson_scale(device).describe()}. "
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


def course_map(link_prefix: str = f"notebooks/{WORKSHOP_DIR}/", run_times: bool = True) -> str:
    """The notebook sequence as a markdown table: number, title (a link), what it shows, run time, minutes, total.

    ``link_prefix`` is the path from the page that shows the table to the folder of the edition it links:
    the README links the workshop edition (the default); a notebook gives "" to link its own edition.
    The run time is the one measured when the notebook was last built (2 cores, the authors' machine).
    ``run_times=False`` leaves that column out: notebook 00 shows the table in its saved outputs, which
    a later build of any other notebook (or of 00 itself, still running when it renders) would make stale;
    the README's map, rewritten after every build, is the one place the run times are quoted.
    """
    total = sum(n.minutes for n in NOTEBOOKS)
    if not run_times:
        rows = [f"| {n.file[:2]} | [{n.title}]({link_prefix}{n.file}) | {n.shows} | {n.minutes} |" for n in NOTEBOOKS]
        return ("| # | notebook | what it shows | minutes |\n|---|---|---|---|\n" + "\n".join(rows)
                + f"\n| | **all {len(NOTEBOOKS)} notebooks** | | **{total}** |")
    runs = [run_seconds(n.file) for n in NOTEBOOKS]
    rows = [f"| {n.file[:2]} | [{n.title}]({link_prefix}{n.file}) | {n.shows} | {'–' if s is None else f'{s} s'} | "
            f"{n.minutes} |" for n, s in zip(NOTEBOOKS, runs)]
    total_run = "–" if None in runs else f"{round(sum(s for s in runs if s is not None) / 60)} min"
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
            "Every notebook opens on Colab or Binder from the badges at its top. The links and badges open the "
            "**workshop edition** (`notebooks/workshop/`): no saved outputs, so every prediction and exercise is "
            "the learner's to answer first. The teacher's copy of each, with the outputs of the authors' run, is "
            "beside it in `notebooks/` (e.g. [notebooks/00_start_here.ipynb](notebooks/00_start_here.ipynb)); "
            "both are built from one source by `python -m kvlab notebooks`. "
            "A teacher's plan for a 90-minute or half-day workshop is in "
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
