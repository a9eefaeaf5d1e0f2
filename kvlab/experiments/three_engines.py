"""Three real engines, one client: kvlab serve, transformers serve and vLLM on one checkpoint, knees bisected.

The two-engine comparison (`two_engines`) with vLLM beside it, when vLLM is set up (`python -m kvlab peer vllm
--setup-only`, `kvlab.http.vllm`): the same folder, the same seeded workload, the same load client, each engine measured
alone while the others idle. What it adds:

- `same_greedy_tokens`: before any timing, greedy answers to `GREEDY_PROMPTS` (16 recall queries)
  from every engine, compared with kvlab serve's;
- `knee_search`: the sweep's ladder up to the first rate not served, then the gap between the last
  rate served and the first not served halved `bisect` times, so a knee is not read off a doubling ladder;
- `usage`: the processes, OS threads and CPU seconds of each server's process tree over its measurement
  (`kvlab.http.peer.process_usage`), so "kvlab on one thread, vLLM on three processes" is a measured row.
A panel shows them as one table and one figure of the three engines, or, without vLLM, one line saying how to set
it up. `python -m kvlab bench serve` repeats the same in paired rounds.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Sequence

import httpx

from kvlab.experiments.recall import make_examples
from kvlab.experiments.two_engines import Protocol, cold_and_warm, lesson_checkpoint, sweep, warm_row, within_knee
from kvlab.http.peer import LoopbackServer, greedy_answer, process_usage, transformers_serve_available
from kvlab.http.vllm import NAME as VLLM
from kvlab.http.vllm import vllm_home, vllm_status

ENGINES = ("kvlab serve", "transformers serve", VLLM)
GREEDY_PROMPTS = [e.prompt for n in (3, 12) for e in make_examples(8, n, seed=9)]  # 16 recall queries, short and long
NOTEBOOK_RATES = (8.0, 24.0, 48.0, 96.0)  # the lesson's ladder and one rung more: vLLM keeps up past 48 req/s
_GAUGE = re.compile(r"^[\w:]*num_requests_(waiting|running)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")


# -- the servers --------------------------------------------------------------------------------------
def vllm_folder() -> Path:
    """The lesson checkpoint where vLLM's compile cache finds it again (a stable path under vLLM's home)."""
    return lesson_checkpoint(vllm_home() / "models" / "recall-tiny")


def available_engines(engines: Sequence[str] = ENGINES) -> tuple[list[str], dict]:
    """(the engines that can run here, {engine left out: one line why})."""
    checks: dict[str, Callable[[], tuple[bool, str]]] = {"transformers serve": transformers_serve_available,
                                                         VLLM: vllm_status}
    checked = {e: checks[e]() for e in engines if e in checks}
    left_out = {e: why for e, (ok, why) in checked.items() if not ok}
    return [e for e in engines if e not in left_out], left_out


def same_greedy_tokens(servers: Sequence[LoopbackServer], prompts: Sequence[str] = GREEDY_PROMPTS,
                       max_tokens: int = 16) -> dict:
    """Each server's greedy answer (temperature 0, `max_tokens` tokens) to each prompt, against the first server's.

    Returns {"prompts": n, "answers": {engine: [text, ...]}, "differ": [{prompt, engine: text}], "same": bool}. With
    kvlab's byte tokenizer a character is a token, so equal text is equal tokens."""
    answers = {s.name: [greedy_answer(s, p, max_tokens) for p in prompts] for s in servers}
    first = next(iter(answers))
    differ = [{"prompt": p, **{e: a[i] for e, a in answers.items()}} for i, p in enumerate(prompts)
              if len({a[i] for a in answers.values()}) > 1]
    return {"prompts": len(prompts), "max_tokens": max_tokens, "reference": first, "answers": answers,
            "differ": differ, "same": not differ}


