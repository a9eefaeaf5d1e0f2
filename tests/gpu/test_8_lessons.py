"""The lessons on the device: the notebooks' start-up check, their experiments at the device's sizes, their claims.

First the start-up check (``kvlab.serving.device_check``: the device against the CPU), as a notebook's setup
cell runs it; then it is switched off (KVLAB_DEVICE_CHECK=0) so that ``setup_report()`` inside the lessons and
claims neither repeats it nor moves KVLAB_DEVICE to the CPU. With KVLAB_DEVICE naming the device, the lessons'
experiments at their device defaults (``kvlab.model.lessons.lesson_scale``): the slowdown (01), cache memory
(02), strategies (03), a journey (04), batching policies (05), prefix caching and chunked prefill (08); then
every notebook claim on its example (tests/claim_examples/), in notebook order, as long as the budget lasts.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
import types

import pytest

pytestmark = [pytest.mark.full, pytest.mark.gpu]


def test_the_notebooks_startup_check_agrees_with_the_cpu(gpu, gpu_report, record):
    """Greedy tokens of every cache and one paged-engine batch on the device against the CPU's; a notebook falls
    back to the CPU when this fails."""
    from kvlab.serving.device_check import device_check

    check = device_check(gpu.device)
    gpu_report.keep("startup_check", dict(device=check.device, ok=check.ok, problems=check.problems,
                                          seconds=check.seconds, line=check.line()))
    record(f"notebook start-up check: {gpu.device.type} computes what the CPU computes", check.ok,
           "same tokens for every cache and the engine", check.line())
    record.verdict()


@pytest.fixture(scope="module")
def lesson_setup(gpu, gpu_report):
    """The start-up check off, ipywidgets importable, and the lesson model (``slowdown_model``) on the device.

    kvlab.widgets needs ipywidgets (a kvlab dependency); a device image may lack it, and the claims only call the
    widgets' plain functions, so then a stand-in module lets them import. The report says which one was used."""
    from kvlab.course import setup_report
    from kvlab.experiments.slowdown import slowdown_model
    from kvlab.model.lessons import lesson_scale

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_DEVICE_CHECK", "0")
        try:
            import ipywidgets  # noqa: F401
            widgets = "installed"
        except ImportError:
            from unittest import mock

            stub = types.ModuleType("ipywidgets")
            stub.__getattr__ = lambda name: mock.MagicMock(name=f"ipywidgets.{name}")  # type: ignore[attr-defined]
            mp.setitem(sys.modules, "ipywidgets", stub)
            widgets = "stand-in (not installed here)"
        model = slowdown_model()
        gpu_report.keep("lessons/setup", dict(
            scale=lesson_scale().describe(), setup_report=setup_report(), ipywidgets=widgets,
            lesson_model=dict(name=model.config.name, parameters=model.num_parameters(), device=str(model.device))))
        yield types.SimpleNamespace(model=model, device=gpu.device, quick=gpu.quick)


def slowdown(s) -> dict:
    from kvlab.lessons import verdicts
    from kvlab.experiments.slowdown import run_slowdown, slowdown_summary

    kw = dict(prompt_tokens=64, max_new_tokens=40) if s.quick else {}  # else the device's lesson sizes
    frame = run_slowdown(s.model, repeats=1 if s.quick else 2, **kw)
    shown = verdicts(frame, "uncached_tokens_slow_down", "cached_steps_stay_flat", "uncached_wait_gap_widens")
    return dict(attrs=dict(frame.attrs), summary=slowdown_summary(frame).to_dict(orient="records"),
                verdicts=[str(v) for v in shown], holds=[v.holds for v in shown])


def memory(s) -> dict:
    from kvlab.experiments.memory import measure_cache_memory

    frame = measure_cache_memory(s.model, prompt_tokens=64, max_new_tokens=32)
    last = frame.groupby("cache").tail(1)
    dyn = frame[frame["cache"] == "dynamic"]
    return dict(last=last.astype(object).where(last.notna(), None).to_dict(orient="records"),
                dynamic_equals_formula=bool((dyn["allocated_bytes"] == dyn["formula_bytes"]).all()),
                dynamic_bytes=dyn["allocated_bytes"].tolist()[-1:], formula_bytes=dyn["formula_bytes"].tolist()[-1:])


def strategies(s) -> dict:
    from kvlab.experiments.strategies import default_settings, run_strategies
    from kvlab.experiments.recall import load_recall_model

    recall = load_recall_model(device=s.device)
    frame = run_strategies(recall, default_settings(s.device), pairs=(4, 16), new_tokens=8, repeats=1,
                           examples=0 if s.quick else 8, quality_prompts=1)
    cols = [c for c in ("setting", "pairs", "allocated_bytes", "device_bytes", "offloaded_bytes", "memory_ratio",
                        "ideal_memory_ratio", "token_ms_p50", "latency_ratio", "bytes_moved_per_step",
                        "moved_gb_per_s", "top1_agreement")
            if c in frame.columns]
    return dict(rows=frame[cols].astype(object).where(frame[cols].notna(), None).to_dict(orient="records"),
                settings=len(default_settings(s.device)))


