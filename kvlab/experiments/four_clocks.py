"""The four clocks of a request: one journey through a busy engine, cold vs warm start, and why a mean hides the wait.

- ``run_journey``: a few long requests arrive first, then the watched one; with few batch slots
  it queues behind them, so every clock has something to show (queue wait, TTFT, TPOT, E2E).
- ``cold_vs_warm``: the same request served right after a service starts (in a fresh Python
  process: imports, weights, KV pool, first forward) and again once everything is warm.
- ``run_mixed_load`` + ``mean_vs_tail``: many requests of mixed lengths arriving in clumps at two
  batch slots; the mean TTFT looks fine while the slowest requests wait several times longer.
All on the real decoder with the engine's wall clock, unless an ``executor`` is given.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd

from kvlab.clocks import quantiles, summarize
from kvlab.model.decoder import Decoder
from kvlab.serving.executor import Executor
from kvlab.serving.config import EngineSpec
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.threads import LESSON_THREADS, check_threads, set_torch_threads
from kvlab.workload import Request, make_workload, seeded_prompt
from kvlab.progress import Progress, no_progress
from kvlab.experiments.serving_run import ServingRun, check_positive_int, records_from_frame, resolve_model, serve_plan

CLOCK_ROWS = (  # (clock, from, to, how)
    ("queue wait", "arrival", "admission", "admitted_s - scheduled_s"),
    ("TTFT", "arrival", "first token", "first_token_s - scheduled_s"),
    ("TPOT", "first token", "last token", "(E2E - TTFT) / (output tokens - 1)"),
    ("largest gap (ITL max)", "one token", "the next", "max of the gaps between token stamps"),
    ("E2E", "arrival", "last token", "finished_s - scheduled_s"),
)


# -- one request's journey --------------------------------------------------------------------------
def journey_workload(vocab_size: int, n_ahead: int = 4, ahead_prompt_tokens: int = 160,
                     ahead_new_tokens: int = 40, prompt_tokens: int = 64, max_new_tokens: int = 24,
                     arrival_s: float = 0.01, seed: int = 0) -> list[Request]:
    """``n_ahead`` long requests at t = 0, then the watched request (id ``n_ahead``) at ``arrival_s``."""
    check_positive_int("n_ahead", n_ahead, 0)
    for name, v in (("ahead_prompt_tokens", ahead_prompt_tokens), ("ahead_new_tokens", ahead_new_tokens),
                    ("prompt_tokens", prompt_tokens), ("max_new_tokens", max_new_tokens)):
        check_positive_int(name, v)
    if not arrival_s >= 0:
        raise ValueError(f"arrival_s must be >= 0 seconds, got {arrival_s!r}")
    ahead = [Request(i, ahead_prompt_tokens, ahead_new_tokens, 0.0, "ahead",
                     prompt=seeded_prompt(vocab_size, ahead_prompt_tokens, (seed, i))) for i in range(n_ahead)]
    watched = Request(n_ahead, prompt_tokens, max_new_tokens, float(arrival_s), "watched",
                      prompt=seeded_prompt(vocab_size, prompt_tokens, (seed, n_ahead)))
    return [*ahead, watched]


def run_journey(model: Decoder | None = None, n_ahead: int = 4, max_seqs: int = 2, prompt_tokens: int = 64,
                max_new_tokens: int = 24, ahead_prompt_tokens: int = 160, ahead_new_tokens: int = 40,
                max_batch_tokens: int = 256, clock: str = "wall", executor: Executor | None = None,
                seed: int = 0, threads: int | None = LESSON_THREADS, progress: Progress = no_progress) -> ServingRun:
    """Serve ``journey_workload`` with continuous batching and ``max_seqs`` slots; the watched id is ``n_ahead``.

    With ``executor`` (e.g. ``FixedStepCostExecutor``) and ``clock="virtual"`` every stamp is exact.
    """
    model = resolve_model(model)
    check_positive_int("max_seqs", max_seqs)
    check_threads(threads)
    requests = journey_workload(model.config.vocab_size, n_ahead, ahead_prompt_tokens, ahead_new_tokens,
                                prompt_tokens, max_new_tokens, seed=seed)
    spec = EngineSpec(scheduler=SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=max_batch_tokens))
    plan = [("journey", requests, spec, {"watched": n_ahead})]  # also the request whose profile is "watched"
    return serve_plan(model, plan, "serving", clock=clock, executor=executor, threads=threads, progress=progress)[0]


def journey_clocks(run: ServingRun | pd.DataFrame, request_id=None) -> pd.DataFrame:
    """The clocks of one request (default: the watched one) as a table: clock, start, end, how, seconds; the last
    row is the service's throughput over the whole run, a clock of the system, not of the request."""
    frame = run.requests if isinstance(run, ServingRun) else run
    records = records_from_frame(frame)
    if request_id is None:
        watched = frame.index[frame["profile"] == "watched"] if "profile" in frame.columns else []
        request_id = frame.loc[watched[0], "request_id"] if len(watched) else frame["request_id"].iloc[-1]
    matches = [r for r in records if r.request_id == request_id]
    if not matches:
        raise ValueError(f"request {request_id!r} is not in this run; its ids are {list(frame['request_id'])[:20]}")
    c, gaps = matches[0].clocks(), matches[0].itl_s()
    values = [c["queue_s"], c["ttft_s"], c["tpot_s"], max(gaps) if gaps else np.nan, c["e2e_s"]]
    rows = [dict(clock=name, start=a, end=b, how=how, seconds=v) for (name, a, b, how), v in zip(CLOCK_ROWS, values)]
    s = summarize(records)
    rows.append(dict(clock="throughput (whole service)", start="first arrival", end="last token",
                     how=f"{s.output_tokens} output tokens / {s.duration_s:.3f} s = "
                         f"{s.output_tokens_per_s:,.0f} tokens/s", seconds=np.nan))
    return pd.DataFrame(rows)