def wait_until_quiet(server: LoopbackServer, timeout_s: float = 20.0, pause_s: float = 1.0) -> None:
    """Wait until nothing waits or runs on the server, read from its Prometheus gauges (kvlab serve's and vLLM's
    `*num_requests_waiting` / `*_running`); a server without them (transformers serve) gets `pause_s`."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        try:
            text = httpx.get(server.url + "/metrics", timeout=5.0, trust_env=False).text
        except httpx.HTTPError:
            break
        gauges = [float(m[2]) for m in map(_GAUGE.match, text.splitlines()) if m]
        if not gauges:
            break
        if sum(gauges) == 0:
            return
        time.sleep(0.1)
    time.sleep(pause_s)


# -- one engine's measurement --------------------------------------------------------------------------
def knee_search(server: LoopbackServer, ladder: Sequence[float], protocol: Protocol,
                log: Callable[[str], None] = lambda _m: None) -> list[dict]:
    """Sweep rows up the `ladder` to the first rate not served (`within_knee`), then `bisect` more rates, each the
    middle of the last rate served and the first not served. Every row is a `sweep` row (`step`: "ladder" or
    "bisect k"), so `two_engines.knee` over them reads the bisected knee. The lowest rung failing leaves
    nothing to bisect; every rung served leaves the knee at the top (a lower bound)."""
    def kept_up(row: dict) -> bool:
        return within_knee(row, protocol.slo_ttft_s, protocol.min_served)

    def at(rate: float, step: str, first: bool = False) -> dict:
        [row] = sweep(server, [rate], protocol, warm_up=first, stop_past_knee=False)
        row["step"] = step
        ok = kept_up(row)
        log(f"    {server.name:<24} {rate:6.1f} req/s ({step}): {row['completed']}/{row['sent']} completed, "
            f"TTFT p95 {row['ttft_p95_sent_s'] * 1e3:,.0f} ms -> {'kept up' if ok else 'fell behind'}")
        if not ok:
            wait_until_quiet(server)  # what it left unfinished must not land in the next rate
        return row

    rows, kept, failed = [], None, None
    for i, rate in enumerate(sorted(float(r) for r in ladder)):
        rows.append(at(rate, "ladder", first=i == 0))
        if not kept_up(rows[-1]):
            failed = rate
            break
        kept = rate
    if kept is not None and failed is not None:
        for k in range(protocol.bisect):
            mid = round((kept + failed) / 2, 1)
            if mid in (kept, failed):
                break
            rows.append(at(mid, f"bisect {k + 1}"))
            kept, failed = (mid, failed) if kept_up(rows[-1]) else (kept, mid)
    return rows


def server_pid(server: LoopbackServer) -> int:
    """The server's own process (vLLM's runs under a watchdog: `kvlab.http.vllm.GroupProcess.server_pid`)."""
    proc = server.process
    if proc is None or proc.process is None:
        raise RuntimeError(f"{server.name} is not started; call start() first")
    return getattr(proc, "server_pid", None) or proc.process.pid


def usage_between(server: LoopbackServer, before: dict | None, wall_s: float) -> dict:
    """The server's processes and threads now, and the CPU seconds (and cores busy on average) since `before`."""
    now = process_usage(server_pid(server)) if server.alive() else None
    if now is None or before is None:
        return {"engine": server.name, "processes": None, "threads": None, "cpu_s": None, "cores_busy": None}
    cpu = now["cpu_s"] - before["cpu_s"]
    return {"engine": server.name, "processes": now["processes"], "threads": now["threads"],
            "cores_allowed": now["cores_allowed"], "torch_threads": server.threads, "cpu_s": round(cpu, 2),
            "wall_s": round(wall_s, 2), "cores_busy": round(cpu / wall_s, 2) if wall_s > 0 else None}


def measure_engine(server: LoopbackServer, ladder: Sequence[float], protocol: Protocol, *, cold: bool,
                   log: Callable[[str], None] = lambda _m: None) -> tuple[list[dict], dict]:
    """One engine, alone: (cold and) warm at the low rate, then `knee_search`; its rows and its `usage_between`.

    `cold`: the first requests since the server started are reported as `cold` (a server measured again in a later round
    has only its `warm` row)."""
    t0, before = time.perf_counter(), process_usage(server_pid(server))
    rows = cold_and_warm(server, protocol) if cold else [warm_row(server, protocol)]
    rows += knee_search(server, ladder, protocol, log=log)
    return rows, usage_between(server, before, time.perf_counter() - t0)


__all__ = ["ENGINES", "GREEDY_PROMPTS", "NOTEBOOK_RATES", "available_engines", "knee_search", "measure_engine",
           "same_greedy_tokens", "usage_between", "vllm_folder", "wait_until_quiet"]
