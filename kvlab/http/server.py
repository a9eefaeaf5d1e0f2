"""`python -m kvlab serve`: an OpenAI-compatible streaming server over the kvlab engine (FastAPI + uvicorn).

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (streaming
server-sent events ending with `data: [DONE]`, `stream_options.include_usage`,
or one JSON answer; `usage` either way), `GET /v1/models`, `GET /health`,
`GET /metrics` (Prometheus text), and `GET /kvlab/requests` (the engine-side
records of recent requests, for comparing clocks with the client's).

- One engine loop (`kvlab.http.engine_loop.AsyncEngine`) batches every
  connection's requests continuously; each request's tokens reach its
  handler through its own asyncio queue, one chunk per token. A chunk's text
  is that token decoded on its own (for the byte tokenizer: one byte, a lone
  non-ASCII byte shows as U+FFFD), and a non-streamed answer is the same
  texts joined, so both modes give the same text; a stop token ends the
  request with `finish_reason: "stop"` and no text, and is counted in `usage`.
- Backpressure: the engine's waiting queue holds `--max-waiting` requests;
  beyond it a request is answered 429 with `Retry-After`. Bad input is
  answered 400 (404 for an unknown model, as OpenAI does) before it reaches
  the engine; see `kvlab.http.protocol`.
- A client that disconnects mid-request has its request aborted in the
  engine, which frees its KV blocks.
- Shutdown (Ctrl-C / SIGTERM): uvicorn stops accepting and lets open
  requests finish for up to `--drain-timeout` seconds, then cancels the rest;
  the engine loop aborts whatever is left and every block is freed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import logging
import uuid
from pathlib import Path
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvlab.http.engine_loop import AsyncEngine, EngineRejected, RequestStream
from kvlab.http.protocol import APIError, CompletionRequest, ResponseShape, parse_request, sse
from kvlab.model.config import PRESETS, preset
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.serving import Engine, SamplingParams
from kvlab.serving.scheduler_cli import add_scheduler_arguments, scheduler_config_from_args
from kvlab.workload import Request as WorkloadRequest
from kvlab.command_args import command_args

log = logging.getLogger("kvlab.serve")
OUTCOMES = ("completed", "rejected_queue_full", "invalid_request", "model_not_found", "cancelled", "failed")


def load_model(model: str | None = None, seed: int = 0, device: str | None = None):
    """(decoder, served name): the shipped recall-tiny checkpoint by default, a preset, or a checkpoint path.

    Without `model`: the recall-tiny checkpoint shipped inside kvlab (kvlab/data/recall-tiny); if
    it is missing, FileNotFoundError says how to get it back (never a silent random stand-in). A
    preset name (a key of `kvlab.model.config.PRESETS`, "_" or "-": `tiny_llama`, `tiny-gpt2`, `llama-30m`)
    builds that config with seeded random weights; anything else is loaded with `kvlab.from_pretrained`.
    """
    from kvlab.model.decoder import build_model
    from kvlab.model.loading import from_pretrained
    from kvlab.tasks.recall import RECALL_MODEL_DIR, load_recall_model

    if model is None:
        decoder = load_recall_model(device=device)  # raises, naming the fix, if the checkpoint is missing
        log.info("serving the shipped checkpoint %s", RECALL_MODEL_DIR)
        return decoder, "recall-tiny"
    if model.replace("_", "-") in PRESETS:
        return build_model(preset(model), seed=seed, device=device), model.replace("_", "-")
    path = Path(model)
    if not path.is_dir():
        raise ValueError(f"--model {model!r} is neither a checkpoint directory nor a preset ({', '.join(PRESETS)})")
    return from_pretrained(path, device=device), path.name


class ServerState:
    """What the routes share: the engine loop, the served name, the tokenizer and the counters."""

    def __init__(self, engine: Engine, model_name: str, retry_after_s: int, keep_records: int) -> None:
        self.engine = AsyncEngine(engine, keep_records=keep_records)
        self.model_name = model_name
        self.tokenizer = (engine.model.tokenizer if engine.model is not None and engine.model.tokenizer is not None
                          else ByteTokenizer())
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.stop_token_ids = (eos,) if eos is not None else ()
        self.retry_after_s = retry_after_s
        self.outcomes = collections.Counter({k: 0 for k in OUTCOMES})


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _sampling(req: CompletionRequest, stop_token_ids: tuple) -> SamplingParams:
    return SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed,
                          stop_token_ids=() if req.ignore_eos else stop_token_ids)


async def _wait_for_disconnect(request: Request) -> None:
    """Return when the client goes away (the body has been read, so only http.disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: Engine, model_name: str = "kvlab", retry_after_s: int = 1,
               keep_records: int = 10_000) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; `app.state.kvlab` is its ServerState."""
    state = ServerState(engine, model_name, retry_after_s, keep_records)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        log.info("kvlab serve: %s, %d KV blocks of %d tokens, policy %s", model_name, engine.num_blocks,
                 engine.block_size, engine.scheduler_config.policy)
        yield
        cancelled = await state.engine.stop()
        log.info("kvlab serve stopped: %d request(s) cancelled at shutdown, outcomes %s, KV blocks used %d",
                 cancelled, dict(state.outcomes), engine.block_manager.stats().used)

    app = FastAPI(title="kvlab serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.kvlab = state

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code))

    @app.get("/health")
    async def health() -> Response:
        if not state.engine.alive:
            return JSONResponse({"status": "error", "error": repr(state.engine.error)}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "kvlab",
             "max_model_len": engine.max_model_len}]})

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    @app.get("/kvlab/requests")
    async def engine_records() -> Response:
        """Engine-side RequestRecords of recent requests (engine clock: seconds since the engine started)."""
        return JSONResponse([dataclasses.asdict(r) for r in list(state.engine.records)])

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(state, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(state, request, chat=True)

    return app


async def _complete(state: ServerState, request: Request, chat: bool) -> Response:
    engine = state.engine.engine
    received = engine.now()  # the engine-side clock of this request starts here
    raw = await request.body()
    try:
        req = parse_request(raw, chat, served_model=state.model_name, tokenizer=state.tokenizer,
                            vocab_size=engine.config.vocab_size, max_model_len=engine.max_model_len)
    except APIError as e:
        state.outcomes["model_not_found" if e.status == 404 else "invalid_request"] += 1
        return _error_response(e)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    work = WorkloadRequest(rid, len(req.prompt_ids), req.max_tokens, received, "chat" if chat else "completion",
                           req.prompt_ids)
    try:
        stream = await state.engine.submit(work, _sampling(req, state.stop_token_ids))
    except EngineRejected as e:
        if e.reason == "queue_full":
            state.outcomes["rejected_queue_full"] += 1
            return _error_response(APIError(
                429, f"the server's queue is full ({engine.scheduler_config.max_waiting} requests waiting); "
                     f"retry after {state.retry_after_s} s", "queue_full", type_="rate_limit_error",
                headers={"Retry-After": str(state.retry_after_s)}))
        if e.reason == "prompt_too_long":
            state.outcomes["invalid_request"] += 1
            return _error_response(APIError(400, "prompt + max_tokens exceed this model's context", "prompt_too_long"))
        state.outcomes["failed"] += 1
        return _error_response(APIError(503, f"the engine cannot take requests now ({e.reason})", "unavailable",
                                        type_="server_error"))
    shape = ResponseShape(rid, state.model_name, chat)
    if req.stream:
        return StreamingResponse(_events(state, stream, shape, req), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
    return await _collect(state, request, stream, shape)


def _text(state: ServerState, token_id: int | None, finish_reason: str | None) -> str:
    """A token's text on its own; the stop token that ended a request has none."""
    if token_id is None or (finish_reason == "stop" and token_id in state.stop_token_ids):
        return ""
    return state.tokenizer.decode([token_id])


