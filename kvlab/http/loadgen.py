"""The HTTP load generator: the four clocks measured at the client of any OpenAI-compatible server.

It replays a `kvlab.workload` against `/v1/completions` (or `/v1/chat/completions`)
of kvlab's own server, vLLM, SGLang, TGI or llama.cpp's server, and stamps one
`kvlab.clocks.RequestRecord` per request, so the same `summarize` /
`requests_frame` / plots serve in-process and over-the-wire runs.

How it measures (as vLLM's `bench serve`, see shared/reference/metrics.md):

- **Open loop.** A request is dispatched at its scheduled arrival whether or
  not earlier ones have finished. Every clock starts at the *scheduled*
  arrival (`scheduled_s`); `sent_s` is when its request headers actually went
  on the wire (httpcore's trace hook), so a client or connection pool that
  falls behind shows up as `send_delay_s` instead of hiding the wait
  (coordinated omission). Times are seconds since the run started.
- **Tokens are chunk arrivals.** Each server-sent event whose choice carries
  non-empty text (`text`, or `delta.content` for chat) is stamped when its
  line is read. Role-only and finish-only chunks are not tokens.
- **Output tokens** come from the server's `usage.completion_tokens`
  (`stream_options.include_usage`) when it sends one, else from the number of
  chunks; `extra["output_tokens_from"]` says which, per request.
- **Failures** are records too: `fail_reason` is `http_<status>[:<code>]`
  (e.g. `http_429:queue_full`, with the server's message in `extra["error"]`
  and `Retry-After` in `extra["retry_after_s"]`), `connect_error`, `timeout`,
  `transport_error`, `stream_error`, `bad_chunk`, `incomplete_stream`, or
  `deadline` (the run's overall deadline passed first; `extra["sent"]` is
  False if it was never dispatched). Nothing is retried: a retry would be a
  new request the workload did not ask for.

Prompts: the workload's token ids are sent as a `prompt` list of ints by
default (`prompt_format="tokens"`; OpenAI's completions API accepts token
arrays, and so do vLLM and SGLang), so the server sees exactly
`prompt_tokens` tokens. `http_workload` draws those ids from printable ASCII
(32..126), which every vocabulary holds and which `ByteTokenizer` decodes
one byte per token. Chat can only send text: the same ids decoded as ASCII,
which is `prompt_tokens` tokens on kvlab's byte-level models and some other
count on a BPE model (the server's count is kept as
`extra["prompt_tokens_reported"]`). Use `prompt_format="text"` for servers
that refuse token arrays.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx
import numpy as np
import pandas as pd

from kvlab.clocks import SLO, RequestRecord, Summary, requests_frame, save_results, summarize
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.workload import ARRIVALS, PROFILE_NAMES, Request, make_workload, replay_trace

PROMPT_FORMATS = ("tokens", "text")
PRINTABLE_FIRST, PRINTABLE_COUNT = 32, 95  # ' ' .. '~'
ENDED = ("completed", "failed")


# -- what to send ------------------------------------------------------------------
def http_workload(
    profile: str = "short_short",
    num_requests: int = 100,
    arrival: str = "poisson",
    rate: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
    trace: str | Path | None = None,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    scale: float = 1.0,
    max_context: int | None = None,
    shared_prefix_tokens: int = 0,
) -> list[Request]:
    """A seeded workload whose prompts are printable-ASCII token ids (32..126).

    With `trace` the requests replay that Azure-format CSV (`time_scale`,
    `length_scale`, the first `num_requests` rows); otherwise they come from
    `make_workload(profile, num_requests, arrival, rate, burstiness, seed,
    scale=..., max_context=..., shared_prefix_tokens=...)`.
    """
    if trace is not None:
        requests = replay_trace(trace, time_scale=time_scale, length_scale=length_scale,
                                max_requests=num_requests, vocab_size=PRINTABLE_COUNT,
                                max_context=max_context, seed=seed)
    else:
        requests = make_workload(profile, num_requests, arrival=arrival, rate=rate, burstiness=burstiness,
                                 seed=seed, vocab_size=PRINTABLE_COUNT, max_context=max_context, scale=scale,
                                 shared_prefix_tokens=shared_prefix_tokens)
    for r in requests:
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


def discover_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model id the server lists at `GET /v1/models`."""
    try:
        resp = httpx.get(base_url(url) + "/v1/models", timeout=timeout_s, trust_env=False)
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
    """Per-request records (times in seconds since the run began), settings and wall time."""

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
    def output_tokens_from(self) -> str:
        """How completed requests' output tokens were counted: "usage", "chunks", "mixed" or "none"."""
        methods = {r.extra.get("output_tokens_from") for r in self.records if r.status == "completed"}
        return methods.pop() if len(methods) == 1 else ("mixed" if methods else "none")

    def save(self, path: str | Path, slo: SLO | None = None) -> Path:
        """Write the summary (`.json`) or the per-request frame (`.csv`) with settings and machine."""
        settings = {**self.settings, "wall_s": self.wall_s, "output_tokens_from": self.output_tokens_from}
        data = self.summary(slo) if Path(path).suffix == ".json" else self.frame()
        return save_results(path, data, settings)


