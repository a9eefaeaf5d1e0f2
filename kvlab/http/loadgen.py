"""The HTTP load generator: the four clocks measured at the client of any OpenAI-compatible server.

It replays a `kvlab.workload` against `/v1/completions` (or `/v1/chat/completions`) of kvlab's own server, vLLM,
SGLang, TGI or llama.cpp's server, and stamps one `kvlab.clocks.RequestRecord` per request, so the same `summarize` /
`requests_frame` / plots serve in-process and over-the-wire runs.

How it measures (as vLLM's `bench serve` does, by its metrics documentation):

- **Open loop.** A request is dispatched at its scheduled arrival whether or not earlier ones have finished. Every
  clock starts at the *scheduled* arrival (`scheduled_s`); `sent_s` is when its request headers actually went on the
  wire (httpcore's trace hook), so a client or connection pool that falls behind shows up as `send_delay_s` instead of
  hiding the wait (coordinated omission). Times are seconds since the run started.
- **Tokens are chunk arrivals.** Each server-sent event whose choice carries non-empty text (`text`, or `delta.content`
  for chat) is stamped when its line is read. Role-only and finish-only chunks are not tokens.
- **Output tokens** come from the server's `usage.completion_tokens` (`stream_options.include_usage`) when it sends
  one, else from the number of chunks; `extra["output_tokens_from"]` says which, per request.
- **Failures** are records too: `fail_reason` is `http_<status>[:<code>]` (e.g. `http_429:queue_full`, with the
  server's message in `extra["error"]` and `Retry-After` in `extra["retry_after_s"]`), `connect_error`, `timeout`,
  `transport_error`, `stream_error`, `bad_chunk`, `incomplete_stream`, or `deadline` (the run's overall deadline passed
  first; `extra["sent"]` is False if it was never dispatched). Nothing is retried: a retry would be a new request the
  workload did not ask for.
- **Connections**: up to `max_connections` HTTP/1.1 keep-alive connections (`kvlab.http.client.ConnectionLanes`); a
  request finding none free waits, and that wait shows in `send_delay_s`. Each request is bounded by `timeout_s` and
  the whole run by `deadline_s`.

The command line is `python -m kvlab loadtest` (`kvlab.http.loadtest`).

Prompts: the workload's token ids are sent as a `prompt` list of ints by default (`prompt_format="tokens"`; OpenAI's
completions API accepts token arrays, and so do vLLM and SGLang), so the server sees exactly `prompt_tokens` tokens.
`http_workload` draws those ids from 32..126: printable ASCII for kvlab's `ByteTokenizer` (one byte per token), and
valid ids (just other tokens) in any vocabulary of 127 or more. Chat can only send text: the same ids decoded as ASCII,
which is `prompt_tokens` tokens on kvlab's byte-level models and some other count on a BPE model (the server's count is
kept as `extra["prompt_tokens_reported"]`). Use `prompt_format="text"` for servers that refuse token arrays.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx
import numpy as np
import pandas as pd

from kvlab.clocks import SLO, RequestRecord, Summary, requests_frame, summarize
from kvlab.http.client import ConnectionLanes, api_key_from_env, auth_headers, stream_request
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.results_io import save_results
from kvlab.traces import replay_trace
from kvlab.workload import Request, make_workload

PROMPT_FORMATS = ("tokens", "text")
PRINTABLE_FIRST, PRINTABLE_COUNT = 32, 95  # ' ' .. '~'
ENDED = ("completed", "failed")


# -- what to send ------------------------------------------------------------------
def http_workload(profile: str = "short_short", num_requests: int = 100, arrival: str = "poisson",
                  rate: float | None = None, burstiness: float = 1.0, seed: int = 0, trace: str | Path | None = None,
                  time_scale: float = 1.0, length_scale: float = 1.0, scale: float = 1.0,
                  max_context: int | None = None, shared_prefix_tokens: int = 0,
                  trace_format: str | None = None) -> list[Request]:
    """A seeded workload whose prompts are printable-ASCII token ids (32..126).

    With `trace` the requests replay that trace (`time_scale`, `length_scale`, the first `num_requests` rows): an
    Azure-format CSV, or a Mooncake JSON-lines trace whose shared prefix blocks stay shared (`kvlab.traces`;
    `trace_format` None: detected from the file); otherwise they come from `make_workload` and the other arguments.
    """
    if trace is not None:
        requests = replay_trace(trace, trace_format=trace_format, time_scale=time_scale, length_scale=length_scale,
                                max_requests=num_requests, vocab_size=PRINTABLE_COUNT, max_context=max_context,
                                seed=seed)
    else:
        requests = make_workload(profile, num_requests, arrival=arrival, rate=rate, burstiness=burstiness,
                                 seed=seed, vocab_size=PRINTABLE_COUNT, max_context=max_context, scale=scale,
                                 shared_prefix_tokens=shared_prefix_tokens)
    for r in requests:
        assert r.prompt is not None  # made with a vocabulary, so every request has its ids
        r.prompt = [PRINTABLE_FIRST + i for i in r.prompt]
    return requests


def _prompt_ids(request: Request, seed: int) -> list[int]:
    """The request's ids, or seeded printable-ASCII ids when it was made without a vocabulary."""
    if request.prompt is not None:
        return list(request.prompt)
    rng = np.random.default_rng([seed, int(request.request_id)])
    return (PRINTABLE_FIRST + rng.integers(0, PRINTABLE_COUNT, size=request.prompt_tokens)).tolist()


