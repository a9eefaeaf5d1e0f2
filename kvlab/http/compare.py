"""Client-side vs engine-side clocks of the same requests: what HTTP, the event loop and streaming add.

kvlab's server keeps the engine's own `RequestRecord` of each recent request (`GET /kvlab/requests`; engine clock,
started when the server received the request), and the load generator keeps the response id it saw. Joined on that id,
each request has both clocks side by side:

- `client_ttft_s`: the four-clocks TTFT, from the *scheduled* arrival;
- `client_ttft_from_sent_s`: from when the request went on the wire;
- `engine_ttft_s`: from the server receiving it to the engine sampling the first token;
- `ttft_overhead_s = client_ttft_from_sent_s - engine_ttft_s`: sending the request, handing it to the engine thread,
  and streaming the token back. It is >= 0 by causality (the client sends before the server receives, and reads after
  the engine produced), whatever the two clocks' origins.

Likewise `e2e_overhead_s`. At low load, the median `ttft_overhead_s` is the
cost of HTTP and streaming (goal: <= 5 ms on loopback).
"""

from __future__ import annotations

from typing import Sequence

import httpx
import pandas as pd

from kvlab.clocks import RequestRecord, quantiles
from kvlab.http.client import api_key_from_env, auth_headers
from kvlab.http.loadgen import LoadTestResult, base_url, http_workload, run_loadtest


def fetch_engine_records(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> list[RequestRecord]:
    """The engine-side records kvlab's server kept (`GET /kvlab/requests`; `api_key`: default `$KVLAB_API_KEY`)."""
    resp = httpx.get(base_url(url) + "/kvlab/requests", timeout=timeout_s, trust_env=False,
                     headers=auth_headers(api_key_from_env(api_key)))
    if resp.status_code == 404:
        raise ValueError(f"{base_url(url)} has no /kvlab/requests: engine-side clocks exist only for kvlab's own "
                         "server (python -m kvlab serve)")
    resp.raise_for_status()
    return [RequestRecord(**d) for d in resp.json()]


def compare_clocks(client: LoadTestResult | Sequence[RequestRecord],
                   engine: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request completed on both sides, client and engine clocks side by side (seconds)."""
    client_records = client.records if isinstance(client, LoadTestResult) else list(client)
    by_id: dict[int | str | None, RequestRecord] = {r.request_id: r for r in engine}
    rows = []
    for c in client_records:
        e = by_id.get(c.extra.get("response_id"))
        if e is None or c.status != "completed" or e.status != "completed":
            continue
        cc, ec = c.clocks(), e.clocks()
        assert c.sent_s is not None  # RequestRecord.__post_init__ sets it
        sent = c.sent_s - c.scheduled_s
        rows.append({"request_id": c.request_id, "response_id": e.request_id, "prompt_tokens": c.prompt_tokens,
                     "output_tokens": c.output_tokens, "engine_output_tokens": e.output_tokens,
                     "client_ttft_s": cc["ttft_s"], "client_ttft_from_sent_s": cc["ttft_s"] - sent,
                     "engine_ttft_s": ec["ttft_s"], "engine_queue_s": ec["queue_s"],
                     "ttft_overhead_s": cc["ttft_s"] - sent - ec["ttft_s"], "client_e2e_s": cc["e2e_s"],
                     "engine_e2e_s": ec["e2e_s"], "e2e_overhead_s": cc["e2e_s"] - sent - ec["e2e_s"],
                     "client_tpot_s": cc["tpot_s"], "engine_tpot_s": ec["tpot_s"]})
    return pd.DataFrame(rows)


def overhead_summary(frame: pd.DataFrame) -> dict:
    """Quantiles (with n) of the TTFT and E2E overheads, in seconds."""
    if frame.empty:
        raise ValueError("no request completed on both sides; is this kvlab's server, and did any request complete?")
    return {"ttft_overhead": quantiles(frame.ttft_overhead_s), "e2e_overhead": quantiles(frame.e2e_overhead_s),
            "client_ttft": quantiles(frame.client_ttft_s), "engine_ttft": quantiles(frame.engine_ttft_s)}


def measure_http_overhead(url: str, num_requests: int = 40, rate: float = 4.0, max_new_tokens: int = 8,
                          profile: str = "short_short", seed: int = 0, chat: bool = False,
                          model: str | None = None, api_key: str | None = None) -> pd.DataFrame:
    """Send a low, constant load to kvlab's server at `url` and return `compare_clocks` of it.

    Low load on purpose: with nothing queued, the difference between the clocks is
    the wire and the server plumbing, not waiting for a batch slot.
    """
    requests = http_workload(profile, num_requests, arrival="constant", rate=rate, seed=seed)
    for r in requests:
        r.max_new_tokens = max_new_tokens
    result = run_loadtest(url, requests, model, chat=chat, extra_body={"ignore_eos": True}, progress=False,
                          api_key=api_key)
    frame = compare_clocks(result, fetch_engine_records(url, api_key=api_key))
    frame.attrs["settings"] = {**result.settings, "rate": rate, "max_new_tokens": max_new_tokens}
    return frame