async def _events(state: ServerState, stream: RequestStream, shape: ResponseShape, req: CompletionRequest):
    """The SSE body: (role chunk), one chunk per token, (usage chunk), [DONE]. Aborts if the client leaves."""
    ended = False
    try:
        if shape.chat:
            yield sse(shape.role_chunk())
        while True:
            out = await stream.queue.get()
            if out.finished and out.finish_reason not in ("length", "stop"):  # cancelled, engine error
                state.outcomes["failed"] += 1
                ended = True
                yield sse({"error": {"message": f"the request ended early: {out.finish_reason}",
                                     "type": "server_error", "param": None, "code": out.finish_reason}})
                yield sse("[DONE]")
                return
            stream.num_output_tokens = out.num_output_tokens
            reason = out.finish_reason if out.finished else None
            yield sse(shape.chunk(_text(state, out.token_id, reason), reason))
            if out.finished:
                break
        ended = True
        state.outcomes["completed"] += 1
        if req.include_usage:
            yield sse(shape.usage_chunk(stream.prompt_tokens, stream.num_output_tokens))
        yield sse("[DONE]")
    finally:
        if not ended:  # the client went away (or the server is cancelling): free the request's blocks
            state.engine.abort(stream.request_id)
            state.outcomes["cancelled"] += 1
        state.engine.release(stream.request_id)