def request_body(request: Request, model: str, chat: bool = False, prompt_format: str = "tokens",
                 temperature: float = 0.0, extra_body: dict | None = None, seed: int = 0) -> dict:
    """The JSON body of one streamed request (OpenAI completions or chat completions)."""
    ids = _prompt_ids(request, seed)
    body: dict[str, Any] = {"model": model, "max_tokens": request.max_new_tokens, "temperature": temperature,
                            "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": ByteTokenizer().decode(ids)}]
    else:
        body["prompt"] = ids if prompt_format == "tokens" else ByteTokenizer().decode(ids)
    body.update(extra_body or {})
    return body


def base_url(url: str) -> str:
    """`http://host:port` from a URL given with or without a trailing `/v1`."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url {url!r} needs a scheme, e.g. http://127.0.0.1:8000")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def discover_model(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> str:
    """The first model id the server lists at `GET /v1/models` (`api_key`: default `$KVLAB_API_KEY`)."""
    try:
        resp = httpx.get(base_url(url) + "/v1/models", timeout=timeout_s, trust_env=False,
                         headers=auth_headers(api_key_from_env(api_key)))
        resp.raise_for_status()
        models = [m["id"] for m in resp.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"could not list models at {base_url(url)}/v1/models ({e}); pass model=... "
                         "(--model) explicitly") from None
    if not models:
        raise ValueError(f"{base_url(url)}/v1/models lists no model; pass model=... (--model)")
    return models[0]


# -- the result ----------------------------------------------------------------------
@dataclass
class LoadTestResult:
    """Per-request records (times in seconds since the run began), settings and wall time.

    ``settings["started_at_unix"]``: the wall-clock time (unix seconds) at which the run's clock read 0, so
    records shared later (``kvlab.room``) are placed where they happened.
    """

    records: list[RequestRecord]
    settings: dict
    wall_s: float

    def summary(self, slo: SLO | None = None, **kwargs) -> Summary:
        """`kvlab.clocks.summarize` over the records."""
        return summarize(self.records, slo=slo, **kwargs)

    def frame(self) -> pd.DataFrame:
        """`kvlab.clocks.requests_frame`: one row per request, with every clock."""
        return requests_frame(self.records)

    @property
    def output_tokens_from(self) -> str | None:
        """How completed requests' output tokens were counted: "usage", "chunks", "mixed" or "none"."""
        methods = {r.extra.get("output_tokens_from") for r in self.records if r.status == "completed"}
        return methods.pop() if len(methods) == 1 else ("mixed" if methods else "none")

    def save(self, path: str | Path, slo: SLO | None = None) -> Path:
        """Write the summary (`.json`) or the per-request frame (`.csv`) with settings and machine."""
        settings = {**self.settings, "wall_s": self.wall_s, "output_tokens_from": self.output_tokens_from}
        data = self.summary(slo) if Path(path).suffix == ".json" else self.frame()
        return save_results(path, data, settings)


# -- the run ---------------------------------------------------------------------------------
def _check_args(requests: Sequence[Request], prompt_format: str, chat: bool, timeout_s: float,
                deadline_s: float | None, max_connections: int) -> None:
    if not requests:
        raise ValueError("no requests to send; make some with http_workload(...)")
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format {prompt_format!r} is not one of {PROMPT_FORMATS}")
    if chat and prompt_format == "tokens":
        raise ValueError("chat completions take text, not token ids; use prompt_format='text' (or None)")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"deadline_s={deadline_s} must be > 0 seconds (or None: last arrival + timeout_s)")
    if not (isinstance(max_connections, int) and max_connections >= 1):
        raise ValueError(f"max_connections={max_connections!r} must be an integer >= 1")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids repeat; give each request its own request_id")