# -- cold vs warm start ------------------------------------------------------------------------------
def _child(t0: float, params: dict) -> None:
    """Runs in a fresh Python process: time every start-up phase, then serve the same request repeatedly."""
    import torch  # noqa: F401  (imports are the first phase measured)

    from kvlab.model.decoder import build_model
    from kvlab.model.lessons import lesson_config
    t_import = time.perf_counter()
    set_torch_threads(params["threads"])
    model = build_model(lesson_config(), seed=params["seed"])
    t_build = time.perf_counter()
    from kvlab.serving.engine import Engine
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=256)))
    t_engine = time.perf_counter()
    request = Request(0, params["prompt_tokens"], params["max_new_tokens"], 0.0, "single",
                      prompt=seeded_prompt(model.config.vocab_size, params["prompt_tokens"], params["seed"]))
    runs = [engine.run([request])[0].clocks() for _ in range(params["repeats"])]
    print(json.dumps({"import_s": t_import - t0, "build_model_s": t_build - t_import,
                      "engine_init_s": t_engine - t_build, "serve_s": time.perf_counter() - t_engine,
                      "runs": runs, "threads": torch.get_num_threads()}))


def cold_vs_warm(repeats: int = 5, prompt_tokens: int = 64, max_new_tokens: int = 32, seed: int = 0,
                 threads: int | None = LESSON_THREADS, timeout_s: float = 180.0, progress: Progress = no_progress) -> pd.DataFrame:
    """Start a fresh Python process, build the lesson model and an engine, and serve one request ``repeats`` times.

    Returns one row per serving of the request (``run`` 0 is the cold one); ``frame.attrs`` holds the start-up phases in
    seconds (``python_start_s`` measured from outside). A fresh process is the only honest cold start: this notebook's
    own process paid its one-time costs long ago.
    """
    check_positive_int("repeats", repeats, 2)
    check_positive_int("prompt_tokens", prompt_tokens)
    check_positive_int("max_new_tokens", max_new_tokens, 2)
    check_threads(threads)
    params = dict(repeats=repeats, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, seed=seed,
                  threads=threads)
    code = ("import time; t0 = time.perf_counter(); import json, sys; "
            "from kvlab.experiments.four_clocks import _child; _child(t0, json.loads(sys.argv[1]))")
    for _ in progress(range(1), total=1, desc="fresh process", unit="process"):
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", code, json.dumps(params)], capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the fresh process did not finish within timeout_s={timeout_s} s; the machine may "
                               "be very busy: raise timeout_s or lower repeats") from None
        wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the fresh process failed (exit {done.returncode}): {tail}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    frame = pd.DataFrame(out["runs"])[["ttft_s", "tpot_s", "e2e_s"]]
    frame.insert(0, "run", range(len(frame)))
    frame.insert(1, "start", ["cold"] + ["warm"] * (len(frame) - 1))
    inside = out["import_s"] + out["build_model_s"] + out["engine_init_s"] + out["serve_s"]
    frame.attrs.update(python_start_s=max(0.0, wall - inside), import_s=out["import_s"],
                       build_model_s=out["build_model_s"], engine_init_s=out["engine_init_s"],
                       process_wall_s=wall, threads=out["threads"], prompt_tokens=prompt_tokens,
                       max_new_tokens=max_new_tokens)
    return frame


