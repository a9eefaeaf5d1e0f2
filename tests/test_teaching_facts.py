"""Every number and every direction notebooks/TEACHING.md states outside its generated parts has a source of truth.

TEACHING.md quotes no measured number (the course rule); what it does state is one of:

- a setting of the code (a default, a constant, a rung of a ladder): its row reads it from the code;
- a measured *direction* (X sooner than Y, rises, falls): its row reads the teacher's copy's saved outputs
  (``notebooks/NN_name.ipynb``) and checks the direction, never a typed number, so a re-run that keeps the
  direction passes and one that flips it fails (``test_a_flipped_direction_in_a_saved_output_fails``);
- something the text says the learner's run checks: its row checks that the claim exists and asserts.

``FACTS`` is the table: (a phrase of TEACHING.md, how to check it). A maintainer adding a sentence with a number
or a direction adds a row. ``test_every_number_in_teaching_is_covered`` scans TEACHING.md (outside the generated
parts: the hold-rates paragraph and the claims table's nb/quiet/loaded columns, which
tests/test_teaching_record.py checks) for every token with a digit and fails for one that lies in no row's phrase
and no ``ALLOWED`` phrase (names, versions, examples, plan times tests/test_plans.py checks). Reads files only.
"""
from __future__ import annotations

import functools
import html
import inspect
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, NamedTuple

import nbformat
import pytest

LESSONS = ("01", "02", "03", "04", "05", "08", "09")  # the lessons these tests belong to: `pytest -m lNN`

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
TEACHING = NB_DIR / "TEACHING.md"
sys.path.insert(0, str(ROOT / "tests"))


# -- reading TEACHING.md and the saved outputs ----------------------------------------------------------------


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@functools.lru_cache(maxsize=1)
def teaching() -> str:
    """TEACHING.md with its generated parts blanked, whitespace folded (so a rewrap keeps the phrases)."""
    text = TEACHING.read_text(encoding="utf-8")
    a, b = text.index("<!-- kvlab:hold-rates -->"), text.index("<!-- /kvlab:hold-rates -->")
    text = text[:a] + text[b:]
    lines = []
    for line in text.splitlines():
        if re.match(r"^\| `\w+` \| \d\d \|", line):  # a claims-table row: nb and the four rates are
            cells = line.split("|")  # checked elsewhere (tests/test_teaching_record.py)
            line = "|".join(cells[:2] + [" "] * 5 + cells[7:])
        lines.append(line)
    return _flat("\n".join(lines))


def file(nb: str) -> Path:
    return next(NB_DIR.glob(f"{nb}_*.ipynb"))


def source(nb: str) -> str:
    return next(NB_DIR.glob(f"{nb}_*.py")).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def notebook(nb: str):
    return nbformat.read(file(nb), as_version=4)


def _cell_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.text)
        elif "data" in o:
            d = o.data
            parts.append(html.unescape(re.sub(r"<[^>]+>", " ", d["text/html"])) if "text/html" in d
                         else d.get("text/plain", ""))
    return _flat(" ".join(parts))


@functools.lru_cache(maxsize=None)
def out(nb: str) -> str:
    """Every saved output of notebook ``nb`` as one line of text (HTML tags stripped)."""
    return " ".join(_cell_text(c) for c in notebook(nb).cells if c.cell_type == "code")


def verdict(text: str, pattern: str) -> re.Match:
    """The ✓ line of ``text`` matching ``pattern`` (a regex; numbers are captured by the caller's groups)."""
    m = re.search(r"✓ on your run: [^✓✗•]*?" + pattern, text)
    assert m, f"no ✓ line matching {pattern!r} in the saved output"
    return m


def observation(text: str, pattern: str) -> re.Match:
    m = re.search(r"• on your run: [^✓✗•]*?" + pattern, text)
    assert m, f"no • line matching {pattern!r} in the saved output"
    return m


def f(s: str) -> float:
    return float(s.replace(",", ""))


NUM = r"([\d,]+(?:\.\d+)?)"


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append(_flat("".join(self._cell)))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def table(nb: str, *columns: str) -> list[dict[str, str]]:
    """The rows of the first saved HTML table of ``nb`` whose header holds ``columns``, as dicts by header."""
    for cell in notebook(nb).cells:
        for o in cell.get("outputs", []):
            h = o.get("data", {}).get("text/html")
            if not h:
                continue
            p = _Tables()
            p.feed(h)
            for rows in p.tables:
                if rows and all(c in rows[0] for c in columns):
                    head = rows[0]
                    return [dict(zip(head, r)) for r in rows[1:] if len(r) == len(head)]
    raise AssertionError(f"no saved table of {nb} has the columns {columns}")


def exercise(nb: str, n: int) -> str:
    """The name of exercise ``n`` (1-based) of notebook ``nb``, in the order its source places them."""
    return re.findall(r"<!-- kvlab:exercise (\w+) -->", source(nb))[n - 1]


def claims(nb: str, clock: str | None = None):
    from kvlab.lessons import CLAIMS

    return {c.name: c for c in CLAIMS.values() if c.notebook.startswith(nb) and (clock is None or c.clock == clock)}


# -- the checks: code -----------------------------------------------------------------------------------------


def exercises_per_notebook():
    from kvlab.course import NOTEBOOKS
    from kvlab.lessons import EXERCISES

    counts = [sum(e.notebook == n.file for e in EXERCISES.values()) for n in NOTEBOOKS]
    assert (min(counts), max(counts)) == (2, 4), counts


def setup_cells_install_repo_ref():
    from kvlab.course import NOTEBOOKS, REPO_REF, colab_url, pip_spec

    assert pip_spec().startswith("kvlab[serve] @ git+") and pip_spec().endswith(f"@{REPO_REF}")
    for n in NOTEBOOKS:
        for path in (NB_DIR / n.file, NB_DIR / "workshop" / n.file):
            cells = nbformat.read(path, as_version=4).cells
            setup = next(c for c in cells if c.cell_type == "code")
            assert f'"{pip_spec()}"' in setup.source, f"{path}: its setup cell does not install {pip_spec()}"
            assert colab_url(n.file) in "".join(c.source for c in cells if c.cell_type == "markdown"), path


def repo_ref_is_main():
    from kvlab.course import REPO_REF

    assert REPO_REF == "main", "TEACHING.md says the badges and the setup cell use `main` as shipped"


def binder_link_to_a_tag():
    from kvlab.course import binder_url

    url = binder_url("00_start_here.ipynb", ref="v0.1.0")
    assert f"`{url}`" in teaching(), url


