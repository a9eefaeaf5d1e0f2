"""Claims of notebook 09 (measure a real server), checked on the learner's measurements over the wire.

The seeded schedule of requests is the same on every machine (deterministic); what the server
made of it, the window, the achieved rate, the waits and the rejections (429), is measured (wall).
The server and load generator need kvlab's "serve" extra (httpx, FastAPI, uvicorn), which
notebook 09 installs in its first cell: this module imports them only when an example runs, so
``kvlab.claims`` imports without them.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from .framework import claim

NOTEBOOK = "09_measure_a_real_server.ipynb"
LOOPBACK_GOAL_MS = 5.0  # kvlab's goal for what HTTP + streaming add to TTFT on loopback (benchmarks.http_overhead)


@lru_cache(maxsize=1)
def _server():
    """kvlab's server on loopback, started once for the examples (stopped when the interpreter exits)."""
    from ..experiments.wire import measure_at_client, start_server

    server = start_server(max_waiting=8)
    measure_at_client(server.url, num_requests=8, rate=8)  # warm, as the notebook's earlier sections leave it
    return server


def _side(seed: int = 0) -> pd.DataFrame:
    from ..experiments.wire import client_vs_engine

    return client_vs_engine(_server().url, num_requests=12, rate=10, seed=seed)


def _curve(seed: int = 0) -> pd.DataFrame:
    from ..experiments.wire import wire_service_curve

    return wire_service_curve(_server().url, rates=(8, 128), duration_s=1.0, seed=seed)


@lru_cache(maxsize=1)
def _scheduled_curve() -> pd.DataFrame:
    """The notebook's rates and seconds per rate, sent to the scripted server (no model): only the schedule matters."""
    from ..experiments.wire import wire_service_curve
    from ..http.local import ServerThread
    from ..http.testing import scripted_app

    with ServerThread(scripted_app(ttft_s=0.002, gap_s=0.001)) as server:
        return wire_service_curve(server.url, rates=(8, 32, 128), duration_s=1.5)


# -- what the wire adds ---------------------------------------------------------------------------------

@claim(NOTEBOOK, clock="wall", example=_side,
       says="HTTP and streaming added {p50:.2f} ms to the median first token (p90 {p90:.2f} ms, n={n} requests), "
            "within kvlab's loopback goal of {goal:.0f} ms; the engine's own median TTFT was {engine:.2f} ms",
       otherwise="the overhead passed the goal. On loopback it is the server's event loop and the client "
                 "competing for the same cores as the engine: close other programs and run the cell again.")
def wire_adds_little_on_loopback(side: pd.DataFrame) -> dict:
    ms = side["ttft_overhead_s"].to_numpy(dtype=float) * 1e3
    p50 = float(np.median(ms))
    return dict(p50=p50, p90=float(np.quantile(ms, 0.9)), n=int(ms.size), goal=LOOPBACK_GOAL_MS,
                engine=float(side["engine_ttft_s"].median() * 1e3), holds=p50 <= LOOPBACK_GOAL_MS)


# -- the service curve over the wire --------------------------------------------------------------------

def _rows(curve: Any) -> pd.DataFrame:
    table = getattr(curve, "frame", curve)  # a panel result or the table itself
    if table is None or len(table) == 0:
        raise ValueError("the service curve has no rows")
    return table.sort_values("offered_rps").reset_index(drop=True)


@claim(NOTEBOOK, clock="deterministic", example=_scheduled_curve,
       says="the seeded Poisson schedule sends close to the offered rate, not exactly it: {parts}",
       otherwise="at some rate the schedule strayed by more than a quarter from the offered rate. With few "
                 "requests per rate a random draw of arrival times can bunch up or spread out; raise the seconds "
                 "per rate. This is the client's schedule, not the server.")
def seeded_schedule_sends_near_offered(curve: Any) -> dict:
    t = _rows(curve)
    parts = "; ".join(f"{int(r.sent)} requests over {r.scheduled_span_s:.2f} s at {r.offered_rps:g} req/s offered "
                      f"({r.sent_rps:.1f} req/s sent)" for r in t.itertuples())
    close = ((t["sent_rps"] / t["offered_rps"] - 1).abs() <= 0.25).all()
    return dict(parts=parts, holds=bool(close) and bool((t["sent"] == t["num_requests"]).all()))


@claim(NOTEBOOK, clock="wall", example=_curve,
       says="at {offered:g} req/s offered nothing was turned away: {sent} requests were sent over {span:.2f} s "
            "({sent_rps:.1f} req/s), all {completed} completed, and the window ran on {drain:.2f} s past the last "
            "arrival until the last answer ended, so achieved = {completed} / {window:.2f} s = {achieved:.1f} "
            "req/s. The server kept up; the gap to {offered:g} is the draw and the drain",
       otherwise="the window ran on long after the last arrival. Either the server was still working off a queue "
                 "(at this rate it did not keep up, and the achieved rate is what it could serve), or the last "
                 "answers were slow because the machine was busy. Run the panel again; if it persists, offer less.")
def achieved_rate_below_offered_explained(curve: Any) -> dict:
    t = _rows(curve)
    clean = t[(t["rejected"] == 0) & (t["failed_other"] == 0) & (t["completed"] == t["sent"])]
    if clean.empty:
        raise ValueError("every offered rate had rejections or failures; there is no rate that was kept up with")
    r = clean.iloc[-1]  # the highest rate with nothing turned away
    return dict(offered=float(r.offered_rps), sent=int(r.sent), span=float(r.scheduled_span_s),
                sent_rps=float(r.sent_rps), completed=int(r.completed), drain=float(r.drain_s),
                window=float(r.window_s), achieved=float(r.requests_per_s),
                holds=float(r.requests_per_s) >= 0.8 * float(r.sent_rps))


@claim(NOTEBOOK, clock="wall", example=_curve,
       says="at {offered:g} req/s offered the full queue turned {rejected} of {sent} requests away with 429 at once; "
            "{completed} completed, {achieved:.1f} req/s against {sent_rps:.1f} sent",
       otherwise="nothing was turned away: this machine kept up with every rate offered (or the queue is long). "
                 "Add 256 and 512 req/s in the panel to find where it stops.")
def full_queue_turns_requests_away(curve: Any) -> dict:
    r = _rows(curve).iloc[-1]
    return dict(offered=float(r.offered_rps), rejected=int(r.rejected), sent=int(r.sent), completed=int(r.completed),
                achieved=float(r.requests_per_s), sent_rps=float(r.sent_rps),
                holds=int(r.rejected) > 0 and int(r.failed_other) == 0)


@claim(NOTEBOOK, clock="wall", example=_curve,
       says="TTFT p50 rose from {lo_ms:.1f} ms at {lo:g} req/s (n={n_lo}) to {hi_ms:.1f} ms at {hi:g} req/s "
            "(n={n_hi}), {ratio:.1f}× as long",
       otherwise="the wait did not grow clearly: the highest rate was still within what this machine serves. Add "
                 "higher rates in the panel.")
def wait_grows_past_capacity(curve: Any) -> dict:
    t = _rows(curve)
    lo, hi = t.iloc[0], t.iloc[-1]
    ratio = float(hi.ttft_p50_s) / float(lo.ttft_p50_s)
    return dict(lo=float(lo.offered_rps), hi=float(hi.offered_rps), lo_ms=lo.ttft_p50_s * 1e3,
                hi_ms=hi.ttft_p50_s * 1e3, n_lo=int(lo.ttft_n), n_hi=int(hi.ttft_n), ratio=ratio,
                holds=len(t) > 1 and ratio > 1.5)