# -- one request -----------------------------------------------------------------------
def _error_reason(status: int, raw: bytes) -> tuple[str, str]:
    """(`http_<status>[:<code>]`, message) from an OpenAI-style error body, or the raw text."""
    message, code = raw[:500].decode("utf-8", errors="replace"), None
    try:
        err = json.loads(raw)
        err = err.get("error", err) if isinstance(err, dict) else {}
        if isinstance(err, dict):
            message = str(err.get("message", message))
            code = err.get("code") or err.get("type")
        elif isinstance(err, str):
            message = err
    except ValueError:
        pass
    return (f"http_{status}:{code}" if isinstance(code, str) and code else f"http_{status}"), message


def _chunk_text(choice: dict, chat: bool) -> str | None:
    if chat:
        delta = choice.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content")
    return choice.get("text")


async def _stream_one(client: httpx.AsyncClient, endpoint: str, payload: bytes, record: RequestRecord,
                      chat: bool, clock) -> None:
    """Send one streamed request and stamp its chunks into `record` (never raises for HTTP trouble)."""

    async def trace(name: str, info: dict) -> None:
        if name.endswith("send_request_headers.started") and "sent" not in record.extra:
            record.sent_s = clock()
            record.extra["sent"] = True

    usage, finish_reason, done, chunks = None, None, False, 0
    try:
        async with client.stream("POST", endpoint, content=payload,
                                 headers={"content-type": "application/json"},
                                 extensions={"trace": trace}) as resp:
            if resp.status_code != 200:
                reason, message = _error_reason(resp.status_code, await resp.aread())
                record.extra["error"] = message
                if "retry-after" in resp.headers:
                    record.extra["retry_after_s"] = resp.headers["retry-after"]
                record.fail(clock(), reason)
                return
            async for line in resp.aiter_lines():
                t = clock()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, `event:` lines
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True  # keep reading to the end of the body, so the connection is kept alive
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError:
                    record.extra["error"] = data[:200]
                    record.fail(t, "bad_chunk")
                    return
                if "error" in chunk:
                    record.extra["error"] = str(chunk["error"])[:500]
                    record.fail(t, "stream_error")
                    return
                if chunks == 0 and "id" in chunk:
                    record.extra["response_id"] = chunk["id"]  # joins this record to the server's own
                usage = chunk.get("usage") or usage
                choices = chunk.get("choices") or ()
                if any(_chunk_text(c, chat) for c in choices):
                    record.token(t)
                    chunks += 1
                for c in choices:
                    finish_reason = c.get("finish_reason") or finish_reason
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        record.extra["error"] = f"{type(e).__name__}: {e}"
        record.fail(clock(), "connect_error")
        return
    except httpx.TimeoutException as e:
        record.extra["error"] = f"{type(e).__name__}: {e}"
        record.fail(clock(), "timeout")
        return
    except httpx.TransportError as e:
        record.extra["error"] = f"{type(e).__name__}: {e}"
        record.fail(clock(), "transport_error")
        return
    end = clock()
    record.extra.update(finish_reason=finish_reason, chunks=chunks)
    if usage:
        record.extra["prompt_tokens_reported"] = usage.get("prompt_tokens")
    if not (done or finish_reason):
        record.fail(end, "incomplete_stream")
        return
    reported = usage.get("completion_tokens") if usage else None
    record.extra["output_tokens_from"] = "usage" if reported is not None else "chunks"
    # E2E ends at the last token, as in vLLM; a request with no token ends at [DONE].
    record.finish(record.token_s[-1] if record.token_s else end, output_tokens=reported)