def plan_90_names_five_notebooks_and_one_cell_of_06():
    from test_plans import plan

    rows = [r for r in plan("## A 90-minute workshop") if r[1] is not None]
    assert [n for _, n, _ in rows] == ["00", "01", "02", "04", "05", "06"]
    assert rows[-1][2].split("|")[0].count(";") == 0, "06's slot names more than one section"


def long_tail_lesson_workload():
    """05's mixed answers: 16 requests, long-tailed, the longest in the first half with the lesson's
    shuffle, the last request with shuffle 0 (what the guide says to try)."""
    from kvlab.experiments.batching import LESSON_REQUESTS, LESSON_SHUFFLE
    from kvlab.workload import policy_workload

    def order(seed: int) -> list[int]:
        return [r.max_new_tokens for r in policy_workload(320, "mixed", LESSON_REQUESTS, seed=seed,
                                                          outputs="long_tail")]

    assert LESSON_REQUESTS == 16
    mine, zero = order(LESSON_SHUFFLE), order(0)
    assert max(mine) in mine[:LESSON_REQUESTS // 2] and max(zero) == zero[-1], (mine, zero)


def reading_rate():
    from kvlab.course import READING_WPM
    from kvlab.lessons.common.exercises import EXERCISE_MINUTES

    assert READING_WPM == 150 and EXERCISE_MINUTES == {"choice": 2, "number": 3, "function": 6, "build": 12}


def three_misconceptions():
    body = teaching().split("## Common questions and misconceptions", 1)[1].split("Other questions that come up", 1)[0]
    assert len(re.findall(r"\*\*[^*]+\.\*\*", body)) == 3


def run_all_under_a_tenth_of_the_minutes():
    from kvlab.course import NOTEBOOKS

    for n in NOTEBOOKS:
        meta = json.loads((NB_DIR / n.file).read_text())["metadata"]["kvlab"]
        assert meta["cpu_count"] == 2, (n.file, meta["cpu_count"])
        assert meta["run_s"] <= 0.1 * 60 * n.minutes, (n.file, meta["run_s"], n.minutes)


def cpu_prompt_of_32():
    from kvlab.model.lessons import LESSON_SCALES

    assert LESSON_SCALES["cpu"].prompt_tokens == 32 < LESSON_SCALES["cuda"].prompt_tokens
    assert "prompt_tokens" not in re.search(r"slowdown_panel\((.*)\)", source("00")).group(1)
    verdict(out("00"), r"the prefill of 32 tokens took")


def which_notebooks_time_the_real_model():
    from kvlab.course import NOTEBOOKS

    wall = {n.file[:2] for n in NOTEBOOKS if claims(n.file[:2], "wall")}
    assert wall == {n.file[:2] for n in NOTEBOOKS} - {"07"}, sorted(wall)


def which_notebooks_use_a_virtual_clock():
    for nb in ("04", "05", "06", "08"):
        assert 'clock="virtual"' in source(nb) or "virtual time" in source(nb), nb


def lines_red_none_blue_dynamic_left_right():
    from kvlab.lessons.common.figure_style import CACHE_COLORS
    from kvlab.lessons.l01_the_slowdown import figures

    assert (CACHE_COLORS["none"], CACHE_COLORS["dynamic"]) == ("#d62728", "#1f77b4")  # red, blue
    assert "ax_step, ax_total = fig.subplots(1, 2)" in inspect.getsource(figures)


def two_query_heads_per_kv_head():
    import kvlab

    cfg = kvlab.tiny_llama()
    assert cfg.num_heads == 2 * cfg.num_kv_heads and "kvlab.tiny_llama()" in source("02")


def llama_2_vs_3_heads():
    from kvlab import PUBLISHED_CONFIGS

    a, b = PUBLISHED_CONFIGS["Llama-2-7B (MHA)"], PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
    assert (a.num_kv_heads, b.num_kv_heads) == (32, 8) and (a.num_layers, a.head_dim) == (b.num_layers, b.head_dim)
    from kvlab.experiments.memory import published_kv_table

    table = published_kv_table()  # the table notebook 02 shows (folded until the learner predicts)
    assert table.at["Llama-2-7B (MHA)", "KiB per token"] == 4 * table.at["Llama-3-8B (GQA)", "KiB per token"]
    assert "published_kv_table(" in source("02") and "KiB per token" in out("02")


def dashed_line_is_the_room_left():
    from kvlab.lessons.l02_kv_cache.figures import plot_kv_memory

    src = inspect.getsource(plot_kv_memory)
    assert 'room = gpu - table["weights_gib"]' in src and 'ax.axhline(room, color="black", ls="--"' in src


def quantized_default_has_no_window():
    from kvlab.lessons.l03_cache_strategies.panel import strategies_panel
    from kvlab.experiments.strategies import DEFAULT_LINK_GBPS

    p = inspect.signature(strategies_panel).parameters
    assert p["residual"].default == 0 and p["link_gbps"].default == DEFAULT_LINK_GBPS
    assert 8 in p["bits"].default, "TEACHING.md suggests 8 bits: one of the panel's bit widths"
    assert "quantized(bits=8, residual=0" in out("03")


def slower_tier_is_a_file_and_the_link_waits():
    from kvlab.cache.offloaded import wait_for_link
    from kvlab.lessons.l03_cache_strategies.figures import plot_offload_cost
    from kvlab.model.lessons import LESSON_SCALES

    assert LESSON_SCALES["cpu"].offload_tier.startswith("a memory-mapped file")
    assert "deadline" in inspect.getsource(wait_for_link)
    assert "the least a step over that link can take" in inspect.getsource(plot_offload_cost)


def gpu_caveat_in_03():
    assert "On a GPU other kernels round differently" in _flat(source("03").replace("# ", " "))


def two_batch_slots():
    from kvlab.experiments.four_clocks import run_mixed_load

    p = inspect.signature(run_mixed_load).parameters
    assert p["max_seqs"].default == 2 and p["burstiness"].default < 1  # below 1: clumps
    assert "mixed = run_mixed_load(model)" in source("04")


def eleven_languages():
    from kvlab.experiments.tokens_words import load_samples

    assert sum(s.kind == "prose" for s in load_samples()) == 11


def journey_colours():
    from kvlab.lessons.common.gantt import SEGMENT_COLORS
    from kvlab.lessons.l04_four_clocks import figures as figures_journey

    assert (SEGMENT_COLORS["queued"], SEGMENT_COLORS["prefill"]) == ("#d9d9d9", "#ff7f0e")  # grey, orange
    assert figures_journey.EVENT_STYLE["first_token_s"][0] == "*"
    assert 'marker="|"' in inspect.getsource(figures_journey)


def batch_wait_panels():
    from kvlab.lessons.l05_batching.figures import plot_batch_wait

    assert "ax_ttft, ax_work = fig.subplots(1, 2)" in inspect.getsource(plot_batch_wait)  # left TTFT, right work


def red_triangles_are_preemptions():
    from kvlab.lessons.l08_prefix_and_chunks import figures as figures_kv_blocks

    assert 'marker="v", color="#d62728"' in inspect.getsource(figures_kv_blocks)


def mooncake_format():
    import kvlab.traces

    assert "Mooncake" in inspect.getsource(kvlab.traces) and "hash_ids" in inspect.getsource(kvlab.traces)


def panels_take_the_fastest_of_several():
    from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel

    assert inspect.signature(slowdown_panel).parameters["repeats"].default >= 2


def tie_is_a_tenth():
    from kvlab.lessons.common.checks import TIE

    assert TIE == 0.10


def every_asserting_wall_claim_has_a_counterexample():
    from claim_examples import COUNTEREXAMPLES
    from kvlab.lessons import CLAIMS

    assert set(COUNTEREXAMPLES) == {c.name for c in CLAIMS.values() if c.clock == "wall" and c.asserts}


def the_constructed_x_is_rendered_from_the_counterexample():
    from claim_examples import counterexample_of
    from kvlab.lessons import CLAIMS

    c = CLAIMS["uncached_tokens_slow_down"]
    assert c.asserts and c.clock == "wall"
    block = TEACHING.read_text(encoding="utf-8").split("```\n", 2)[1].strip()
    assert block == str(c.on(counterexample_of(c)(None))), "re-render the ✗ example in TEACHING.md"


def observations_not_asserted():
    from kvlab.lessons import CLAIMS

    for name in ("compiled_step_is_faster", "slow_link_time_shows_in_the_step", "slow_link_cost_grows_with_bytes"):
        assert not CLAIMS[name].asserts, name


def rates_of_the_two_engines():
    from kvlab.lessons.l09_measure_a_real_server.panel import two_engines_panel
    from kvlab.experiments.two_engines import SWEEP_RATES

    assert SWEEP_RATES == (8, 24, 48)
    assert inspect.signature(two_engines_panel).parameters["rates"].default == SWEEP_RATES
    call = re.search(r"two_engines_panel\((.*)\)", source("09")).group(1)
    assert "rates" not in call or "rates=(8, 24, 48)" in call, call


def compile_budget():
    from kvlab.experiments.static_compile import COMPILE_BUDGET_S, not_started_message

    assert COMPILE_BUDGET_S["cpu"] is None and COMPILE_BUDGET_S["cuda"]
    assert "try_compiled_decode(budget_s=120)" in not_started_message()


def gpu_example_sizes_of_01():
    from claim_examples.l01_the_slowdown import example_sizes
    from kvlab.model.lessons import LESSON_SCALES

    gpu = LESSON_SCALES["cuda"]
    assert example_sizes(gpu) == dict(prompt_tokens=gpu.prompt_tokens, max_new_tokens=gpu.max_new_tokens)


def binder_pins():
    env = (ROOT / "binder" / "environment.yml").read_text()
    req = (ROOT / "requirements.txt").read_text()
    torch = re.search(r"^torch==(\S+)", req, re.M).group(1)
    assert f"pytorch-cpu={torch}" in env
    for name, ver in re.findall(r"^\s+- ([\w-]+)==(\S+)", env, re.M):
        assert re.search(rf"^{re.escape(name)}=={re.escape(ver)}$", req, re.M), f"binder pins {name}=={ver}"
    assert re.search(r"^ipywidgets==8\.", req, re.M)
    assert "pip install" in (ROOT / "binder" / "postBuild").read_text()


def torch_is_a_lower_bound_and_widgets_7_or_8():
    py = (ROOT / "pyproject.toml").read_text()
    torch = re.search(r'"torch([^"]*)"', py).group(1)
    assert torch.startswith(">=") and "<" not in torch and "==" not in torch, torch
    assert '"ipywidgets>=7.7.1,<9"' in py


def classic_notebook_pins():
    src = (ROOT / "tests" / "test_browser_classic.py").read_text()
    assert 'NBEXTENSION_VERSION = "3.6.6"' in src and "3.6.10" in src


def browser_screenshots():
    src = (ROOT / "tests" / "test_browser.py").read_text()
    assert 'SCREENSHOTS = ARTIFACTS / "screenshots"' in src and 'ROOT / "test-artifacts"' in src


def matplotlib_inline_in_03_to_09():
    for nb in ("03", "04", "05", "06", "07", "08", "09"):
        assert "# %matplotlib inline" in source(nb), nb


def panel_and_predict_take_keywords():
    from kvlab.lessons.common.panel import ExperimentPanel
    from kvlab.lessons.common.predict import predict

    assert "value" in inspect.signature(predict).parameters
    assert "**values" in str(inspect.signature(ExperimentPanel.run))


def servers_of_09():
    from kvlab.http import peer
    from kvlab.experiments import wire

    assert wire.LOOPBACK == "127.0.0.1" and "atexit.register(server.stop)" in inspect.getsource(wire.start_server)
    section7 = source("09").split("# ## 7. Stop the server", 1)[1]
    assert "srv.stop()" in section7.split("# ## ", 1)[0]
    ps = re.compile(r"(kvlab|transformers) serve")
    assert ps.search(" ".join(["python", "-m", peer.TRANSFORMERS_CLI, "serve"])) and ps.search("python -m kvlab serve")


def slow_machine_quotes_are_the_claims_words():
    from kvlab.lessons import CLAIMS

    part = teaching().split("**A machine too slow for the lesson sizes.**", 1)[1].split("## Running a room", 1)[0]
    said = {c.notebook[:2]: [] for c in CLAIMS.values()}
    for c in CLAIMS.values():
        said[c.notebook[:2]].append(_flat(c.otherwise).lower())
    everything = " ".join(" ".join(v) for v in said.values())
    for nb, quote in re.findall(r"(\d\d)'s [\w -]+ \(\"([^\"]+)\"\)", part):
        assert any(quote.lower() in s for s in said[nb]), (nb, quote)
    for quote in re.findall(r"\"([^\"]+)\"", part.split("say so after the dash", 1)[1].split("A few name", 1)[0]):
        assert quote.lower() in everything, quote


def lesson_sizes_for_2_cores():
    from kvlab.model.lessons import LessonScale

    assert "sized for 2 cores" in LessonScale.__doc__


def sample_room_of_30():
    from kvlab.room.simulate import simulated_room

    room = json.loads((NB_DIR / "room" / "sample_room.json").read_text())
    assert len({s["run"]["learner"] for s in room["submissions"]}) == 30
    assert inspect.signature(simulated_room).parameters["n"].default == 30


def ports_and_queue():
    import argparse

    from kvlab.http.server import add_arguments as serve_args
    from kvlab.room.collector import add_arguments as room_args

    serve, room = argparse.ArgumentParser(), argparse.ArgumentParser()
    serve_args(serve)
    room_args(room)
    s, r = serve.parse_args([]), room.parse_args([])
    assert (r.port, s.port, s.max_waiting) == (8100, 8000, 64)


def room_error_and_knee():
    from kvlab.room import view

    assert 'frame["guess_over_measured"] = frame["guess"] / frame["measured"]' in inspect.getsource(view)
    p = inspect.signature(view.RoomView.service_curve).parameters if hasattr(view, "RoomView") else None
    if p is None:
        cls = next(v for v in vars(view).values() if inspect.isclass(v) and hasattr(v, "service_curve"))
        p = inspect.signature(cls.service_curve).parameters
    assert (p["min_served"].default, p["slo_ttft_s"].default) == (0.9, 1.0)


def exercise_is(nb: str, n: int, name: str) -> Callable[[], None]:
    def check() -> None:
        assert exercise(nb, n) == name, (nb, n, exercise(nb, n))
    return check


def claim_shown(nb: str, *names: str) -> Callable[[], None]:
    def check() -> None:
        have = claims(nb)
        for name in names:
            assert name in have and not have[name].asserts, f"{name} is not an observation of {nb}"
    return check


def claim_asserts(nb: str, *names: str) -> Callable[[], None]:
    def check() -> None:
        have = claims(nb)
        for name in names:
            assert name in have and have[name].asserts, f"{name} is not an asserting claim of {nb}"
    return check


# -- the checks: directions in the saved outputs ------------------------------------------------------------
# Each takes the output text (default: the teacher's copy's) so test_a_flipped_direction... can feed a doctored one.


def uncached_climbs_cached_flat(text: str | None = None):
    rows = {r["cache"]: r for r in table("01", "measured_ratio", "work_ratio")}
    assert f(rows["none"]["measured_ratio"]) > f(rows["dynamic"]["measured_ratio"])
    assert f(rows["none"]["measured_ratio"]) < f(rows["none"]["work_ratio"]), "the measurement usually falls short"
    verdict(out("01") if text is None else text,
            r"the gap between the arrivals without and with a cache .* widened faster as the run went on")


def measured_is_work_times_cost_ratio():
    rows = {r["cache"]: r for r in table("01", "measured_ratio", "work_ratio")}
    costs = [r for r in table("01", "ms_per_token_processed") if r["cache"] == "none"]
    early, late = (f(r["ms_per_token_processed"]) for r in sorted(costs, key=lambda r: int(r["token"])))
    want = f(rows["none"]["work_ratio"]) * late / early
    assert abs(f(rows["none"]["measured_ratio"]) / want - 1) < 0.01
    cached = [f(r["ms_per_token_processed"]) for r in table("01", "ms_per_token_processed") if r["cache"] == "dynamic"]
    assert max(early, late) < min(cached), "a pass over many tokens costs less per token than a pass over one"
    assert "fixed_ms" in out("01")


def cache_shape_and_bytes(text: str | None = None):
    t = out("02") if text is None else text
    m = verdict(t, r"the cache holds (\d+) tokens: the (\d+) of the prompt and (\d+) of the (\d+) generated")
    held, prompt, _, generated = map(int, m.groups())
    assert held == prompt + generated - 1
    m = verdict(t, rf"the formula gives {NUM} bytes for \d+ tokens and the dynamic cache's tensors take {NUM} bytes")
    assert f(m.group(1)) == f(m.group(2))


def memory_per_strategy(text: str | None = None):
    t = out("02") if text is None else text
    m = verdict(t, rf"dynamic allocated exactly the formula after each of its \d+ steps, growing from {NUM} bytes")
    verdict(t, r"static allocated [\d,]+ bytes at every step")
    verdict(t, r"quantized allocated exactly the formula while it held at most \d+ tokens, then less")
    m = verdict(t, rf"offloaded kept {NUM} bytes on the compute device at \d+ tokens, less than the {NUM}")
    assert f(m.group(1)) < f(m.group(2))


def quantized_bytes_near_bits_over_32(text: str | None = None):
    t = out("03") if text is None else text
    m = verdict(t, r"every quantized setting held exactly the bytes its format needs, at every context: (.*?) of the")
    for ratio, bits in re.findall(r"([\d.]+) \((\d+) bits\)", m.group(1)):
        assert 0 < float(ratio) - int(bits) / 32 < 0.1, (bits, ratio)  # bits/32 plus the scales
    assert "torch.float32" in t


def accuracy_by_bits_and_distance(text: str | None = None):
    """Accuracy falls as bits fall; at the fewest bits the farthest bucket is not the one lost most."""
    if text is None:
        rows = table("03", "all")
        head = [k for k in rows[0] if k]
    else:  # a doctored copy: "setting | bucket ... | all" lines
        lines = [ln.split(" | ") for ln in text.strip().splitlines()]
        head, rows = lines[0][1:], [dict(zip([""] + lines[0][1:], ln)) for ln in lines[1:]]
    q = sorted((r for r in rows if r[""].startswith("quantized(bits=")),
               key=lambda r: -int(re.search(r"bits=(\d+)", r[""]).group(1)))
    share = [[int(a) / int(b) for a, b in (r[h].split("/") for h in head)] for r in q]
    alls = [s[-1] for s in share]
    assert all(a >= b for a, b in zip(alls, alls[1:])) and alls[0] > alls[-1], alls
    buckets = share[-1][:-1]
    assert buckets[-1] > min(buckets), f"at the fewest bits the farthest facts were lost most: {buckets}"


def offloading_spread(text: str | None = None):
    """✓ over a real link; • behind a CPU's modelled link (shown, not checked): the direction holds either way."""
    t = out("03") if text is None else text
    mark = "•" if "• on your run: offloading widened" in t else "✓"
    m = (observation if mark == "•" else verdict)(t, rf"offloading widened the spread, not only the times: the middle half of the step times spanned "
                   rf"{NUM} ms offloaded against {NUM} ms on the device")
    assert f(m.group(1)) > f(m.group(2))
    claim_asserts("03", "offloading_widens_the_spread")()


def ttft_mostly_queue(text: str | None = None):
    t = out("04") if text is None else text
    m = verdict(t, rf"the watched request's TTFT was {NUM} ms, of which {NUM} ms")
    assert f(m.group(2)) > 0.5 * f(m.group(1))


def mean_between_median_and_p95(text: str | None = None):
    t = out("04") if text is None else text
    m = observation(t, rf"the mean TTFT is {NUM} ms and the median {NUM} ms")
    assert f(m.group(1)) > f(m.group(2))
    m = verdict(t, rf"the p95 TTFT \({NUM} ms\) is {NUM}× the mean")
    assert f(m.group(2)) > 1
    claim_asserts("04", "ttft_tail_is_well_above_the_mean")()


def batched_step_cheaper(text: str | None = None):
    t = out("05") if text is None else text
    m = verdict(t, rf"a decode step for (\d+) sequences took {NUM}× as long as a decode step for one")
    assert f(m.group(2)) < int(m.group(1))


def step_time_by_batch():
    rows = sorted(table("05", "batch", "step_s", "per_seq_s"), key=lambda r: int(r["batch"]))
    assert f(rows[-1]["step_s"]) > f(rows[0]["step_s"]) and f(rows[-1]["per_seq_s"]) < f(rows[0]["per_seq_s"])


def products_a_minority_of_the_step(text: str | None = None):
    t = out("05") if text is None else text
    m = observation(t, rf"the weight products alone took {NUM} ms of a {NUM} ms one-sequence step")
    assert f(m.group(1)) < 0.5 * f(m.group(2))
    assert "comes mostly from the per-operation overhead" in t


def step_rises_before_the_floors_cross(text: str | None = None):
    t = out("05") if text is None else text
    m = observation(t, r"The step first grew by more than a tenth from batch (\d+) to (\d+) [^•]*?where the compute "
                       r"floor \(([\d.]+) ms\) was still under the memory floor \(([\d.]+) ms\)")
    assert int(m.group(2)) <= 16 and f(m.group(3)) < f(m.group(4))


def batched_prompts(text: str | None = None):
    rows = {r["way"]: r for r in table("05", "way", "all_first_s", "first_ttft_s")}
    one, batched = rows["one by one"], rows["batched"]
    assert f(batched["all_first_s"]) < f(one["all_first_s"]), "the last prompt's first token comes earlier batched"
    assert f(batched["first_ttft_s"]) > f(one["first_ttft_s"]), "the first prompts get theirs later batched"


def equal_lengths_same_steps(text: str | None = None):
    t = out("05") if text is None else text
    verdict(t, r"equal lengths: both policies ran (\d+) steps at [\d.]+ sequences per step, and their TTFT p50")


def fuller_batch_knob(text: str | None = None):
    t = out("05") if text is None else text
    m = verdict(t, r"static batching waiting up to [\d, ]+ ms: sequences per step ([\d., ]+); tokens per busy second "
                   r"([\d., ]+); TTFT p50 ([\d, ]+) ms")
    for series in m.groups():
        v = [f(x) for x in series.split(", ")]
        assert v == sorted(v) and v[-1] > v[0], series
    m = verdict(t, rf"over each whole run, every policy delivered between {NUM} and {NUM} output tokens per second, "
                   rf"though its fullest batches did {NUM} per busy second")
    assert f(m.group(2)) < f(m.group(3))


def knee_of_the_mixture():
    """Achieved follows offered up to the knee, then falls behind; TTFT p95 rises steeper past the knee, and the
    median climbs past it too."""
    rows = table("06", "offered req/s", "achieved req/s", "TTFT p95 s", "knee")
    k = next(i for i, r in enumerate(rows) if "knee" in r["knee"])
    x = [f(r["offered req/s"]) for r in rows]
    y = [f(r["achieved req/s"]) for r in rows]
    p95 = [f(r["TTFT p95 s"]) for r in rows]
    p50 = [f(r["TTFT p50 s"]) for r in rows]
    assert 0 < k < len(rows) - 1
    assert all(b / a >= 0.9 for a, b in zip(x[:k], y[:k])) and y[-1] / x[-1] < y[k] / x[k]
    before, after = (p95[k] - p95[0]) / (x[k] - x[0]), (p95[-1] - p95[k]) / (x[-1] - x[k])
    assert after > before > 0, (before, after)
    assert p50[-1] > 2 * p50[k], "past the knee the median climbs too"


def first_token_p95_climbs_before_the_knee(text: str | None = None):
    """06's saved verdict quotes each curve's p95 TTFT at its knee over its lowest load: the long prompts' is
    several-fold (and every curve's above 1: the slow first tokens do not wait for the knee)."""
    t = out("06") if text is None else text
    m = verdict(t, r"p95 TTFT already climbs below the knee \(lowest load to the knee: ([^)]*)\)")
    rises = dict(re.findall(r"(\w[\w ]*?) ([\d.]+)×", m.group(1)))
    assert float(rises["long prompts"]) >= 3, rises
    assert all(float(v) > 1 for v in rises.values()), rises


def ab_directions(text: str | None = None):
    rows = {(r["load"], r["policy"]): r for r in table("06", "load", "policy", "ttft_p95_sent_s")}
    for p in "AB":
        assert rows["below capacity", p]["keeps_up"] == "True"
    a, b = rows["overloaded", "A"], rows["overloaded", "B"]
    assert f(b["output_tokens_per_s"]) > f(a["output_tokens_per_s"])
    assert f(b["tpot_p50_s"]) < 0.5 * f(a["tpot_p50_s"]), "a much shorter time per output token"
    assert f(a["ttft_p95_s"]) < f(b["ttft_p95_s"]), "A's p95 over the requests it completed is better"
    assert f(b["ttft_p95_sent_s"]) > f(a["ttft_p95_sent_s"]) and f(b["ttft_p95_close_s"]) > f(a["ttft_p95_close_s"])
    assert "NBVAL_CHECK_OUTPUT" in source("06").split("ab = ab_at_two_loads()", 1)[1].split("# %%\n", 2)[1]
    assert "calibration" in re.search(r"ab = ab_at_two_loads\(\).*", source("06")).group(0)


def counts_add_up(text: str | None = None):
    t = out("06") if text is None else text
    lines = re.findall(r"sent (\d+) = completed +(\d+) \+ failed +(\d+) \+ waiting +(\d+) \+ running +(\d+)", t)
    assert lines and all(int(s) == sum(map(int, rest)) for s, *rest in lines)


def paging_fits_several_times(text: str | None = None):
    t = out("07") if text is None else text
    m = verdict(t, r"paged blocks of \d+ fit (\d+) sequences in the same bytes, [\d.]+× the (\d+) of the reservation")
    assert int(m.group(1)) >= 2 * int(m.group(2))
    m = verdict(t, r"of the [\d,]+ token slots the reservations hold, [\d,]+ \((\d+)%\) are set aside")
    assert int(m.group(1)) > 50, "reserving wastes most of the memory"
    verdict(t, r"paging wastes [\d,]+ token slots, .*less than one block of \d+ each")


def block_size_waste(text: str | None = None):
    t = out("07") if text is None else text
    m = re.search(r"block_size +num_blocks +waste_per_sequence.*?sequences_fit ((?:\d+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +"
                  r"\d+ *)+)", t)
    rows = [tuple(map(float, r)) for r in re.findall(r"(\d+) +(\d+) +([\d.]+) +[\d.]+ +[\d.]+ +\d+", m.group(1))]
    for bs, _, waste in rows:
        assert abs(waste - (bs - 1) / 2) <= 0.15 * bs + 1, (bs, waste)  # about half a block
    blocks = [n for _, n, _ in rows]
    assert blocks == sorted(blocks, reverse=True), "smaller blocks, bigger tables"


def prefix_and_chunks(text: str | None = None):
    t = out("08") if text is None else text
    m = verdict(t, rf"TTFT p50 was {NUM} ms with caching on and {NUM} ms with it off")
    assert f(m.group(1)) < f(m.group(2))
    verdict(t, r"the hit ratio never fell as the pool grew")
    m = verdict(t, rf"the longest gap between tokens of the running answers was {NUM} ms with the whole prompt in one "
                   rf"step and {NUM} ms in chunks")
    assert f(m.group(2)) < f(m.group(1))
    m = observation(t, rf"the long prompt's first token came {NUM} ms after it arrived with chunks, {NUM} ms in "
                       rf"one step \([\d.]+×\): its prompt took (\d+) steps instead of (\d+)")
    assert int(m.group(3)) > int(m.group(4)) == 1  # an observation (•): the steps are the fact, the delay is shown


def wire_facts(text: str | None = None):
    t = out("09") if text is None else text
    verdict(t, r"HTTP and streaming added [\d.]+ ms to the median first token \(p90 [\d.]+ ms, n=\d+ requests\)")
    m = verdict(t, r"at \d+ req/s offered the full queue turned (\d+) of \d+ requests away with 429")
    assert int(m.group(1)) > 0
    verdict(t, r"at \d+ req/s offered nothing was turned away: .* the window ran on [\d.]+ s past the last arrival")


class Fact(NamedTuple):
    phrase: str  # found in TEACHING.md (whitespace folded)
    check: Callable[[], None]


FACTS: list[Fact] = [
    # the top
    Fact("two to four exercises", exercises_per_notebook),
    Fact("installs it from the repository at `REPO_REF` of `kvlab/course.py`", setup_cells_install_repo_ref),
    Fact("03's answer counts are the same on most CPUs and can differ by an answer on the edge on another CPU or on a GPU",
         gpu_caveat_in_03),
    # the plans
    Fact("The core story in five notebooks and one cell of a sixth", plan_90_names_five_notebooks_and_one_cell_of_06),
    Fact("16 requests whose longest answer arrives early", long_tail_lesson_workload),
    Fact("(`policy_rounds(model, seed=0)`) it runs alone at the end", long_tail_lesson_workload),
    Fact("read at 150 words a minute, the cells run, and each exercise it names at its price (2 minutes for a choice, "
         "3 for a number, 6 for a function, 12 for a build-it)", reading_rate),
    Fact("Exercise 1 (the work ratio)", exercise_is("01", 1, "check_work_ratio")),
    Fact("Exercise 3 (what the cache keeps)", exercise_is("02", 3, "check_what_the_cache_keeps")),
    Fact("The three misconceptions below", three_misconceptions),
    Fact("under a tenth of its minutes on the authors' 2 cores", run_all_under_a_tenth_of_the_minutes),
    # what to say at each figure
    Fact("the prefill read the whole prompt in one step (32 tokens at the CPU sizes", cpu_prompt_of_32),
    Fact("did it take 32 times as long", cpu_prompt_of_32),
    Fact("which notebooks time the real model (every one but 07, which only counts)", which_notebooks_time_the_real_model),
    Fact("parts of 04, 05, 06 and 08: fixed cost per step", which_notebooks_use_a_virtual_clock),
    Fact("*Step time vs token (left).* The red line (`none`) climbs", lines_red_none_blue_dynamic_left_right),
    Fact("the blue line (`dynamic`) stays flat", uncached_climbs_cached_flat),
    Fact("The gap between the curves widens faster and faster", uncached_climbs_cached_flat),
    Fact("The measurement usually falls short because a pass over many tokens costs far less per token than a pass "
         "over one", measured_is_work_times_cost_ratio),
    Fact("one token fewer than the prompt plus the generated tokens", cache_shape_and_bytes),
    Fact("Two query heads share a K/V head", two_query_heads_per_kv_head),
    Fact("the dynamic cache takes exactly the formula's bytes", cache_shape_and_bytes),
    Fact("`offloaded` keeps less on the device than its tokens take", memory_per_strategy),
    Fact("`quantized` bends down after its full-precision window", memory_per_strategy),
    Fact("Exercise 4: learners fill in `update`", exercise_is("02", 4, "check_my_cache")),
    Fact("Llama-2-7B vs Llama-3-8B at the same context: 4 times less cache for the same size of model, from 8 K/V "
         "heads instead of 32", llama_2_vs_3_heads),
    Fact("The dashed line is what the weights leave free", dashed_line_is_the_room_left),
    Fact("Quantized caches approach bits/32 of kvlab's fp32 dynamic cache", quantized_bytes_near_bits_over_32),
    Fact("(the panel's `residual`, none in the default run)", quantized_default_has_no_window),
    Fact("consider 8-bit", quantized_default_has_no_window),
    Fact("the ✓/✗ line says whether the quantized cache was slower than `dynamic` at every context",
         claim_asserts("03", "quantized_slower_at_every_context")),
    Fact("on a CPU-only machine the slower tier is a file", slower_tier_is_a_file_and_the_link_waits),
    Fact("draws the floor it cannot beat", slower_tier_is_a_file_and_the_link_waits),
    Fact("accuracy falls as bits fall", accuracy_by_bits_and_distance),
    Fact("on the shipped model the farthest facts are not the ones lost most", accuracy_by_bits_and_distance),
    Fact("`offloading_widens_the_spread` checks it on each run", offloading_spread),
    Fact("most of this TTFT is queue", ttft_mostly_queue),
    Fact("Grey is the queue, orange the prefill, the star the first token, ticks every later token", journey_colours),
    Fact("The same paragraph in eleven languages", eleven_languages),
    Fact("Requests arrive in clumps at two batch slots", two_batch_slots),
    Fact("the mean sits above the median and well below p95", mean_between_median_and_p95),
    Fact("a decode step for several sequences costs far less than that many separate steps", batched_step_cheaper),
    Fact("The step stays nearly flat while what it pays once dominates", step_time_by_batch),
    Fact("mostly the fixed cost of each operation, not the weight read", products_a_minority_of_the_step),
    Fact("It starts rising at a small batch while the compute floor is still under the memory floor",
         step_rises_before_the_floors_cross),
    Fact("the last prompt's first token comes earlier", batched_prompts),
    Fact("so the first prompts get theirs later", batched_prompts),
    Fact("Exercise 3: learners write which waiting requests join the batch", exercise_is("05", 3, "check_admission_rule")),
    Fact("With equal lengths the two policies do the same thing", equal_lengths_same_steps),
    Fact("Right panel: fuller batches, more output per busy second. Left panel: the first member of each batch pays "
         "for it in TTFT", batch_wait_panels),
    Fact("under a trickle of requests its batches stay small and the arrivals set the pace", fuller_batch_knob),
    Fact("Achieved throughput follows offered load up to the knee, then falls behind it", knee_of_the_mixture),
    Fact("it climbs as batches fill (the long prompts' several-fold, up to the target that marks their knee)",
         first_token_p95_climbs_before_the_knee),
    Fact("after the knee it climbs more steeply still, the median with it", knee_of_the_mixture),
    Fact("decode first streams more tokens per second and starts answers later, counted over every request sent",
         ab_directions),
    Fact("(the folded *three readings* section), it comes later too", ab_directions),
    Fact("B (decode-first) has more throughput and a much shorter time per output token, A (prefill-first) a better "
         "p95 TTFT over the requests it completed", ab_directions),
    Fact("B's p95 first token comes later", ab_directions),
    Fact("`real_and_simulated_rise_with_load` shows (•, not marked: it held in 8 of 10 quiet runs of the notebook)",
         claim_shown("06", "real_and_simulated_rise_with_load")),
    Fact("Sent = completed + failed + waiting + running, at any cut-off", counts_add_up),
    Fact("paging fits several times as many sequences in the same bytes, wasting only the ends of last blocks",
         paging_fits_several_times),
    Fact("Bigger blocks waste about half a block per sequence; smaller ones mean bigger tables", block_size_waste),
    Fact("Each red triangle is a sequence sent back to the queue", red_triangles_are_preemptions),
    Fact("the orange prefill bars shrink and TTFT drops", prefix_and_chunks),
    Fact("the hit ratio the engine reaches as KV memory grows", prefix_and_chunks),
    Fact("in the Mooncake format", mooncake_format),
    Fact("with chunks the gaps stay small, and the newcomer's prompt takes many steps", prefix_and_chunks),
    Fact("On loopback it is small (the ✓/✗ line gives the median with n)", wire_facts),
    Fact("so achieved < offered is explained", wire_facts),
    Fact("Past capacity the server answers some requests with 429", wire_facts),
    # questions
    Fact("past the knee of the service curve throughput falls behind the offered load while waits climb steeply",
         knee_of_the_mixture),
    Fact("So the measured ratio is the work ratio × (late cost per token / early cost per token)",
         measured_is_work_times_cost_ratio),
    Fact("00's prefill (32 tokens at the CPU sizes) does not take 32 decode steps", cpu_prompt_of_32),
    Fact("Why didn't 00's 32-token prefill take 32 decode steps?", cpu_prompt_of_32),
    Fact("The panels take the fastest of several repeats", panels_take_the_fastest_of_several),
    Fact("it wastes most of the memory", paging_fits_several_times),
    Fact("roughly bits/32 of kvlab's fp32 cache, bits/16 of an engine's fp16 one", quantized_bytes_near_bits_over_32),
    Fact("whether it was slower at every context", claim_asserts("03", "quantized_slower_at_every_context")),
    Fact("Exercise 3 of `02_kv_cache.ipynb` asks exactly this", exercise_is("02", 3, "check_what_the_cache_keeps")),
    # when a claim says ✗
    Fact("may sit below the one before by a tenth and count as a tie", tie_is_a_tenth),
    Fact("Each asserting wall-clock claim has a counter-example in the tests", every_asserting_wall_claim_has_a_counterexample),
    Fact("uncached steps that do not grow with the tokens they recompute", the_constructed_x_is_rendered_from_the_counterexample),
    Fact("`compiled_step_is_faster` (03) is shown as an observation (•), not asserted", observations_not_asserted),
    Fact("never ✗: the slow link is kvlab's model", observations_not_asserted),
    Fact("(`SWEEP_RATES = (8.0, 24.0, 48.0)`)", rates_of_the_two_engines),
    Fact("`try_compiled_decode(budget_s=120)`", compile_budget),
    Fact("the 01 example uses the lesson's longer sizes on a GPU", gpu_example_sizes_of_01),
    Fact("but for 03's answer counts", gpu_caveat_in_03),
    Fact("(on a CPU: on a GPU, 03's answer counts can move by an answer on the edge)", gpu_caveat_in_03),
    # Binder, Colab
    Fact("what `kvlab.course.binder_url(\"00_start_here.ipynb\", ref=\"v0.1.0\")` builds", binder_link_to_a_tag),
    Fact("`https://mybinder.org/v2/gh/kvlab/kvlab/v0.1.0?urlpath=lab/tree/notebooks/workshop/00_start_here.ipynb`",
         binder_link_to_a_tag),
    Fact("(`main` as shipped, a branch that moves)", repo_ref_is_main),
    Fact("`main` unless you set a tag in step 1", repo_ref_is_main),
    Fact("CPU-only PyTorch from conda-forge and the same pins as `requirements.txt`", binder_pins),
    Fact("keeps Colab's own PyTorch (kvlab asks only for a lower bound on torch)", torch_is_a_lower_bound_and_widgets_7_or_8),
    Fact("leaves a screenshot of each in `test-artifacts/screenshots/`", browser_screenshots),
    # troubleshooting
    Fact("draws ipywidgets 8, the version `requirements.txt` and `binder/environment.yml` pin", binder_pins),
    Fact("`widgetsnbextension` 3.6.6: with 3.6.10", classic_notebook_pins),
    Fact("Install 3.6.6 into", classic_notebook_pins),
    Fact("(`ipywidgets>=7.7.1,<9`)", torch_is_a_lower_bound_and_widgets_7_or_8),
    Fact("`panel.run(max_seqs=4)` sets a control", panel_and_predict_take_keywords),
    Fact("`predict(\"...\", value=3)`", panel_and_predict_take_keywords),
    Fact("notebooks 03 to 09 run it at the top of one of their first cells", matplotlib_inline_in_03_to_09),
    Fact("`start_server()` runs `python -m kvlab serve` on `127.0.0.1` and a free port", servers_of_09),
    Fact("it is stopped by the cell of section 7, `srv.stop()`", servers_of_09),
    Fact("`ps -ef | grep -E \"(kvlab|transformers) serve\"`", servers_of_09),
    Fact("The lesson sizes are chosen for 2 CPU cores", lesson_sizes_for_2_cores),
    Fact("A few name a slow machine itself", slow_machine_quotes_are_the_claims_words),
    Fact("04's tail (\"with burstiness=1", slow_machine_quotes_are_the_claims_words),
    # running a room
    Fact("a sample room of 30 simulated learners", sample_room_of_30),
    Fact("`http://<your address>:8100/health` answers", ports_and_queue),
    Fact("allow port 8100", ports_and_queue),
    Fact("`url=\"http://<your address>:8100\"`", ports_and_queue),
    Fact("--host 0.0.0.0 --port 8000", ports_and_queue),
    Fact("(`--max-waiting`, 64 by default)", ports_and_queue),
    Fact("`room_error_x` above 1 means the room guessed high", room_error_and_knee),
    Fact("no longer served nine requests in ten with a TTFT p95 within one second", room_error_and_knee),
]

# Phrases whose digits are no measurement: names, versions, addresses, examples, numbering, and what other tests
# check (tests/test_plans.py: the plan times and the half-day total). Each with why.
ALLOWED: dict[str, str] = {
    "(90 minutes, half a day)": "the plans' lengths, checked by tests/test_plans.py",
    "## A 90-minute workshop": "the plan's name (tests/test_plans.py adds its slots to 90)",
    "(about 5 h 05 min with breaks)": "tests/test_plans.py checks the slots add up to it",
}
ALLOWED_PATTERNS: dict[str, str] = {
    r"`?\d\d_\w+\.ipynb`?": "a notebook's file name",
    r"(?<![\d.:])0\d(?:–0\d)?(?!\d|[.:]\d)": "a notebook's number (00 to 09)",
    r"token 0\b": "the index of the prompt's step",
    r"``` ✗ not on your run: .*? ```": "the rendered counter-example, checked by its FACTS row",
    r"\| \d:\d\d–\d:\d\d \|": "a plan slot, checked by tests/test_plans.py",
    r"\bp(?:50|90|95|99)\b": "a quantile's name",
    r"\b(?:fp32|fp16|bf16|bits/32|bits/16|int4)\b": "a number format",
    r"\b429\b": "the HTTP status of backpressure",
    r"vLLM V1|V0's": "vLLM's engine versions (V1 preempts by recompute; V0 could swap to CPU)",
    r"Llama-2-7B|Llama-3-8B": "a published model's name",
    r"## \d\. |\d\. [A-Z][a-z]+ [a-z]": "a section's number, as in the notebook (tests/test_plans.py checks names)",
    r"(?m)(?:^|\s)\d\. \*\*": "a numbered step",
    r"step 1\)": "a numbered step",
    r"JupyterLab 4|ipywidgets [78]\b|Notebook 7|\(6\.x\)|ipywidgets 7|3\.x|only ipywidgets 7|ships 7":
        "a front end's or library's major version (tests/test_browser_classic.py and pyproject pin them)",
    r"v0\.1\.0": "an example tag",
    r"tulip-42|orchid-7|0\.0\.0\.0|room-2026-01-29\.json": "an example key, address or file name",
    r"held on 28 of 30 machines": "an illustration of the room view, not a measurement",
    r"a learner with 1 thread and one with 8": "an illustration",
    r"01 ratio is near 1": "an illustration (a launch-bound GPU step)",
    r"\]\(https?://[^)\s]*\)": "a link to a source (a paper's arXiv number, an issue's number, a version in a URL)",
}


def _covered_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for phrase in [x.phrase for x in FACTS] + list(ALLOWED):
        start = 0
        while (i := text.find(phrase, start)) >= 0:
            spans.append((i, i + len(phrase)))
            start = i + 1
    for pattern in ALLOWED_PATTERNS:
        spans += [m.span() for m in re.finditer(pattern, text)]
    return spans


@pytest.mark.parametrize("fact", FACTS, ids=lambda x: x.phrase[:60])
def test_a_fact_of_teaching_holds_at_its_source(fact: Fact):
    assert fact.phrase in teaching(), f"TEACHING.md no longer says {fact.phrase!r}: update or remove its row"
    fact.check()


def test_every_number_in_teaching_is_covered():
    text = teaching()
    spans = _covered_spans(text)
    loose = []
    for m in re.finditer(r"\d+(?:[.,:/]\d+)*", text):
        if not any(a <= m.start() and m.end() <= b for a, b in spans):
            loose.append(text[max(0, m.start() - 40):m.end() + 20])
    assert not loose, ("numbers in TEACHING.md with no row in tests/test_teaching_facts.py (FACTS for a fact, "
                       "ALLOWED for a name or an example):\n" + "\n".join(loose))


def test_a_flipped_direction_in_a_saved_output_fails():
    """The checks read directions, so a saved output whose direction flipped fails them (doctored copies)."""
    text = out("08")
    m = re.search(r"the longest gap between tokens of the running answers was ([\d.]+) ms with the whole prompt in one "
                  r"step and ([\d.]+) ms in chunks", text)
    prefix_and_chunks(text)  # the saved output passes
    flipped = text[:m.start(1)] + m.group(2) + text[m.end(1):m.start(2)] + m.group(1) + text[m.end(2):]
    with pytest.raises(AssertionError):
        prefix_and_chunks(flipped)
    good = "setting | near | far | all\nquantized(bits=8) | 10/10 | 10/10 | 20/20\nquantized(bits=2) | 1/10 | 3/10 | 4/20"
    accuracy_by_bits_and_distance(good)
    with pytest.raises(AssertionError, match="farthest"):
        accuracy_by_bits_and_distance(good.replace("1/10 | 3/10", "3/10 | 1/10"))
    with pytest.raises(AssertionError):
        paging_fits_several_times(out("07").replace("fit 32 sequences in the same bytes", "fit 9 sequences in the same bytes"))