async def _collect(state: ServerState, request: Request, stream: RequestStream, shape: ResponseShape) -> Response:
    """A non-streamed answer: wait for the last token, unless the client leaves first."""
    texts: list[str] = []

    async def collect() -> str:
        while True:
            out = await stream.queue.get()
            if out.finished and out.finish_reason not in ("length", "stop"):
                return out.finish_reason
            stream.num_output_tokens = out.num_output_tokens
            texts.append(_text(state, out.token_id, out.finish_reason if out.finished else None))
            if out.finished:
                return out.finish_reason

    collector = asyncio.create_task(collect())
    watcher = asyncio.create_task(_wait_for_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not collector.done():  # the client left (or we are being cancelled): abort the request
            collector.cancel()
            state.engine.abort(stream.request_id)
            state.outcomes["cancelled"] += 1
        state.engine.release(stream.request_id)
    reason = collector.result()
    if reason not in ("length", "stop"):
        state.outcomes["failed"] += 1
        return _error_response(APIError(503, f"the request ended early: {reason}", reason, type_="server_error"))
    state.outcomes["completed"] += 1
    return JSONResponse(shape.response("".join(texts), reason, stream.prompt_tokens, stream.num_output_tokens))


def prometheus_text(state: ServerState) -> str:
    """The server's gauges and counters in Prometheus' text exposition format."""
    g, c = state.engine.gauges, state.engine.counters
    metrics = [
        ("num_requests_waiting", "gauge", "Requests queued, not yet admitted to the running batch.",
         g["num_requests_waiting"]),
        ("num_requests_running", "gauge", "Requests in the running batch.", g["num_requests_running"]),
        ("kv_blocks_total", "gauge", "KV cache blocks in the pool.", g["kv_blocks_total"]),
        ("kv_blocks_used", "gauge", "KV cache blocks held by requests.", g["kv_blocks_used"]),
        ("kv_blocks_free", "gauge", "KV cache blocks free (cached prefixes included).", g["kv_blocks_free"]),
        ("kv_blocks_cached", "gauge", "Free blocks still holding a reusable prefix.", g["kv_blocks_cached"]),
        ("prompt_tokens_total", "counter", "Prompt tokens of requests accepted by the engine.", c["prompt_tokens"]),
        ("generation_tokens_total", "counter", "Output tokens generated.", c["generation_tokens"]),
        ("engine_steps_total", "counter", "Engine steps executed.", c["steps"]),
        ("preemptions_total", "counter", "Sequences preempted (recomputed later) for lack of blocks.",
         g["num_preemptions"]),
        ("prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose KV came from the prefix cache.",
         g["prefix_hit_tokens"]),
    ]
    lines = []
    for name, kind, help_, value in metrics:
        lines += [f"# HELP kvlab_{name} {help_}", f"# TYPE kvlab_{name} {kind}", f"kvlab_{name} {value}"]
    lines += ["# HELP kvlab_requests_total HTTP completion requests by outcome.", "# TYPE kvlab_requests_total counter"]
    lines += [f'kvlab_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(state.outcomes.items())]
    return "\n".join(lines) + "\n"


# -- command line ----------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab serve`."""
    p.add_argument("--model", default=None,
                   help=f"checkpoint directory, or a preset with random weights ({', '.join(PRESETS)}); "
                        "default: recall-tiny, the checkpoint shipped inside kvlab")
    p.add_argument("--served-model-name", default=None, help="the name clients ask for (default: from --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu or cuda (default: kvlab.pick_device)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    s = p.add_argument_group("scheduling (kvlab.serving.SchedulerConfig)")
    # SchedulerConfig's own defaults, but a bounded queue: overload is answered 429, not queued forever
    add_scheduler_arguments(s, max_waiting=64, help={"max_waiting": "beyond it 429 + Retry-After"})
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--kv-budget-mb", type=float, default=None, help="KV pool size (default: max-seqs full requests)")
    s.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--drain-timeout", type=int, default=10, help="seconds open requests get to finish at shutdown")
    p.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds sent with 429")
    p.add_argument("--log-level", default="info")


def build_engine(args: argparse.Namespace) -> tuple[Engine, str]:
    """The Engine and served model name the options describe (checked before anything starts)."""
    from kvlab.threads import set_torch_threads  # imports torch: only once a server is really built

    set_torch_threads(args.threads or None)
    model, name = load_model(args.model, args.seed, args.device)
    scheduler = scheduler_config_from_args(args)
    budget = int(args.kv_budget_mb * 2**20) if args.kv_budget_mb else None
    engine = Engine(model, block_size=args.block_size, kv_budget_bytes=budget, scheduler=scheduler,
                    enable_prefix_caching=not args.no_prefix_caching, seed=args.seed)
    return engine, args.served_model_name or name


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Serve until interrupted."""
    import uvicorn

    args = command_args(args, "python -m kvlab serve", __doc__, add_arguments)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    engine, name = build_engine(args)
    app = create_app(engine, name, retry_after_s=args.retry_after)
    log.info("serving %s on http://%s:%d (OpenAI API under /v1)", name, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                timeout_graceful_shutdown=args.drain_timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
