"""Benchmark: kvlab serve, transformers serve and vLLM on the same weights, the same workload, the same client.

Every engine loads one checkpoint folder (the lesson model with a byte tokenizer) and is started
once, all together; then, before any timing, each writes its greedy answer to 16 recall prompts and
the answers are compared with kvlab serve's (`three_engines.same_greedy_tokens`; a difference
stops the run). Then `--rounds` paired rounds, the engines' order rotated from round to round, each
engine measured alone while the others idle (`three_engines.measure_engine`; the CPU the idle ones take
meanwhile is recorded beside it):

- **cold** (first round only): the first `--cold` requests after the server started;
- **low load**: `--requests` short_short requests at `--low-rate` req/s;
- **warm-up** (every round, not reported): `--warmup` requests of the sweep's profile at once, so each engine
  has met the sweep's shapes (its long prompts, a full batch) and opened its connections before the timing;
- **sweep**: the `--profile` mixture at the `--rates` ladder, `--duration` s each, read at each rate's
  close, up to the first rate not served (>= 90% completed and TTFT p95 over every request sent
  <= `--slo-ttft`), then the gap between the last rate served and the first not served halved
  `--bisect` times: the knee of each round is bisected, not read off the ladder.

The engines: kvlab serve on `--threads` torch threads (kvlab's default, 1: its engine in a process of its own on
one core, its HTTP front end beside it; `--thread-twin` adds it with the engine in a thread of the front end's
process, the lever off; `--allocator-twin` adds it with malloc as the system sets it, kvlab.allocator; its engine
`BEST_SPEC`: its decode step compiled per batch size at start, `serve --compile-decode`, `--compile-twin` adds it
eager; its decodes read in the pool, `serve --attention in_place`, `--attention-twin` adds it gathering; its
prompt-chunk steps compiled for any token count, `serve --compile-mixed`, `--mixed-twin` adds them eager), transformers
serve on `--threads`, and vLLM (set up with `python -m kvlab peer vllm
--setup-only`; left out with one line when it is not) as its CPU guide recommends: TCMalloc and Intel's OpenMP
preloaded, its OpenMP threads bound to all cores but the one it keeps for its front end (on 2 cores: one and
one, the same split as kvlab's; recorded from its log). `--equal-threads N` adds kvlab serve on N torch threads.
Beside the figures, each engine's processes, OS threads and the CPU cores its process tree kept busy while it was
measured, and how late the client's requests went out (a server slow to accept shows there first).
`--second-client` measures every server again with vLLM's own benchmark client (`kvlab.benchmarks.vllm_client`).
The client runs in Linux's real-time scheduling class where the machine allows it (`kvlab.http.client_priority`;
`--client-priority normal` to not), so that no server's busy core leaves it waiting; the JSON says which.

Reported: every clock (TTFT, TPOT, E2E: p50 and p95; counts; output tokens/s) at every load, median over
rounds; each engine's knee per round; and the paired ratios other engine / kvlab serve (both kvlab
configurations as the baseline) of TTFT p95, TPOT p50 and the knee, each the median of per-round ratios
with its IQR and min-max (`kvlab.rounds`). About 8 minutes on 2 cores with the defaults (vLLM's start
included), 2 more with `--second-client`.

    python -m kvlab bench serve --json results/bench_serve.json
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from kvlab.command_args import command_args
from kvlab.http.vllm import NAME as VLLM
from kvlab.http.client_priority import realtime_client
from kvlab.benchmarks.vllm_client import CLIENT as SECOND_CLIENT
from kvlab.benchmarks.vllm_client import vllm_client_sweep
from kvlab.experiments.three_engines import (ENGINES, available_engines, measure_engine,
                                             same_greedy_tokens, server_pid, vllm_folder)
from kvlab.http.peer import BEST_SPEC, LoopbackServer, process_usage
from kvlab.experiments.two_engines import Protocol, knee, lesson_checkpoint, make_server, start_together
from kvlab.serving.config import EngineSpec
from kvlab.serving.knee import Knee
from kvlab.rounds import format_load, format_spread, load_average, paired_ratio, rotated, spread
from kvlab.results_io import save_results
from kvlab.threads import LESSON_THREADS

KVLAB = "kvlab serve"
DEFAULT_RATES = (8.0, 16.0, 32.0, 64.0, 128.0)
WARMUP = 30  # requests of the sweep's profile, at once, before every sweep: its shapes and connections met first
CLIENT_LATE_S = 0.05  # a rate whose requests went out later than this (p95) timed the client's waiting too
DURATION_S = 3.0  # seconds of load per rate: p95 over at least 24 requests, not the largest of 16
CLOCKS = ("ttft_p50_s", "ttft_p95_sent_s", "tpot_p50_s", "tpot_p95_s", "e2e_p50_s", "e2e_p95_s",
          "send_delay_p95_s")
RATIO_CLOCKS = ("ttft_p95_sent_s", "tpot_p50_s")


KVLAB_THREAD = f"{KVLAB}, engine in a thread"  # the lever off: the engine steps in a thread of the server's process
KVLAB_SYSTEM_MALLOC = f"{KVLAB}, system allocator"  # the lever off: malloc as glibc sets it (kvlab.allocator)
KVLAB_EAGER = f"{KVLAB}, eager decode"  # the lever off: no compiled decode step (kvlab.serving.compiled_decode)
KVLAB_GATHER = f"{KVLAB}, gather attention"  # the lever off: decodes' blocks copied out (cache.in_place_attention)
KVLAB_EAGER_MIXED = f"{KVLAB}, eager prompt steps"  # the lever off: steps with a prompt chunk eager (compiled_step)


@dataclass(frozen=True)
class Bench:
    """One `bench serve` run: what is measured, on which engines, and how (the command's options, read once)."""

    protocol: Protocol = Protocol(warmup=WARMUP, warm_requests=20, duration_s=DURATION_S)
    rates: tuple[float, ...] = DEFAULT_RATES
    rounds: int = 3
    engines: tuple[str, ...] = ENGINES
    threads: int | None = LESSON_THREADS
    equal_threads: int | None = None  # kvlab serve again on this many torch threads
    model: str | None = None  # a checkpoint folder instead of the lesson model
    second_client: bool = False  # vLLM's own benchmark client against every server too
    realtime: bool = True  # the client in the real-time scheduling class where the machine allows it
    thread_twin: bool = False  # kvlab serve again with its engine in a thread of the server's process
    allocator_twin: bool = False  # kvlab serve again with the system's allocator settings (kvlab.allocator)
    kvlab_spec: EngineSpec = BEST_SPEC  # kvlab serve's engine: at its best (compiled decode, in-place attention)
    compile_twin: bool = False  # kvlab serve again with its decode step eager
    attention_twin: bool = False  # kvlab serve again with its decodes' blocks gathered, not read in place
    mixed_twin: bool = False  # kvlab serve again with its prompt-chunk steps eager

    def __post_init__(self) -> None:
        if not (isinstance(self.rounds, int) and self.rounds >= 1):
            raise ValueError(f"rounds={self.rounds!r} must be an integer >= 1")
        if not self.rates or any(not r > 0 for r in self.rates):
            raise ValueError(f"rates={self.rates!r} must be positive numbers of requests per second")


def run(bench: Bench = Bench(), log: Callable[[str], None] = print) -> dict:
    """Start every engine, check their greedy tokens, measure them in rotated rounds; the rows and the summary."""
    b = bench
    todo, left_out = available_engines(b.engines)
    for e, why in left_out.items():
        log(f"{e} left out: {why}")
    folder = lesson_checkpoint(b.model) if b.model else (vllm_folder() if VLLM in todo else lesson_checkpoint())
    kvlab = {"spec": b.kvlab_spec}
    servers = [make_server(e, folder, b.threads, **(kvlab if e == KVLAB else {})) for e in todo]
    twins: list[tuple[str, dict, bool]] = [
        (f"{KVLAB}, {b.equal_threads} threads", {**kvlab, "threads": b.equal_threads},
         b.equal_threads not in (None, b.threads)),
        (KVLAB_THREAD, {**kvlab, "threads": b.threads, "engine_in_thread": True}, b.thread_twin),
        (KVLAB_SYSTEM_MALLOC, {**kvlab, "threads": b.threads, "allocator": "system"}, b.allocator_twin),
        (KVLAB_EAGER, {"threads": b.threads, "spec": b.kvlab_spec.replace(compile_sizes=())},
         b.compile_twin and bool(b.kvlab_spec.compile_sizes)),
        (KVLAB_GATHER, {"threads": b.threads, "spec": b.kvlab_spec.replace(attention="gather")},
         b.attention_twin and b.kvlab_spec.attention != "gather"),
        (KVLAB_EAGER_MIXED, {"threads": b.threads, "spec": b.kvlab_spec.replace(compile_mixed=False)},
         b.mixed_twin and b.kvlab_spec.compile_mixed)]
    for name, settings, wanted in twins:  # kvlab serve again with one lever changed, each right after kvlab serve
        if KVLAB in todo and wanted:
            servers.insert(1, make_server(KVLAB, folder, **settings))
            servers[1].name = name
    before = load_average()
    log(f"starting {', '.join(s.name for s in servers)} on {folder} (vLLM takes 50-100 s) ...")
    t0 = time.perf_counter()
    start_together(servers)
    started_s = time.perf_counter() - t0
    try:
        log(f"all answered after {started_s:.0f} s; greedy answers to 16 prompts ...")
        greedy = same_greedy_tokens(servers)
        if not greedy["same"]:
            raise RuntimeError(f"the engines' greedy answers differ on {len(greedy['differ'])} of "
                               f"{greedy['prompts']} prompts, so they do not compute the same thing: "
                               f"{greedy['differ'][:2]}")
        log(f"same greedy tokens on all {greedy['prompts']} prompts; {b.rounds} rounds follow")
        with realtime_client(b.realtime) as priority:
            log(f"the client's scheduling class: {priority}")
            frames, usage, second = measure_rounds(servers, b, priority.why is None, log)
        described = {s.name: s.describe() for s in servers}
    finally:
        for server in servers:
            server.stop()
    frame = pd.concat(frames, ignore_index=True)
    out = {"frame": frame, "servers": described, "greedy": greedy, "left_out": left_out, "started_s": started_s,
           "usage": usage, "second_client": second, "load_before": before, "load_after": load_average(),
           "equal_threads": b.equal_threads, "client_priority": str(priority)}
    return {**out, **summarize(frame, [s.name for s in servers], b.rounds, b.protocol.slo_ttft_s, max(b.rates), usage)}


def measure_rounds(servers: Sequence[LoopbackServer], bench: Bench, realtime: bool,
                   log: Callable[[str], None]) -> tuple[list[pd.DataFrame], list[dict], pd.DataFrame | None]:
    """Every server measured alone in each round, the order rotated; then vLLM's client against each if asked."""
    frames, usage, p = [], [], bench.protocol
    for r in range(bench.rounds):
        for server in rotated(servers, r):
            log(f"  round {r + 1}/{bench.rounds}: {server.name}")
            others = {s.name: process_usage(server_pid(s)) for s in servers if s is not server}
            t_others = time.perf_counter()
            rows, used = measure_engine(server, bench.rates, dataclasses.replace(p, seed=p.seed + r), cold=r == 0, log=log)
            frames.append(pd.DataFrame(rows).assign(round=r))
            usage.append({**used, "round": r, "others_cores_busy": others_busy(servers, server, others,
                                                                               time.perf_counter() - t_others)})
    second = (vllm_client_table(servers, bench.rates, p.duration_s, p.sweep_profile, p.seed, log, realtime)
              if bench.second_client else None)
    return frames, usage, second


def others_busy(servers: Sequence[LoopbackServer], measured: LoopbackServer, before: dict, wall_s: float) -> dict:
    """{server: CPU cores it kept busy on average} for every server but `measured`, over `wall_s` since `before`
    (their `process_usage`): what the idle servers took from the one being measured."""
    nows = {s.name: process_usage(server_pid(s)) for s in servers
            if s is not measured and before.get(s.name) is not None and s.alive()}
    return {name: round((now["cpu_s"] - before[name]["cpu_s"]) / wall_s, 3) if now and wall_s > 0 else None
            for name, now in nows.items()}


def vllm_client_table(servers: Sequence[LoopbackServer], rates: Sequence[float], duration_s: float, profile: str,
                      seed: int, log: Callable[[str], None] = print, realtime: bool = False) -> pd.DataFrame:
    """vLLM's own benchmark client (`kvlab.benchmarks.vllm_client`) against every server, at the ladder's rungs
    but the top (past every knee it would only wait for a queue to drain), in kvlab's client's scheduling class."""
    rows, rungs = [], sorted(float(r) for r in rates)[:-1]
    for server in servers:
        log(f"  {SECOND_CLIENT} against {server.name} at {', '.join(f'{r:g}' for r in rungs)} req/s ...")
        try:
            rows += vllm_client_sweep(server, rungs, duration_s, profile, seed, warmups=WARMUP, realtime=realtime)
        except RuntimeError as e:  # one server's failure is that server's row, not the end of the benchmark
            log(f"    {SECOND_CLIENT} could not measure {server.name}: {e}")
            rows.append({"engine": server.name, "client": SECOND_CLIENT, "error": str(e)})
    return pd.DataFrame(rows)


def _rows(frame: pd.DataFrame, r: int, engine: str) -> pd.DataFrame:
    return frame[(frame["round"] == r) & (frame.engine == engine)]


def _at(frame: pd.DataFrame, r: int, engine: str, phase: str, rate: float, col: str) -> float:
    g = _rows(frame, r, engine)
    hit = g[(g.phase == phase) & (g.offered_rps == rate)]
    return float(hit[col].iloc[0]) if len(hit) else float("nan")


def clock_table(frame: pd.DataFrame, engines: Sequence[str]) -> pd.DataFrame:
    """Every clock at every load (cold, low load, each ladder rate), the median over the rounds that measured it."""
    kept = frame[(frame.phase != "sweep") | (frame.get("step", "ladder") == "ladder")]
    return pd.DataFrame([{"engine": e, "level": {"cold": "cold", "warm": "low load"}.get(phase, f"{rate:g} req/s"),
                          "offered_rps": rate, "rounds": len(g), "sent": int(g.sent.median()),
                          "completed": float(g.completed.median()), "served": float(g.served.median()),
                          **{c: float(g[c].median()) if c in g else float("nan") for c in CLOCKS},
                          "output_tokens_per_s": float(g.output_tokens_per_s.median())}
                         for e in engines
                         for (phase, rate), g in kept[kept.engine == e].groupby(["phase", "offered_rps"], sort=False)])


def bound_row(rows: pd.DataFrame, k: Knee) -> dict | None:
    """The sweep row that bounded a round's knee: the first rate above it that did not keep up (the lowest rate
    when behind from the start; None when every rate kept up). Its failure is what the knee says; if the client
    was late there, the failure may be the client's."""
    sweep = rows[rows.phase == "sweep"].sort_values("offered_rps")
    if k.case == "kept_up" or not len(sweep):
        return None
    above = sweep if k.rps is None else sweep[sweep.offered_rps > k.rps]
    return above.iloc[0].to_dict() if len(above) else None


def summarize(frame: pd.DataFrame, engines: Sequence[str], rounds: int, slo_ttft_s: float, top_rate: float,
              usage: Sequence[dict] = (), min_served: float = 0.9) -> dict:
    """Knees per round, paired ratios other / kvlab serve of the clocks at each level and of the knee, usage."""
    knees = {e: [knee(_rows(frame, r, e)[_rows(frame, r, e).phase == "sweep"], slo_ttft_s, min_served)
                 for r in range(rounds)] for e in engines}
    baselines = [e for e in engines if e.startswith(KVLAB)]
    levels = [("warm", float(frame[frame.phase == "warm"].offered_rps.iloc[0]))]
    ladder = frame[(frame.phase == "sweep") & (frame.get("step", "ladder") == "ladder")]
    levels += [("sweep", float(x)) for x in sorted(ladder.offered_rps.unique())]
    ratios, knee_ratios = [], []
    for base in baselines:
        for other in (e for e in engines if e != base and not (e.startswith(KVLAB) and base != KVLAB)):
            for phase, rate in levels:
                for col in RATIO_CLOCKS:
                    pairs = [(_at(frame, r, other, phase, rate, col), _at(frame, r, base, phase, rate, col))
                             for r in range(rounds)]
                    pairs = [(a, b) for a, b in pairs if np.isfinite(a) and np.isfinite(b)]
                    if pairs:  # a rate both reached in the same round
                        ratios.append({"engine": other, "over": base, "level": "low load" if phase == "warm"
                                       else f"{rate:g} req/s", "offered_rps": rate, "clock": col,
                                       **paired_ratio([a for a, _ in pairs], [b for _, b in pairs])})
            ks = [(a.at_least or 0.0) / b.at_least if b.at_least else float("nan")
                  for a, b in zip(knees[other], knees[base])]
            bounds = [bound_row(_rows(frame, r, e), knees[e][r]) for r in range(rounds) for e in (other, base)]
            deciding = [row for row in bounds if row is not None]
            late = sum(bool(row.get("send_delay_p95_s", 0.0) > CLIENT_LATE_S) for row in deciding)
            knee_ratios.append({"engine": other, "over": base, **spread(ks),
                                "capped": any(k.case == "kept_up" for k in knees[other] + knees[base]),
                                "client_late_rates": late, "rates": len(deciding)})
    used = pd.DataFrame(list(usage))
    usage_by_engine = {e: {"processes": int(g.processes.max()) if g.processes.notna().any() else None,
                           "threads": int(g.threads.max()) if g.threads.notna().any() else None,
                           "torch_threads": (None if "torch_threads" not in g or pd.isna(g.torch_threads.iloc[0])
                                             else int(g.torch_threads.iloc[0])),
                           "cores_busy": spread(list(g.cores_busy.dropna())),
                           "others_cores_busy_max": max((c or 0.0 for d in g.get("others_cores_busy", ())
                                                         for c in (d or {}).values()), default=0.0)}
                       for e, g in (used.groupby("engine", sort=False) if not used.empty else ())}
    return {"clocks": clock_table(frame, engines), "knees": knees, "ratios": pd.DataFrame(ratios),
            "knee_ratios": knee_ratios, "usage_by_engine": usage_by_engine}


# -- the command -------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab bench serve`; their defaults are `Bench()`'s."""
    b, pr = Bench(), Bench().protocol
    p.add_argument("--rounds", type=int, default=b.rounds, help="paired rounds (engine order rotated)")
    p.add_argument("--low-rate", type=float, default=pr.low_rate, help="req/s of the low-load level (short_short)")
    p.add_argument("--requests", type=int, default=pr.warm_requests, help="requests of the low-load level")
    p.add_argument("--cold", type=int, default=pr.cold_requests,
                   help="the first requests after each start, reported apart")
    p.add_argument("--warmup", type=int, default=pr.warmup,
                   help="requests of the sweep's profile sent at once before each sweep, every round, not reported")
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in b.rates),
                   help="the sweep's ladder, req/s, comma-separated")
    p.add_argument("--duration", type=float, default=pr.duration_s, help="seconds of load per sweep rate")
    p.add_argument("--bisect", type=int, default=pr.bisect, help="halvings of the gap around each knee")
    p.add_argument("--profile", default=pr.sweep_profile, help="workload profile of the sweep")
    p.add_argument("--slo-ttft", type=float, default=pr.slo_ttft_s, help="the knee's TTFT p95 bound, seconds")
    p.add_argument("--threads", type=int, default=b.threads, help="torch threads of kvlab serve and "
                                                                  "transformers serve")
    p.add_argument("--equal-threads", type=int, default=None,
                   help="also measure kvlab serve on this many torch threads (e.g. this machine's cores)")
    p.add_argument("--thread-twin", action="store_true",
                   help="also measure kvlab serve with its engine in a thread of the server's process (the lever off)")
    p.add_argument("--allocator-twin", action="store_true",
                   help="also measure kvlab serve with malloc as the system sets it (serve --allocator system: the "
                        "lever off)")
    p.add_argument("--eager-decode", action="store_true",
                   help="run kvlab serve without --compile-decode (its decode step compiled per batch size at start)")
    p.add_argument("--compile-twin", action="store_true",
                   help="also measure kvlab serve with its decode step eager (the lever off)")
    p.add_argument("--gather-attention", action="store_true",
                   help="run kvlab serve with --attention gather (its decodes read in the pool by default)")
    p.add_argument("--attention-twin", action="store_true",
                   help="also measure kvlab serve with --attention gather (the lever off)")
    p.add_argument("--eager-mixed", action="store_true",
                   help="run kvlab serve without --compile-mixed (its prompt-chunk steps compiled at start)")
    p.add_argument("--mixed-twin", action="store_true",
                   help="also measure kvlab serve with its prompt-chunk steps eager (the lever off)")
    p.add_argument("--no-vllm", action="store_true", help="leave vLLM out")
    p.add_argument("--no-transformers", action="store_true", help="leave transformers serve out")
    p.add_argument("--model", default=None, help="a checkpoint folder with a tokenizer (default: the lesson model)")
    p.add_argument("--seed", type=int, default=pr.seed)
    p.add_argument("--second-client", action="store_true",
                   help=f"also measure every server with {SECOND_CLIENT} (vLLM's own client, from its venv) at "
                        "the ladder's rates but the top, after the rounds")
    p.add_argument("--client-priority", choices=("realtime", "normal"), default="realtime",
                   help="the load client's scheduling class: realtime (SCHED_FIFO where allowed, so no server's busy "
                        "cores leave it waiting) or normal")
    p.add_argument("--json", default=None, help="write every round's rows and the summary here (.json)")