# -- the connections ------------------------------------------------------------------------
class ConnectionLanes:
    """Up to `size` keep-alive HTTP/1.1 connections, each held by its own one-connection httpx client.

    One shared `httpx.AsyncClient` pool rescans every connection (and polls
    each socket) whenever a request starts or ends, O(connections^2) per
    request: at 64 connections it cost the client three times the CPU per
    request of 1 connection, so the client became the bottleneck it should
    measure. One-connection clients handed out from a LIFO queue cost O(1)
    per request and reuse the warmest connection first. A request waiting for
    a free lane is a client falling behind: it shows as `send_delay_s`.
    """

    def __init__(self, size: int, timeout_s: float, tls: bool = False) -> None:
        self.size, self.timeout, self.tls = size, httpx.Timeout(timeout_s), tls
        self.clients: list[httpx.AsyncClient] = []
        self._idle: asyncio.LifoQueue | None = None
        self._ssl = None

    def _new_client(self) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(verify=self._ssl, limits=httpx.Limits(max_connections=1,
                                                                                    max_keepalive_connections=1))
        client = httpx.AsyncClient(transport=transport, timeout=self.timeout, trust_env=False)
        self.clients.append(client)
        return client

    @contextlib.asynccontextmanager
    async def lane(self):
        """A client with one connection, for one request at a time."""
        client = await self._idle.get()
        if client is None:
            client = self._new_client()
        try:
            yield client
        finally:
            self._idle.put_nowait(client)

    async def __aenter__(self) -> "ConnectionLanes":
        import ssl

        # One TLS context for all lanes, built before the run's clock starts: loading the CA
        # store takes ~0.1 s (far more on a busy machine), which the first request would pay.
        # Plain http never uses it, so it gets an empty one.
        self._ssl = ssl.create_default_context() if self.tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._idle = asyncio.LifoQueue()
        for _ in range(self.size - 1):
            self._idle.put_nowait(None)  # a lane not opened yet
        self._idle.put_nowait(self._new_client())  # the first lane, ready before the clock starts
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)


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