def cold_warm_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Cold vs warm in one table: the first serving, the median of the warm ones, and a start from nothing.

    "from a stopped service" is what a request that wakes a stopped service waits for its first token: interpreter start
    + imports + weights + KV pool + the cold TTFT.
    """
    a = frame.attrs
    cold = frame[frame["start"] == "cold"].iloc[0]
    warm = frame[frame["start"] == "warm"]
    startup = a["python_start_s"] + a["import_s"] + a["build_model_s"] + a["engine_init_s"]
    rows = [
        dict(case="warm request (median)", n=len(warm), ttft_s=warm["ttft_s"].median(),
             tpot_s=warm["tpot_s"].median(), e2e_s=warm["e2e_s"].median()),
        dict(case="first request after start-up", n=1, ttft_s=cold["ttft_s"], tpot_s=cold["tpot_s"],
             e2e_s=cold["e2e_s"]),
        dict(case="request that wakes a stopped service", n=1, ttft_s=startup + cold["ttft_s"],
             tpot_s=cold["tpot_s"], e2e_s=startup + cold["e2e_s"]),
    ]
    out = pd.DataFrame(rows)
    out["ttft_vs_warm"] = out["ttft_s"] / out["ttft_s"].iloc[0]
    return out


def startup_phases(frame: pd.DataFrame) -> pd.DataFrame:
    """The one-time costs of a cold start, phase by phase (seconds), from ``cold_vs_warm``'s attrs."""
    a = frame.attrs
    phases = [("start the Python interpreter", a["python_start_s"]), ("import torch and kvlab", a["import_s"]),
              ("build the model (weights)", a["build_model_s"]),
              ("create the engine (KV block pool)", a["engine_init_s"]),
              ("first request: time to first token", float(frame["ttft_s"].iloc[0]))]
    return pd.DataFrame(phases, columns=["phase", "seconds"])


# -- why a mean hides the wait ---------------------------------------------------------------------------
def run_mixed_load(model: Decoder | None = None, n: int = 30, rate: float = 6.0, burstiness: float = 0.1,
                   scale: float = 0.5, max_seqs: int = 2, max_batch_tokens: int = 256, seed: int = 1,
                   clock: str = "wall", executor: Executor | None = None, threads: int | None = LESSON_THREADS,
                   progress: Progress = no_progress) -> ServingRun:
    """``n`` requests of the "mixture" profile (lengths x ``scale``) arriving in bursts at ``rate``/s on average.

    Arrivals are Gamma-distributed with ``burstiness`` (1 = Poisson, below 1 burstier): at 0.1 requests come in clumps,
    and with two batch slots those of a clump queue behind each other, so TTFT has a tail of queueing on top of prefill.
    A clump's wait scales with the machine's own step time, so the tail keeps its shape on a faster or slower machine;
    the average rate leaves a machine several times slower than 2 CPU cores not overloaded.
    """
    model = resolve_model(model)
    check_positive_int("n", n, 2)
    check_threads(threads)
    requests = make_workload("mixture", n, arrival="gamma", rate=rate, burstiness=burstiness, seed=seed,
                             vocab_size=model.config.vocab_size, scale=scale,
                             max_context=model.config.max_position_embeddings)
    spec = EngineSpec(scheduler=SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=max_batch_tokens))
    return serve_plan(model, [("mixed load", requests, spec, {})], f"serving {n} requests", clock=clock,
                      executor=executor, threads=threads, progress=progress)[0]


def mean_vs_tail(requests: pd.DataFrame, clocks: tuple[str, ...] = ("ttft_s", "e2e_s", "tpot_s")) -> pd.DataFrame:
    """Per clock over the completed requests: n, mean, p50, p90, p95, p99, max (seconds), and how the tail compares.

    ``share_above_mean``: requests slower than the mean; ``p95_over_mean``: how many times the mean the slowest 5% wait.
    """
    done = requests[requests["status"] == "completed"]
    rows = []
    for c in clocks:
        values = done[c].dropna().to_numpy(dtype=float)
        q = quantiles(values)
        rows.append(dict(clock=c, **q, max=float(values.max()) if len(values) else np.nan,
                         share_above_mean=float((values > q["mean"]).mean()) if len(values) else np.nan,
                         p95_over_mean=q["p95"] / q["mean"] if len(values) else np.nan))
    return pd.DataFrame(rows)
