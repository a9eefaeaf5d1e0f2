"""Batching benchmark: static vs continuous batching in kvlab, and transformers' generate_batch, on the same weights.

``python -m kvlab bench batching [--json PATH] [--config llama-30m|tiny] [--requests 32] [--max-seqs 8] [--threads 1]
[--rounds 5] [--no-spread] [--no-transformers]``

One fixed, seeded, mixed workload: ``--requests`` requests (prompts 16-128 tokens, outputs 8-64), all arriving at once,
greedy, every request running to its own output length (no stop token). It is served by:

- kvlab, ``policy="static"``: batches of ``--max-seqs`` formed from the queue, each run until its longest member
  finishes;
- kvlab, ``policy="continuous"``: the batch rebuilt every step, same ``--max-seqs``;
- transformers' continuous batching on the same weights (``kvlab.to_transformers``), same ``max_requests_per_batch``,
  token budget and block size. ``generate_batch`` takes one ``max_new_tokens`` for all requests, so it runs the same
  prompts with *fixed* outputs of the longest length (64), next to kvlab continuous on those same fixed outputs; the
  mixed workload goes through transformers' manager API (``add_request(..., max_new_tokens=n)``), which
  ``generate_batch`` itself wraps.

Every run is timed at the client side on one clock: all requests are handed over at t = 0, tokens stamped as they are
produced (kvlab: the engine's wall clock; transformers: its ``record_timestamps``). ``output_tokens_per_s`` = output
tokens / (last token - t0). A small warm-up of each implementation runs first and is not counted. Every cell then runs
once per *round* (``--rounds``), with paired ratios (``kvlab/rounds.py``); the run with the median throughput stands for
its cell (all are kept, with their spread). Threads default to 1 for every implementation (see kvlab/threads.py).

Two extra measurements:

- **spread**: continuous / static throughput when output lengths are all equal, then spread wider around the same mean
  (``SPREADS``): static batching waits for the longest member. Next to each measured ratio, the ratio the cost model
  predicts for the same requests in virtual time (``expected_ratio_cost_model``): what step costs alone imply, without
  the machine's noise.
- **paged vs reservation**: the mixed workload in one KV budget (``--kv-budget-tokens``, default 4 x max_model_len) with
  paged blocks and with max-length reservation (``kvlab.serving.reservation``): concurrent sequences (peak and
  time-weighted mean) and the waste of each (KV slots allocated but holding no token, time-weighted over steps). The
  block accounting does not depend on which executor prices a step, so this part runs in virtual time on the shipped
  cost model, with ``max_seqs`` high enough that memory is the limit (``kvlab/benchmarks/kv_allocation.py``).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvlab.clocks import RequestRecord, summarize
from kvlab.model.config import PRESETS, preset
from kvlab.model.decoder import Decoder, build_model
from kvlab.model.loading import to_transformers
from kvlab.serving.cost_model import CostModel, load_calibration
from kvlab.serving.config import SERVE_SPEC, EngineSpec
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import MAX_BATCH_TOKENS, Policy, SchedulerConfig
from kvlab.results_io import write_json
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.workload import Request
from kvlab.rounds import format_load, format_spread, load_average, paired_ratio, rotated
from kvlab.rounds import spread as spread_of  # run_benchmark has an argument named spread
from kvlab.benchmarks.kv_allocation import paged_vs_reservation, print_paging

SPREADS = ((36, 36), (20, 52), (8, 64))  # output lengths spread evenly over [lo, hi]: one mean (36), wider spread
ENTRY_KEYS = ("impl", "policy", "outputs", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
              "e2e_p95_s", "completed", "failed")


@dataclass(frozen=True)
class BenchSettings:
    """What every run of the benchmark shares."""

    config: str = "llama-30m"
    # Sized so that the defaults (9 cells x 5 rounds) take about 6 minutes of one core: four batches of max_seqs
    # for static batching, outputs whose longest is 8 x the shortest (what static batching waits for), and prompts
    # short enough that decoding, where the two policies differ, is most of the work (cost model: 1.20 x).
    requests: int = 32
    prompt_tokens: tuple[int, int] = (16, 128)
    output_tokens: tuple[int, int] = (8, 64)
    max_seqs: int = 8
    max_batch_tokens: int = MAX_BATCH_TOKENS
    block_size: int = SERVE_SPEC.block_size
    max_model_len: int = 1024
    seed: int = 0
    repeats: int = 5  # interleaved rounds: every cell runs once per round, in a rotated order
    threads: int | None = LESSON_THREADS  # the lab's default on a shared machine (kvlab/threads.py)
    spreads: tuple[tuple[int, int], ...] = SPREADS

    def check(self) -> None:
        (p0, p1), (o0, o1) = self.prompt_tokens, self.output_tokens
        preset(self.config)  # raises for an unknown name, naming the presets
        if not (1 <= p0 <= p1 and 1 <= o0 <= o1):
            raise ValueError(f"need 1 <= low <= high for prompt_tokens {self.prompt_tokens} and "
                             f"output_tokens {self.output_tokens}")
        if p1 + max([o1] + [hi for _, hi in self.spreads]) > self.max_model_len:
            raise ValueError(f"prompts up to {p1} + outputs up to {o1} exceed max_model_len={self.max_model_len}")
        if self.requests < 1 or self.max_seqs < 1 or self.repeats < 1:
            raise ValueError(f"need requests, max_seqs and repeats >= 1, got {self.requests}, {self.max_seqs}, "
                             f"{self.repeats}")


def make_requests(s: BenchSettings, output_tokens: tuple[int, int] | None = None, vocab: int = 4096) -> list[Request]:
    """The benchmark's requests: seeded prompts (token ids) and output lengths, all arriving at t = 0.

    Output lengths are spread evenly over ``output_tokens`` (default ``s.output_tokens``) in a seeded order, so every
    spread of the same centre has exactly the same mean; prompts are the same whatever the output lengths.
    """
    rng = np.random.default_rng(s.seed)
    lens = rng.integers(s.prompt_tokens[0], s.prompt_tokens[1] + 1, size=s.requests)
    prompts = [rng.integers(0, vocab, size=int(n)).tolist() for n in lens]
    lo, hi = output_tokens or s.output_tokens
    outs = np.random.default_rng([s.seed, 1]).permutation(np.round(np.linspace(lo, hi, s.requests)).astype(int))
    return [Request(i, len(p), int(o), 0.0, "bench", p) for i, (p, o) in enumerate(zip(prompts, outs))]


def entry(impl: str, policy: str, outputs: str, records: list[RequestRecord], wall_s: float, **extra) -> dict:
    """One JSON row: the keys every entry carries (ENTRY_KEYS), then anything else."""
    s = summarize(records)
    d = s.to_dict()
    return {"impl": impl, "policy": policy, "outputs": outputs, "output_tokens_per_s": s.output_tokens_per_s,
            "ttft_p50_s": d["ttft_p50_s"], "ttft_p95_s": d["ttft_p95_s"], "tpot_p50_s": d["tpot_p50_s"],
            "e2e_p95_s": d["e2e_p95_s"], "completed": s.completed, "failed": s.failed,
            "output_tokens": s.output_tokens, "ttft_n": d["ttft_n"], "tpot_n": d["tpot_n"],
            "duration_s": s.duration_s, "wall_s": wall_s, **extra}


# -- the runs --------------------------------------------------------------------------------------------
def _engine(executor: Decoder | CostModel, policy: Policy, s: BenchSettings) -> Engine:
    sched = SchedulerConfig(policy=policy, max_seqs=s.max_seqs, max_batch_tokens=s.max_batch_tokens,
                            max_model_len=s.max_model_len)
    return Engine(executor, EngineSpec(block_size=s.block_size, scheduler=sched))


def run_kvlab(model: Decoder, requests: list[Request], policy: Policy,
              s: BenchSettings) -> tuple[list[RequestRecord], float, Engine]:
    engine = _engine(model, policy, s)
    t0 = time.perf_counter()
    records = engine.run(requests, clock="wall")
    return records, time.perf_counter() - t0, engine


def _cb_config(s: BenchSettings, requests: list[Request]):
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    blocks = sum(-(-(r.prompt_tokens + r.max_new_tokens) // s.block_size) for r in requests) + 8
    return ContinuousBatchingConfig(max_requests_per_batch=s.max_seqs, max_batch_tokens=s.max_batch_tokens,
                                    block_size=s.block_size, num_blocks=blocks)


def _records_from_transformers(outputs: dict, ids: list[str | None], requests: list[Request],
                               t0: float) -> list[RequestRecord]:
    records = []
    for rid, req in zip(ids, requests):
        rec = RequestRecord(req.request_id, req.prompt_tokens, req.max_new_tokens, scheduled_s=0.0)
        out = outputs.get(rid) if rid is not None else None
        if out is None or out.error is not None or not out.timestamps:
            rec.fail(time.perf_counter() - t0, "transformers_error" if out is not None else "missing")
        else:
            rec.admit(out.lifespan[0] - t0)
            for t in out.timestamps:
                rec.token(t - t0)
            rec.finish(out.timestamps[-1] - t0, output_tokens=len(out.generated_tokens))
        records.append(rec)
    return records


def run_transformers_generate_batch(hf, requests: list[Request], max_new_tokens: int,
                                    s: BenchSettings) -> tuple[list[RequestRecord], float]:
    """``generate_batch`` as a user calls it: one max_new_tokens for every prompt."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    fixed = [Request(r.request_id, r.prompt_tokens, max_new_tokens, 0.0, r.profile, r.prompt) for r in requests]
    t0 = time.perf_counter()
    out = hf.generate_batch([r.prompt for r in requests], generation_config=gen,
                            continuous_batching_config=_cb_config(s, fixed), record_timestamps=True)
    wall = time.perf_counter() - t0
    ids = list(out) if len(out) == len(fixed) else [None] * len(fixed)  # generate_batch keeps the input order
    return _records_from_transformers(out, ids, fixed, t0), wall