async def loadtest(url: str, requests: Sequence[Request], model: str | None = None, *, chat: bool = False,
                   prompt_format: str | None = None, timeout_s: float = 60.0, deadline_s: float | None = None,
                   max_connections: int = 256, temperature: float = 0.0, extra_body: dict | None = None,
                   progress: bool | None = None, settings: dict | None = None, seed: int = 0,
                   api_key: str | None = None) -> LoadTestResult:
    """Replay `requests` open-loop against `url`; one RequestRecord each (see module docstring).

    - `chat`: use `/v1/chat/completions` (text prompts) instead of `/v1/completions`.
    - `prompt_format`: "tokens" (default for completions) or "text" (forced for chat).
    - `timeout_s`: per request, from dispatch to the last chunk; `deadline_s`: the whole run,
      from its start (default: last arrival + timeout_s + 5 s). Both bound the run.
    - `max_connections`: HTTP/1.1 keep-alive pool size, i.e. the most requests in flight;
      a request beyond it waits for a connection, which shows as `send_delay_s`.
    - `extra_body`: merged into every body (e.g. `{"ignore_eos": True}` for vLLM or kvlab).
    - `progress`: tqdm bar; default on for 100 requests or more.
    - `settings`: recorded with the results (e.g. the workload's arguments).
    - `api_key`: sent as `Authorization: Bearer <key>` to a server run with `--api-key`
      (default: `$KVLAB_API_KEY`; never recorded in the settings).
    """
    prompt_format = prompt_format or ("text" if chat else "tokens")
    _check_args(requests, prompt_format, chat, timeout_s, deadline_s, max_connections)
    base = base_url(url)
    headers = auth_headers(api_key_from_env(api_key))
    if model is None:
        model = await asyncio.to_thread(discover_model, base, 10.0, api_key)
    endpoint = base + ("/v1/chat/completions" if chat else "/v1/completions")
    deadline_s = deadline_s if deadline_s is not None else max(r.arrival_s for r in requests) + timeout_s + 5.0
    payloads = [json.dumps(request_body(r, model, chat, prompt_format, temperature, extra_body, seed)).encode()
                for r in requests]
    records = [RequestRecord.from_request(r) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(requests), unit="req", desc="loadtest", leave=False,
               disable=not (progress if progress is not None else len(requests) >= 100))
    tasks: list[asyncio.Task] = []
    lanes = ConnectionLanes(max_connections, timeout_s, tls=base.startswith("https://"))

    async with lanes:
        t0 = time.perf_counter()
        started_at_unix = time.time()  # the same instant on the wall clock: where a room places this run

        def clock() -> float:
            return time.perf_counter() - t0

        async def one(i: int) -> None:
            record = records[i]
            try:
                async with lanes.lane() as client:
                    record.sent_s = clock()  # refined by the trace hook when the headers go out
                    await asyncio.wait_for(stream_request(client, endpoint, payloads[i], record, chat, clock, headers),
                                           timeout_s)
            except asyncio.TimeoutError:
                if record.status not in ENDED:
                    record.extra["error"] = f"no complete answer within timeout_s={timeout_s}"
                    record.fail(clock(), "timeout")
            finally:
                bar.update(1)

        async def dispatch() -> None:
            for i in order:
                delay = requests[i].arrival_s - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))

        dispatcher = asyncio.create_task(dispatch())
        await asyncio.wait([dispatcher], timeout=deadline_s)
        dispatcher.cancel()
        pending = [t for t in tasks if not t.done()]
        if pending:
            _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline_s - clock()))
        for t in pending:
            t.cancel()  # closes the stream, so the server sees the client leave
        await asyncio.gather(*tasks, return_exceptions=True)
        wall = clock()
        for record in records:
            if record.status not in ENDED:
                record.extra.setdefault("sent", False)
                record.extra.setdefault("error", f"the run's deadline_s={deadline_s} passed first")
                assert record.sent_s is not None  # RequestRecord.__post_init__ sets it
                record.fail(max(wall, record.sent_s), "deadline")
    bar.close()
    run_settings = {"url": base, "endpoint": endpoint, "model": model, "chat": chat, "prompt_format": prompt_format,
                    "num_requests": len(requests), "timeout_s": timeout_s, "deadline_s": deadline_s,
                    "max_connections": max_connections, "temperature": temperature,
                    "extra_body": extra_body or {}, "clock": "client, seconds since the run started",
                    **(settings or {}), "started_at_unix": started_at_unix}
    return LoadTestResult(records, run_settings, wall)


def run_loadtest(url: str, requests: Sequence[Request], model: str | None = None, **kwargs) -> LoadTestResult:
    """`loadtest(...)` from synchronous code, Jupyter included (runs in its own thread there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(loadtest(url, requests, model, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a notebook's loop is already running here
        return pool.submit(asyncio.run, loadtest(url, requests, model, **kwargs)).result()