def _ms(x: float) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x * 1e3:,.0f}"


def report_lines(out: dict, args: argparse.Namespace) -> list[str]:
    """What the command prints: servers, greedy check, usage, every clock at every load, knees, ratios."""
    lines = [f"{e} {d['version']}: {d['command']}" + (f" (started in {d['start_s']:.0f} s)" if d.get("start_s")
                                                       else "") for e, d in out["servers"].items()]
    lines += [f"{e} left out: {why}" for e, why in out["left_out"].items()]
    g = out["greedy"]
    lines.append(f"greedy tokens: the same on all {g['prompts']} prompts ({g['max_tokens']} tokens each) on "
                 f"{len(g['answers'])} servers")
    lines.append("processes, OS threads and CPU cores kept busy while measured (median over rounds [IQR, min-max]):")
    lines += [f"  {e:<26} {u['processes']} processes, {u['threads']} threads (torch threads "
              f"{u['torch_threads'] if u['torch_threads'] is not None else 'its own'}), cores busy "
              f"{format_spread(u['cores_busy'])}; the other servers meanwhile at most "
              f"{u['others_cores_busy_max']:.2f} cores" for e, u in out["usage_by_engine"].items()]
    t = out["clocks"]
    lines.append("every clock at every load, ms (median over rounds; TTFT p95 over every request sent):")
    lines.append(f"  {'engine':<26} {'level':>10} {'sent':>5} {'served':>6} {'TTFT p50':>9} {'TTFT p95':>9} "
                 f"{'TPOT p50':>9} {'TPOT p95':>9} {'E2E p50':>9} {'E2E p95':>9} {'tok/s':>7} {'late p95':>9}")
    lines += [f"  {r.engine:<26} {r.level:>10} {r.sent:>5} {r.served:>6.2f} {_ms(r.ttft_p50_s):>9} "
              f"{_ms(r.ttft_p95_sent_s):>9} {_ms(r.tpot_p50_s):>9} {_ms(r.tpot_p95_s):>9} "
              f"{_ms(r.e2e_p50_s):>9} {_ms(r.e2e_p95_s):>9} {r.output_tokens_per_s:>7.0f} "
              f"{_ms(r.send_delay_p95_s):>9}" for r in t.itertuples()]
    lines.append("  (late p95: how long after its scheduled time the client's request went out, p95; a server slow to "
                 "accept connections shows here)")
    lines.append(f"knees (the highest rate before the first without >= 90% served and TTFT p95 <= {args.slo_ttft:g} s, "
                 f"{args.profile}; bisected {args.bisect} times), per round:")
    lines += [f"  {e:<26} {'; '.join(map(str, ks))}  median "
              f"{format_spread(spread([k.at_least or 0.0 for k in ks]), '{:.1f}')}" for e, ks in out["knees"].items()]
    frame = out["frame"]
    if "send_delay_p95_s" in frame:
        lines.append(f"the client's own lateness (requests sent more than {CLIENT_LATE_S * 1e3:.0f} ms after their "
                     "scheduled time, p95), per engine over every sweep rate of every round:")
        for e, g in frame[frame.phase == "sweep"].groupby("engine", sort=False):
            late = g[g.send_delay_p95_s > CLIENT_LATE_S]
            lines.append(f"  {e:<26} late at {len(late)} of {len(g)} rates (worst {_ms(g.send_delay_p95_s.max())} ms)"
                         + (": the machine left the client waiting, so these rows time the machine as much as the "
                            "engine" if len(late) else ""))
    lines.append(f"paired ratios engine / kvlab serve, median of {args.rounds} rounds [IQR, min-max]:")
    lines += [f"  knee {k['engine']} / {k['over']}: {'>= ' if k['capped'] else ''}{format_spread(k, unit='x')}"
              + (f" (not a verdict: the client was late at {k['client_late_rates']} of the {k['rates']} rates "
                 "where a knee was found to end)" if k.get("client_late_rates") else "") for k in out["knee_ratios"]]
    ratios = out["ratios"]
    for r in ratios.itertuples() if len(ratios) else ():
        s = {"median": r.median, "q1": r.q1, "q3": r.q3, "min": r.min, "max": r.max}
        lines.append(f"  {r.level:>11} {r.clock:<16} {r.engine} / {r.over}: {format_spread(s, unit='x')} n={r.n}")
    second = out.get("second_client")
    if second is not None and len(second):
        lines += second_client_lines(second, t)
    lines.append(f"the client's scheduling class: {out.get('client_priority', 'normal')}")
    lines.append(format_load(out["load_before"], out["load_after"]))
    return lines