async def loadtest(
    url: str,
    requests: Sequence[Request],
    model: str | None = None,
    *,
    chat: bool = False,
    prompt_format: str | None = None,
    timeout_s: float = 60.0,
    deadline_s: float | None = None,
    max_connections: int = 256,
    temperature: float = 0.0,
    extra_body: dict | None = None,
    progress: bool | None = None,
    settings: dict | None = None,
    seed: int = 0,
) -> LoadTestResult:
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
    """
    prompt_format = prompt_format or ("text" if chat else "tokens")
    _check_args(requests, prompt_format, chat, timeout_s, deadline_s, max_connections)
    base = base_url(url)
    if model is None:
        model = await asyncio.to_thread(discover_model, base)
    endpoint = base + ("/v1/chat/completions" if chat else "/v1/completions")
    last_arrival = max(r.arrival_s for r in requests)
    deadline_s = deadline_s if deadline_s is not None else last_arrival + timeout_s + 5.0
    payloads = [json.dumps(request_body(r, model, chat, prompt_format, temperature, extra_body, seed)).encode()
                for r in requests]
    records = [RequestRecord.from_request(r) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    show = progress if progress is not None else len(requests) >= 100
    from tqdm.auto import tqdm

    bar = tqdm(total=len(requests), unit="req", desc="loadtest", disable=not show, leave=False)
    tasks: list[asyncio.Task] = []
    lanes = ConnectionLanes(max_connections, timeout_s, tls=base.startswith("https://"))

    async with lanes:
        t0 = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - t0

        async def one(i: int) -> None:
            record = records[i]
            try:
                async with lanes.lane() as client:
                    record.sent_s = clock()  # refined by the trace hook when the headers go out
                    await asyncio.wait_for(_stream_one(client, endpoint, payloads[i], record, chat, clock),
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
                record.fail(max(wall, record.sent_s), "deadline")
    bar.close()
    run_settings = {"url": base, "endpoint": endpoint, "model": model, "chat": chat, "prompt_format": prompt_format,
                    "num_requests": len(requests), "timeout_s": timeout_s, "deadline_s": deadline_s,
                    "max_connections": max_connections, "temperature": temperature,
                    "extra_body": extra_body or {}, "clock": "client, seconds since the run started",
                    **(settings or {})}
    return LoadTestResult(records, run_settings, wall)


def run_loadtest(url: str, requests: Sequence[Request], model: str | None = None, **kwargs) -> LoadTestResult:
    """`loadtest(...)` from synchronous code, Jupyter included (runs in its own thread there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(loadtest(url, requests, model, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a notebook's loop is already running here
        return pool.submit(asyncio.run, loadtest(url, requests, model, **kwargs)).result()


# -- command line ----------------------------------------------------------------------------
def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload and arrival options shared by `loadtest` and other commands."""
    g = parser.add_argument_group("workload")
    g.add_argument("--profile", default="short_short", choices=PROFILE_NAMES)
    g.add_argument("--num-requests", type=int, default=100)
    g.add_argument("--arrival", default="poisson", choices=ARRIVALS)
    g.add_argument("--rate", type=float, default=None, help="requests/s (needed unless --arrival all_at_once)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma arrivals: 1 Poisson, <1 burstier")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--scale", type=float, default=1.0, help="multiply the profile's lengths")
    g.add_argument("--max-context", type=int, default=None, help="clip prompt + max_tokens to this")
    g.add_argument("--shared-prefix-tokens", type=int, default=0, help="a common system prompt of this length")
    g.add_argument("--trace", default=None, help="replay an Azure-format trace CSV instead of --profile")
    g.add_argument("--time-scale", type=float, default=1.0, help="trace: multiply arrival gaps")
    g.add_argument("--length-scale", type=float, default=1.0, help="trace: divide prompt and output lengths")


def workload_from_args(args: argparse.Namespace) -> tuple[list[Request], dict]:
    """(requests, settings) from `add_workload_arguments` options."""
    kw = dict(profile=args.profile, num_requests=args.num_requests, arrival=args.arrival, rate=args.rate,
              burstiness=args.burstiness, seed=args.seed, trace=args.trace, time_scale=args.time_scale,
              length_scale=args.length_scale, scale=args.scale, max_context=args.max_context,
              shared_prefix_tokens=args.shared_prefix_tokens)
    return http_workload(**kw), {"workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in kw.items()}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab loadtest`."""
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to request (default: first of GET /v1/models)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions (text prompts)")
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=None,
                   help="completions: token id list (default) or text")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument("--deadline", type=float, default=None, help="whole-run deadline, seconds")
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos=true (vLLM and kvlab honour it)")
    p.add_argument("--slo-ttft", type=float, default=None, help="TTFT target (s) for goodput")
    p.add_argument("--slo-tpot", type=float, default=None, help="TPOT target (s) for goodput")
    p.add_argument("--json", default=None, help="write the summary here (.json)")
    p.add_argument("--csv", default=None, help="write one row per request here (.csv)")
    p.add_argument("--no-progress", action="store_true")
    add_workload_arguments(p)


def format_summary(result: LoadTestResult, summary: Summary) -> str:
    """A few lines a person reads after a run."""
    s = summary
    lines = [f"{s.sent} sent, {s.completed} completed, {s.failed} failed "
             f"{dict(sorted(s.failed_by_reason.items())) or ''} in {result.wall_s:.2f} s",
             f"output tokens counted from: {result.output_tokens_from}; "
             f"{s.output_tokens_per_s:.1f} output tok/s, {s.requests_per_s:.2f} req/s",
             s.latency_frame().to_string(float_format=lambda x: f"{x:.4f}")]
    delay = [r.clocks()["send_delay_s"] for r in result.records if r.extra.get("sent")]
    if delay:
        lines.append(f"send delay (client behind schedule): p50 {np.median(delay) * 1e3:.2f} ms, "
                     f"max {max(delay) * 1e3:.2f} ms")
    if s.slo is not None:
        lines.append(f"goodput {s.goodput_rps:.2f} req/s ({s.slo_share:.0%} of ended requests met {s.slo.targets()})")
    return "\n".join(lines)


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """`python -m kvlab loadtest ...` (parsed options, or a list of words to parse)."""
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="python -m kvlab loadtest", description=__doc__.splitlines()[0])
        add_arguments(parser)
        args = parser.parse_args(args)
    requests, settings = workload_from_args(args)
    slo_targets = {k: v for k, v in (("ttft_s", args.slo_ttft), ("tpot_s", args.slo_tpot)) if v is not None}
    slo = SLO(**slo_targets) if slo_targets else None
    result = run_loadtest(args.url, requests, args.model, chat=args.chat, prompt_format=args.prompt_format,
                          timeout_s=args.timeout, deadline_s=args.deadline, max_connections=args.max_connections,
                          temperature=args.temperature, extra_body={"ignore_eos": True} if args.ignore_eos else None,
                          progress=False if args.no_progress else None, settings=settings)
    summary = result.summary(slo)
    print(format_summary(result, summary))
    for path in (args.json, args.csv):
        if path:
            print(f"wrote {result.save(path, slo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