def run_transformers_manager(hf, requests: list[Request], s: BenchSettings) -> tuple[list[RequestRecord], float]:
    """transformers' continuous batching with each request's own max_new_tokens (the API generate_batch wraps)."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max(r.max_new_tokens for r in requests), do_sample=False,
                           eos_token_id=-1, pad_token_id=0)
    results: dict = {}
    with hf.continuous_batching_context_manager(generation_config=gen, block=True, timeout=5,
                                                continuous_batching_config=_cb_config(s, requests)) as manager:
        t0 = time.perf_counter()
        ids = [manager.add_request(r.prompt, request_id=f"bench_{r.request_id}", max_new_tokens=r.max_new_tokens,
                                   record_timestamps=True, eos_token_id=-1) for r in requests]
        while len(results) < len(requests):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = result
            elif result is None and not manager.is_running():
                break
        wall = time.perf_counter() - t0
    return _records_from_transformers(results, ids, requests, t0), wall


def simulated_ratio(requests: list[Request], cost_model: CostModel, s: BenchSettings) -> float:
    """Continuous / static output tokens/s of ``requests`` in virtual time on ``cost_model``: the
    expectation from step costs alone, free of the machine's noise, to read a measured ratio against."""
    policies: tuple[Policy, ...] = ("static", "continuous")
    tps = {p: summarize(_engine(cost_model, p, s).run(requests, clock="virtual")).output_tokens_per_s for p in policies}
    return tps["continuous"] / tps["static"]