def second_client_lines(second: pd.DataFrame, clocks: pd.DataFrame) -> list[str]:
    """kvlab's client (median over rounds) beside vLLM's (one run) at each rate: TTFT p50/p95, TPOT p50, tok/s."""
    lines = [f"the same servers, rates and requests through two clients, ms (kvlab: median over rounds; "
             f"{SECOND_CLIENT}: one run):",
             f"  {'engine':<26} {'req/s':>6} {'client':<17} {'done':>8} {'TTFT p50':>9} {'TTFT p95':>9} "
             f"{'TPOT p50':>9} {'tok/s':>7}"]
    for r in second.itertuples():
        if isinstance(getattr(r, "error", None), str):
            lines.append(f"  {r.engine:<26} {SECOND_CLIENT} failed: {r.error.splitlines()[-1][:120]}")
            continue
        ours = clocks[(clocks.engine == r.engine) & (clocks.offered_rps == r.offered_rps)
                      & ~clocks.level.isin(["cold", "low load"])]
        if len(ours):
            o = ours.iloc[0]
            lines.append(f"  {r.engine:<26} {r.offered_rps:>6g} {'kvlab bench serve':<17} {o.served:>8.2f} "
                         f"{_ms(o.ttft_p50_s):>9} {_ms(o.ttft_p95_sent_s):>9} {_ms(o.tpot_p50_s):>9} "
                         f"{o.output_tokens_per_s:>7.0f}")
        if r.completed == 0:  # no clock to read: say so, with the first error where the client gave one
            why = getattr(r, "first_error", None)
            lines.append(f"  {r.engine:<26} {r.offered_rps:>6g} {SECOND_CLIENT:<17} every request failed"
                         + (f": {why.strip().splitlines()[-1][:100]}" if isinstance(why, str) and why.strip()
                            else " (its client gave no reason)"))
            continue
        lines.append(f"  {r.engine:<26} {r.offered_rps:>6g} {SECOND_CLIENT:<17} {r.served:>8.2f} {_ms(r.ttft_p50_s):>9} "
                     f"{_ms(r.ttft_p95_s):>9} {_ms(r.tpot_p50_s):>9} {r.output_tokens_per_s:>7.0f}")
    return lines


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run, print and save the comparison."""
    args = command_args(args, "python -m kvlab bench serve", __doc__, add_arguments)
    rates = tuple(float(x) for x in args.rates.split(",") if x.strip())
    engines = [e for e in ENGINES if not (e == VLLM and args.no_vllm)
               and not (e == "transformers serve" and args.no_transformers)]
    t0 = time.perf_counter()
    protocol = Protocol(low_rate=args.low_rate, cold_requests=args.cold, warmup=args.warmup,
                        warm_requests=args.requests, sweep_profile=args.profile, duration_s=args.duration,
                        slo_ttft_s=args.slo_ttft, bisect=args.bisect, seed=args.seed)
    bench = Bench(protocol, rates, args.rounds, tuple(engines), args.threads, args.equal_threads, args.model,
                  args.second_client, args.client_priority == "realtime", args.thread_twin, args.allocator_twin,
                  BEST_SPEC.replace(**({"compile_sizes": ()} if args.eager_decode else {}),
                                    **({"attention": "gather"} if args.gather_attention else {}),
                                    **({"compile_mixed": False} if args.eager_mixed else {})),
                  args.compile_twin, args.attention_twin, args.mixed_twin)
    out = run(bench, log=lambda m: print(m, flush=True))
    wall = time.perf_counter() - t0
    print("\n".join(report_lines(out, args)))
    print(f"bench serve took {wall / 60:.1f} min")
    if args.json:
        settings = {**{k: v for k, v in vars(args).items() if k not in ("json", "module", "command", "subcommand")},
                    "equal_threads": out["equal_threads"], "servers": out["servers"], "greedy": out["greedy"],
                    "left_out": out["left_out"], "started_s": out["started_s"], "wall_s": wall,
                    "client_priority": out["client_priority"],
                    "clocks": out["clocks"].to_dict("records"),
                    "knees": {e: [dataclasses.asdict(k) | {"words": str(k)} for k in ks] for e, ks in out["knees"].items()},
                    "knee_ratios": out["knee_ratios"], "ratios": out["ratios"].to_dict("records"),
                    "usage": out["usage"], "usage_by_engine": out["usage_by_engine"],
                    "second_client": (None if out["second_client"] is None
                                      else out["second_client"].to_dict("records")),
                    "load_before": out["load_before"], "load_after": out["load_after"]}
        print(f"wrote {save_results(args.json, out['frame'], settings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
