"""A scripted OpenAI-compatible streaming server whose chunk timings the caller sets: the load client's reference.

An instrument, not scaffolding: `python -m kvlab bench loadgen` measures the load client against it, and lesson
09's claims check the client's clocks on it, so it ships with the package.

It runs no model: every request is answered with `max_tokens` tokens of filler text, the first chunk `ttft_s` after the
request arrived, then one chunk every `gap_s`, each on an absolute schedule from the arrival (sleeps do not accumulate
drift). Its purpose is to check a load generator's clocks against known values, and, with `ttft_s = gap_s = 0`, to
measure how many streamed requests per second the generator itself can drive. The streams look like vLLM's: chat opens
with a role-only chunk (sent at once, before the first token), `stream_options.include_usage` adds a usage chunk, and
`data: [DONE]` closes the stream.

    python -m kvlab.http.scripted --port 8100 --ttft 0.05 --gap 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass
class Script:
    """What the scripted server does for each request.

    - `ttft_s`, `gap_s`: first chunk after `ttft_s`; then one chunk every `gap_s`.
    - `tokens_per_chunk`: tokens carried by one chunk (usage still counts tokens).
    - `send_usage`: honour `stream_options.include_usage` (False: a server that never reports usage).
    - `reject_every`: every k-th request (k, 2k, ...) gets 429 + Retry-After; 0 = never.
    """

    ttft_s: float = 0.0
    gap_s: float = 0.0
    tokens_per_chunk: int = 1
    send_usage: bool = True
    reject_every: int = 0
    model: str = "scripted"

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.gap_s < 0:
            raise ValueError(f"ttft_s ({self.ttft_s}) and gap_s ({self.gap_s}) must be >= 0 seconds")
        if self.tokens_per_chunk < 1 or self.reject_every < 0:
            raise ValueError(f"tokens_per_chunk ({self.tokens_per_chunk}) must be >= 1 and "
                             f"reject_every ({self.reject_every}) >= 0")


def _error(status: int, message: str, code: str, type_: str = "invalid_request_error",
           headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": code}},
                        status_code=status, headers=headers)


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def scripted_app(script: Script | None = None, **script_fields) -> Starlette:
    """A Starlette app serving /v1/completions, /v1/chat/completions, /v1/models and /health.

    `app.state.counts` counts requests received, rejected, completed and disconnected (the client left mid-stream);
    `app.state.client_ports` holds the client port of every connection that sent a request (one per connection, so
    kept-alive connections show as few ports).
    """
    script = script or Script(**script_fields)
    counts = {"received": 0, "rejected": 0, "completed": 0, "disconnected": 0}
    client_ports: set[int] = set()

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": script.model, "object": "model",
                                                         "owned_by": "kvlab-scripted"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def complete(request: Request, chat: bool) -> Response:
        arrived = time.perf_counter()
        counts["received"] += 1
        n = counts["received"]
        if request.client is not None:
            client_ports.add(request.client.port)
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return _error(400, f"request body is not valid JSON ({e})", "invalid_json")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "invalid_json")
        field = "messages" if chat else "prompt"
        if field not in body or "model" not in body:
            return _error(400, f"missing required field(s): {', '.join(k for k in ('model', field) if k not in body)}",
                          "missing_field")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, f"max_tokens must be an integer >= 1, got {max_tokens!r}", "invalid_max_tokens")
        if script.reject_every and n % script.reject_every == 0:
            counts["rejected"] += 1
            return _error(429, "scripted rejection: queue full", "queue_full", "rate_limit_error",
                          headers={"Retry-After": "1"})
        prompt = body["messages"] if chat else body["prompt"]
        prompt_tokens = (sum(len(str(m.get("content", "")).encode()) for m in prompt) if chat
                         else len(prompt) if isinstance(prompt, list) else len(str(prompt).encode()))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": prompt_tokens + max_tokens}
        num_chunks = math.ceil(max_tokens / script.tokens_per_chunk)
        texts = [LETTERS[k % 26] * min(script.tokens_per_chunk, max_tokens - k * script.tokens_per_chunk)
                 for k in range(num_chunks)]
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{n}", int(time.time())
        kind, finish = "chat.completion" if chat else "text_completion", "length"

        if not body.get("stream"):
            await asyncio.sleep(max(0.0, arrived + script.ttft_s + (num_chunks - 1) * script.gap_s
                                    - time.perf_counter()))
            text = "".join(texts)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                      if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
            counts["completed"] += 1
            return JSONResponse({"id": rid, "object": kind, "created": created, "model": script.model,
                                 "choices": [choice], "usage": usage})

        head = {"id": rid, "object": kind + ".chunk" if chat else kind, "created": created, "model": script.model}

        def chunk(k: int) -> bytes:
            last = finish if k == num_chunks - 1 else None
            choice = ({"index": 0, "delta": {"content": texts[k]}, "finish_reason": last}
                      if chat else {"index": 0, "text": texts[k], "logprobs": None, "finish_reason": last})
            return _sse({**head, "choices": [choice]})

        role = _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]}) if chat else b""
        include_usage = script.send_usage and bool((body.get("stream_options") or {}).get("include_usage"))
        tail = (_sse({**head, "choices": [], "usage": usage}) if include_usage else b"") + b"data: [DONE]\n\n"

        async def events():
            try:
                if script.ttft_s == 0 and script.gap_s == 0:  # instant: one write, the cheapest server
                    yield role + b"".join(chunk(k) for k in range(num_chunks)) + tail
                else:
                    if role:
                        yield role
                    for k in range(num_chunks):
                        await asyncio.sleep(max(0.0, arrived + script.ttft_s + k * script.gap_s
                                                - time.perf_counter()))
                        yield chunk(k)
                    yield tail
                counts["completed"] += 1
            except asyncio.CancelledError:
                counts["disconnected"] += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                            Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/chat/completions", chat_completions, methods=["POST"])])
    app.state.counts, app.state.client_ports, app.state.script = counts, client_ports, script
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a scripted app with uvicorn (for benchmarks: the load generator in another process)."""
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m kvlab.http.scripted", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--ttft", type=float, default=0.0)
    p.add_argument("--gap", type=float, default=0.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--reject-every", type=int, default=0)
    args = p.parse_args(argv)
    script = Script(ttft_s=args.ttft, gap_s=args.gap, tokens_per_chunk=args.tokens_per_chunk,
                    reject_every=args.reject_every)
    print(f"scripted server {asdict(script)} on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(scripted_app(script), host=args.host, port=args.port, log_level="warning", access_log=False,
                backlog=4096)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