def journey(s) -> dict:
    from kvlab.experiments.four_clocks import journey_clocks, run_journey
    from kvlab.experiments.serving_run import lesson_model

    run = run_journey(lesson_model(), n_ahead=2, max_seqs=1, prompt_tokens=16, max_new_tokens=8)
    return dict(clocks=journey_clocks(run).to_dict(orient="records"))


def batching(s) -> dict:
    from kvlab.experiments.batching import batching_table, compare_policies
    from kvlab.experiments.serving_run import lesson_model

    runs = compare_policies(lesson_model(), n=8, max_seqs=4, prompt_tokens=32, max_new_tokens=24)
    return dict(table=batching_table(runs).to_dict(orient="records"))


def prefix_and_chunks(s) -> dict:
    from kvlab.experiments.prefix_and_chunks import (chunked_prefill_runs, prefix_caching_runs,
                                                                       prefix_caching_table)
    from kvlab.experiments.serving_run import lesson_model

    prefix = prefix_caching_table(prefix_caching_runs(lesson_model(), n=4, system_prompt_tokens=128))
    chunks = chunked_prefill_runs(lesson_model(), n_decoding=3, decode_tokens=40, long_prompt_tokens=512)
    return dict(prefix=prefix.to_dict(orient="records"), chunked_runs=[r.label for r in chunks],
                chunked_wall_s=[r.wall_s for r in chunks])


LESSONS = {"01_slowdown": slowdown, "02_memory": memory, "03_strategies": strategies, "04_journey": journey,
           "05_batching": batching, "08_prefix_and_chunks": prefix_and_chunks}


@pytest.mark.parametrize("lesson", list(LESSONS))
def test_the_lesson_runs_at_the_devices_sizes(lesson, lesson_setup, gpu_report, record):
    t0 = time.perf_counter()
    try:
        out = dict(LESSONS[lesson](lesson_setup), seconds=time.perf_counter() - t0)
    except Exception as exc:  # recorded with its trace in the report; the other lessons still run
        out = dict(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:],
                   seconds=time.perf_counter() - t0)
    gpu_report.keep(f"lessons/{lesson}", out)
    record(f"lesson {lesson} ran at the device's sizes", "error" not in out, "no error",
           out.get("error", f"{out['seconds']:.1f} s"))
    if lesson == "02_memory" and "error" not in out:
        record("lesson 02: dynamic cache bytes == formula", out["dynamic_equals_formula"], out["formula_bytes"],
               out["dynamic_bytes"])
    record.verdict()


def claims_on_device(budget_s: float) -> dict:
    """Every notebook claim on its example, examples made in notebook order until ``budget_s`` is spent.

    The examples are test fixtures (tests/claim_examples/), not part of the package."""
    from claim_examples import example_of
    from kvlab.lessons import CLAIMS

    made: dict = {}
    rows, t_start = [], time.perf_counter()
    for c in sorted(CLAIMS.values(), key=lambda c: c.notebook):
        try:
            make = example_of(c)
        except LookupError as exc:
            rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="example failed",
                             error=f"LookupError: {exc}"))
            continue
        if make not in made:
            if time.perf_counter() - t_start > budget_s:
                rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="skipped (budget)"))
                continue
            t0 = time.perf_counter()
            try:
                made[make] = (make(), None, time.perf_counter() - t0)
            except Exception as exc:
                made[make] = (None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
        result, error, seconds = made[make]
        if error is not None:
            rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="example failed",
                             error=error, example_s=seconds))
            continue
        v = c.on(result)
        rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, example_s=seconds,
                         verdict={True: "holds", False: "does not hold", None: "not checked"}[v.holds], text=str(v)))
    return dict(rows=rows, seconds=time.perf_counter() - t_start, budget_s=budget_s)


def test_every_deterministic_claim_holds_on_its_example_on_the_device(lesson_setup, gpu, gpu_report, record):
    """Wall-clock claims are kept as information (a lent GPU's timings are not the lesson's); a deterministic
    claim that does not hold, or whose example fails, is a FAIL of its own."""
    budget_s = max(0.0, gpu.left())
    claims = claims_on_device(budget_s)
    gpu_report.keep("claims", claims)
    rows = claims["rows"]
    for r in rows:
        if r["clock"] == "deterministic" and r["verdict"] not in ("holds", "skipped (budget)"):
            record(f"claim {r['claim']} (deterministic) holds", False, "holds", r.get("text") or r.get("error"))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in sorted({r["verdict"] for r in rows})}
    checked = [r for r in rows if r["clock"] == "deterministic" and r["verdict"] != "skipped (budget)"]
    record("claims: every deterministic claim checked holds on its example",
           all(r["verdict"] == "holds" for r in checked) if checked else None, "every one holds",
           f"{counts} in {claims['seconds']:.0f} s" if checked else
           f"none checked: {budget_s:.0f} s of the budget were left for them ({counts})")
    record.verdict()


def test_kvlab_device_stayed_on_the_device_through_the_lessons_and_claims(lesson_setup, gpu, record):
    record(f"KVLAB_DEVICE stayed {gpu.device.type} through the lessons and claims",
           os.environ.get("KVLAB_DEVICE") == gpu.device.type, gpu.device.type, os.environ.get("KVLAB_DEVICE"))
    record.verdict()