# -- the whole benchmark ---------------------------------------------------------------------------------
def run_benchmark(s: BenchSettings = BenchSettings(), spread: bool = True, transformers: bool = True,
                  cost_model: CostModel | None = None, kv_budget_tokens: int | None = None, log=print) -> dict:
    """Every run of the benchmark; returns the report (what --json writes)."""
    from kvlab.env import environment

    s.check()
    load_before = load_average()
    config = preset(s.config)
    model = build_model(config, seed=s.seed)
    vocab = config.vocab_size
    mixed = make_requests(s, vocab=vocab)
    fixed_len = s.output_tokens[1]
    fixed = make_requests(s, (fixed_len, fixed_len), vocab=vocab)
    label = f"mixed {s.output_tokens[0]}-{s.output_tokens[1]}"
    spread_sets = {(lo, hi): make_requests(s, (lo, hi), vocab=vocab) for lo, hi in (s.spreads if spread else ())
                   if (lo, hi) != tuple(s.output_tokens)}  # the main mixed workload is measured anyway
    with torch_threads(s.threads) as threads:
        hf = None
        if transformers:
            import transformers as tr

            tr.logging.set_verbosity_error()
            hf = to_transformers(model).eval()
        warm = make_requests(replace(s, requests=2, prompt_tokens=(16, 32), output_tokens=(4, 4)), vocab=vocab)
        run_kvlab(model, warm, "continuous", s)  # warm-ups: not counted
        if hf is not None:
            run_transformers_manager(hf, warm, s)

        def kvlab_run(reqs, policy):
            return lambda: run_kvlab(model, reqs, policy, s)[:2]

        plan = [("kvlab", "static", label, kvlab_run(mixed, "static")),
                ("kvlab", "continuous", label, kvlab_run(mixed, "continuous"))]
        if hf is not None:
            plan += [("transformers", "continuous (manager, per-request max_new_tokens)", label,
                      lambda: run_transformers_manager(hf, mixed, s)),
                     ("transformers", "generate_batch", f"fixed {fixed_len}",
                      lambda: run_transformers_generate_batch(hf, mixed, fixed_len, s)),
                     ("kvlab", "continuous", f"fixed {fixed_len}", kvlab_run(fixed, "continuous"))]
        plan += [("kvlab", policy, f"{lo}-{hi}", kvlab_run(reqs, policy))
                 for (lo, hi), reqs in spread_sets.items() for policy in ("static", "continuous")]
        runs: dict[tuple, list[dict]] = {p[:3]: [] for p in plan}
        rounds, started, total = [], time.perf_counter(), s.repeats * len(plan)
        for rnd in range(s.repeats):  # interleaved rounds: a busy moment on a shared machine hits every cell alike
            order = rotated(plan, rnd)
            rounds.append({"round": rnd + 1, "order": [list(p[:3]) for p in order],
                           "load_1m_before": load_average()["1m"]})
            for impl, policy, outputs, fn in order:
                records, wall = fn()
                runs[(impl, policy, outputs)].append(entry(impl, policy, outputs, records, wall))
                done, elapsed = sum(map(len, runs.values())), time.perf_counter() - started
                log(f"  [{rnd + 1}/{s.repeats}] {impl:<13}{policy:<50}{outputs:<12}{wall:6.1f} s  "
                    f"({done}/{total} runs, {elapsed / 60:.1f} min, about {elapsed / done * (total - done) / 60:.1f} "
                    "min left)")
    results = []
    for key, rs in runs.items():  # the run with the median throughput stands for its cell; all are kept
        ordered = sorted(rs, key=lambda r: r["output_tokens_per_s"])
        tps = [r["output_tokens_per_s"] for r in rs]
        results.append({**ordered[(len(ordered) - 1) // 2], "repeats": len(rs), "runs_output_tokens_per_s": tps,
                        "spread_output_tokens_per_s": spread_of(tps)})
    cell = {(r["impl"], r["policy"], r["outputs"]): r for r in results}
    cost_model = cost_model or load_calibration(config.name)
    ratios: list[dict] = []

    def ratio(a: tuple, b: tuple) -> float:
        """The paired ratio a/b over rounds (``kvlab/rounds.py``): its median; the spread goes into ``ratios``."""
        r = paired_ratio(cell[a]["runs_output_tokens_per_s"], cell[b]["runs_output_tokens_per_s"])
        ratios.append({"a": list(a), "b": list(b), "output_tokens_per_s": r})
        return r["median"]

    spreads = []
    for lo, hi in (s.spreads if spread else ()):
        reqs = spread_sets.get((lo, hi), mixed)
        name = label if (lo, hi) == tuple(s.output_tokens) else f"{lo}-{hi}"
        row = {"outputs": f"{lo}-{hi}", "mean_output": float(np.mean([r.max_new_tokens for r in reqs]))}
        for policy in ("static", "continuous"):
            row[f"{policy}_output_tokens_per_s"] = cell[("kvlab", policy, name)]["output_tokens_per_s"]
            row[f"{policy}_ttft_p95_s"] = cell[("kvlab", policy, name)]["ttft_p95_s"]
        row["ratio_continuous_static"] = ratio(("kvlab", "continuous", name), ("kvlab", "static", name))
        row["expected_ratio_cost_model"] = simulated_ratio(reqs, cost_model, s)
        spreads.append(row)
    static, continuous = ("kvlab", "static", label), ("kvlab", "continuous", label)
    summary: dict[str, Any] = {"ratio_continuous_static": ratio(continuous, static),
               "expected_ratio_continuous_static_cost_model": simulated_ratio(mixed, cost_model, s)}
    if hf is not None:
        summary["ratio_kvlab_continuous_vs_transformers_generate_batch_fixed"] = ratio(
            ("kvlab", "continuous", f"fixed {fixed_len}"), ("transformers", "generate_batch", f"fixed {fixed_len}"))
        summary["ratio_kvlab_continuous_vs_transformers_continuous_mixed"] = ratio(
            continuous, ("transformers", "continuous (manager, per-request max_new_tokens)", label))
    summary["ratio_method"] = "median over rounds of the ratio within each round (paired); spreads in 'ratios'"
    summary["ratios"] = ratios
    paging = paged_vs_reservation(mixed, cost_model, s, kv_budget_tokens)
    env = environment()
    env.update(threads=threads, device_used="cpu")
    return {"benchmark": "batching",
            "settings": {**s.__dict__, "threads": threads, "arrival": "all at once",
                         "sampling": "greedy, no stop token",
                         "transformers_note": (f"generate_batch takes one max_new_tokens for all requests: it runs "
                                               f"fixed outputs of {fixed_len}, compared with kvlab continuous on the "
                                               "same fixed outputs; the mixed outputs go through transformers' "
                                               "manager API with per-request max_new_tokens") if hf is not None else
                         "transformers not run", "spreads": [list(x) for x in s.spreads] if spread else []},
            "env": env, "results": results, "summary": summary, "spread": spreads, "paged_vs_reservation": paging,
            "rounds": rounds, "load_average": {"before": load_before, "after": load_average()},
            "created_unix_s": time.time()}


def print_report(report: dict) -> None:
    rounds = len(report.get("rounds", [])) or report["settings"].get("repeats", 1)
    cols = ["impl", "policy", "outputs", "output_tokens_per_s", "tok/s min-max", "ttft_p50_s", "ttft_p95_s",
            "tpot_p50_s", "e2e_p95_s", "completed", "failed"]
    frame = pd.DataFrame(report["results"])
    frame["tok/s min-max"] = [f"{s['min']:.1f}-{s['max']:.1f}" for s in frame["spread_output_tokens_per_s"]]
    print(f"each cell: the run with the median output tokens/s over {rounds} interleaved rounds (min-max beside it)")
    with pd.option_context("display.width", 240, "display.max_colwidth", 50):
        print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"\npaired ratios of output tokens/s: A / B within each round, median over {rounds} rounds [IQR, min-max]")
    for r in report["summary"].get("ratios", []):
        a, b = " ".join(r["a"]), " ".join(r["b"])
        print(f"  {a:<40} / {b:<58} {format_spread(r['output_tokens_per_s'], unit='x')}")
    for k, v in report["summary"].items():
        if k.startswith("expected_"):
            print(f"{k}: {v:.2f}x (virtual time on the cost model: no noise)")
    if report["spread"]:
        print(pd.DataFrame(report["spread"]).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print_paging(report["paged_vs_reservation"])
    if "load_average" in report:
        print(format_load(report["load_average"]["before"], report["load_average"]["after"]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the report (results, summary, env) as JSON")
    parser.add_argument("--config", choices=sorted(PRESETS), default="llama-30m",
                        help="model config (default llama-30m)")
    parser.add_argument("--requests", type=int, default=32, help="requests (default 32)")
    parser.add_argument("--max-seqs", type=int, default=8, help="max batch size, the same for every run (default 8)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every implementation (default 1: on a shared machine a step split "
                             "over both cores waits for the slower one; 0 = torch's own choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=5,
                        help="interleaved rounds: every cell runs once per round, in a rotated order; the median "
                             "run is reported and ratios are paired within rounds (default 5)")
    parser.add_argument("--no-spread", action="store_true", help="skip the sweep over output-length spreads")
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' runs")
    parser.add_argument("--kv-budget-tokens", type=int, help="KV budget of the paged-vs-reservation part "
                                                             "(default 4 x max_model_len)")


def main(args: argparse.Namespace) -> int:
    s = BenchSettings(config=args.config, requests=args.requests, max_seqs=args.max_seqs,
                      threads=args.threads or None, seed=args.seed, repeats=args.rounds)
    try:
        s.check()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    load = load_average()
    print(f"kvlab bench batching: {s.config}, {s.requests} requests (prompts {s.prompt_tokens[0]}-"
          f"{s.prompt_tokens[1]}, outputs {s.output_tokens[0]}-{s.output_tokens[1]}, all at once), max batch "
          f"{s.max_seqs}, {s.repeats} rounds; {format_load(load, load)}", file=sys.stderr)
    if s.repeats < 5:
        print(f"  note: {s.repeats} round(s): spreads over fewer than 5 rounds say little", file=sys.stderr)
    report = run_benchmark(s, spread=not args.no_spread, transformers=not args.no_transformers,
                           kv_budget_tokens=args.kv_budget_tokens, log=lambda m: print(m, file=sys.stderr, flush=True))
    report["settings"]["load_average_1m"] = [report["load_average"]["before"]["1m"],
                                             report["load_average"]["after"]["1m"]]  # others share the machine
    print_report(report)
    if args.json:
        print(f"wrote {write_json(args.json, report)}", file=sys.stderr)
    return 0
