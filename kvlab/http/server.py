"""`python -m kvlab serve`: an OpenAI-compatible streaming server over the kvlab engine (FastAPI + uvicorn).

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (streaming server-sent events ending with
`data: [DONE]`, `stream_options.include_usage`, or one JSON answer; `usage` either way), `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text), and `GET /kvlab/requests` (the engine-side records of recent requests,
for comparing clocks with the client's).

- One engine loop (`kvlab.http.engine_loop.AsyncEngine`) batches every connection's requests continuously; each
  request's tokens reach its handler through its own asyncio queue, one chunk per token. The loop runs in a process of
  its own (`kvlab.http.engine_process`), so the front end's Python never holds up a step; `--engine-in-thread` runs it
  in a thread of the server's process instead. A chunk's text is that token decoded on its own (for the byte tokenizer:
  one byte, a lone non-ASCII byte shows as U+FFFD), and a non-streamed answer is the same texts joined, so both modes
  give the same text; a stop token ends the request with `finish_reason: "stop"` and no text, and is counted in
  `usage`.
- Backpressure: the engine's waiting queue holds `--max-waiting` requests; beyond it a request is answered 429 with
  `Retry-After`. Bad input is answered with a 4xx JSON error (404 for an unknown model, as OpenAI does) before it
  reaches the engine; see `kvlab.http.protocol` and, for the API key, content type, body size and read time-outs,
  `kvlab.http.guard`.
- A client that disconnects mid-request has its request aborted in the engine, which frees its KV blocks.
- Faults stay in their requests (`kvlab.http.engine_loop`): a failing step (one that raises, or one whose logits are
  NaN or inf for every sequence in it) ends its own requests with `engine_error` and the engine goes on; a request
  whose tokens cannot be turned into text fails alone (an error event then `[DONE]`, or a JSON 500), its generation
  stopped and its blocks freed; after `--max-failed-steps` in a row it stops for good, every open request is answered,
  `/health` says 503 "stopped", and the process exits with status 1 so that a supervisor restarts it.
- Counts (`kvlab.http.counts`): in `/metrics`, at every instant, sent = completed + failed + cancelled + rejected +
  waiting + running.
- Shutdown (Ctrl-C / SIGTERM): uvicorn stops accepting and lets open requests finish for up to `--drain-timeout`
  seconds, then cancels the rest; the engine loop aborts whatever is left and every block is freed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from kvlab.http.counts import RequestCounts, Tally
from kvlab.http.engine_loop import MAX_FAILED_STEPS, STEP_TIMEOUT_S, STOPPED, AsyncEngine, EngineRejected, RequestStream
from kvlab.http.guard import (API_KEY_ENV, MAX_BODY_BYTES, READ_TIMEOUT_S, ClientGone, answer_errors_as_json,
                              check_api_key, check_content_type, error_response,
                              header_timeout_protocol, is_loopback, read_body)
from kvlab.http.protocol import APIError, CompletionRequest, ResponseShape, parse_request, sse
from kvlab.http.settings import ServerSettings
from kvlab.model.config import PRESETS, preset
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.serving import ENGINE_ERROR, Engine, RequestOutput, SamplingParams
from kvlab.serving.sequence import COMPLETED
from kvlab.serving.config import SERVE_SPEC, EngineSpec, add_engine_arguments
from kvlab.workload import Request as WorkloadRequest
from kvlab.allocator import ALLOCATORS, DEFAULT_ALLOCATOR, set_allocator
from kvlab.command_args import command_args

log = logging.getLogger("kvlab.serve")


def load_model(model: str | None = None, seed: int = 0, device: str | None = None):
    """(decoder, served name): the shipped recall-tiny checkpoint by default, a preset, or a checkpoint path.

    Without `model`: the recall-tiny checkpoint shipped inside kvlab (kvlab/data/recall-tiny); if
    it is missing, FileNotFoundError says how to get it back (never a silent random stand-in). A
    preset name (a key of `kvlab.model.config.PRESETS`, "_" or "-": `tiny_llama`, `tiny-gpt2`, `llama-30m`)
    builds that config with seeded random weights; anything else is loaded with `kvlab.from_pretrained`.
    """
    from kvlab.model.decoder import build_model
    from kvlab.model.loading import from_pretrained
    from kvlab.model.lessons import RECALL_MODEL_DIR, load_recall_model

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
    """What the routes share: the engine loop, the served name, the tokenizer, the guards and the counts."""

    def __init__(self, engine: Engine, model_name: str, settings: ServerSettings,
                 engine_factory: Callable[[], Engine] | None = None) -> None:
        self.settings = settings
        options: dict[str, Any] = dict(keep_records=settings.keep_records, max_failed_steps=settings.max_failed_steps,
                                       step_timeout_s=settings.step_timeout_s, on_stop=self._engine_stopped)
        self.engine = (AsyncEngine(engine, **options) if engine_factory is None
                       else AsyncEngine.in_process(engine_factory, engine, **options))
        self.model_name = model_name
        self.tokenizer = (engine.model.tokenizer if engine.model is not None and engine.model.tokenizer is not None
                          else ByteTokenizer())
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.stop_token_ids = (eos,) if eos is not None else ()
        self.retry_after_s = settings.retry_after_s
        self.api_key, self.max_body_bytes, self.read_timeout_s = (settings.api_key, settings.max_body_bytes,
                                                                  settings.read_timeout_s)
        self.counts = RequestCounts()
        self.outcomes = self.counts.outcomes  # by outcome name: kvlab_requests_total{outcome=...}
        self.shutdown: Callable[[], None] | None = None  # asks the HTTP server to exit (set by run_server)

    def _engine_stopped(self) -> None:
        log.error("the engine stopped for good (%s); every open request has been answered%s", self.engine.error,
                  ", the server exits" if self.shutdown else "")
        if self.shutdown is not None:
            self.shutdown()


async def _wait_for_disconnect(request: Request) -> None:
    """Return when the client goes away (the body has been read, so only http.disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: Engine, model_name: str = "kvlab", settings: ServerSettings | None = None,
               engine_factory: Callable[[], Engine] | None = None, **changes) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; `app.state.kvlab` is its ServerState.

    The engine loop runs in a thread of this process, or, with `engine_factory` (picklable, building the same
    engine as `engine`), in a process of its own that builds its engine with it (`kvlab.http.engine_process`).

    `settings` (default `ServerSettings()`), with any of its fields changed by name (`api_key=...`,
    `max_failed_steps=...`): with `api_key` set, every `/v1` route, `/metrics` and `/kvlab/requests` need
    `Authorization: Bearer <api_key>` (`kvlab.http.guard`); `/health` stays open. `max_failed_steps` failing engine
    steps in a row stop the engine for good; a step running past `step_timeout_s` does too.
    """
    settings = (settings or ServerSettings()).replace(**changes)
    state = ServerState(engine, model_name, settings, engine_factory)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        await state.engine.ready()
        log.info("kvlab serve: %s, %d KV blocks of %d tokens, policy %s, the engine %s", model_name, engine.num_blocks,
                 engine.block_size, engine.scheduler_config.policy,
                 "in its own process" if state.engine.in_own_process else "in a thread of the server")
        yield
        cancelled = await state.engine.stop()
        log.info("kvlab serve stopped: %d request(s) cancelled at shutdown, requests %s, KV blocks used %d",
                 cancelled, state.counts.totals(), state.engine.gauges["kv_blocks_used"])

    app = FastAPI(title="kvlab serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.kvlab = state

    answer_errors_as_json(app, settings.api_key)

    @app.get("/health")
    async def health() -> Response:
        """200 "ok", 200 "degraded" (a step failed lately, the engine goes on) or 503 "stopped" (for good)."""
        engine_loop = state.engine
        status = engine_loop.state
        if status == "stopped":
            return JSONResponse({"status": status, "error": repr(engine_loop.error)}, status_code=503,
                                headers={"Retry-After": str(state.retry_after_s)})
        if status == "degraded":
            return JSONResponse({"status": status, "failed_steps_in_a_row": engine_loop.failed_steps_in_a_row,
                                 "max_failed_steps": engine_loop.max_failed_steps,
                                 "last_error": engine_loop.last_error})
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        check_api_key(request, state.api_key)  # as OpenAI's and vLLM's: every /v1 route needs the key
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "kvlab",
             "max_model_len": engine.max_model_len}]})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        check_api_key(request, state.api_key)
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    @app.get("/kvlab/requests")
    async def engine_records(request: Request) -> Response:
        """Engine-side RequestRecords of recent requests (engine clock: seconds since the engine started)."""
        check_api_key(request, state.api_key)
        return JSONResponse([dataclasses.asdict(r) for r in list(state.engine.records)])

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(state, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(state, request, chat=True)

    return app


def exit_when_engine_stops(app: FastAPI, server) -> None:
    """Make the uvicorn `server` exit once `app`'s engine stops for good (its open requests answered first)."""
    app.state.kvlab.shutdown = lambda: setattr(server, "should_exit", True)


def _unavailable(state: ServerState, reason: str) -> APIError:
    return APIError(503, f"the engine cannot take requests now ({reason}); retry after {state.retry_after_s} s",
                    reason if reason == STOPPED else "unavailable", type_="server_error",
                    headers={"Retry-After": str(state.retry_after_s)})


async def _complete(state: ServerState, request: Request, chat: bool) -> Response:
    """One completion request, counted from its arrival to its one outcome whatever happens."""
    tally, response = state.counts.arrive(), None
    try:
        response = await _answer(state, request, chat, tally)
        return response
    except asyncio.CancelledError:
        tally.end("cancelled")
        raise
    except Exception as e:  # a bug: still a JSON answer, and counted
        log.exception("the completion handler failed")
        tally.end("failed")
        return error_response(APIError(500, f"the server failed on this request ({type(e).__name__}: {e})",
                                        "internal_error", type_="server_error"))
    finally:  # a stream's response owns its tally from here; anything else has ended it, or is cut short
        if not tally.ended and not isinstance(response, EngineStreamingResponse):
            tally.end("cancelled")


async def _answer(state: ServerState, request: Request, chat: bool, tally: Tally) -> Response:
    engine = state.engine.engine
    received = engine.now()  # the engine-side clock of this request starts here
    try:
        check_api_key(request, state.api_key)
        check_content_type(request)
        raw = await read_body(request, state.max_body_bytes, state.read_timeout_s)
        req = parse_request(raw, chat, served_model=state.model_name, tokenizer=state.tokenizer,
                            vocab_size=engine.config.vocab_size, max_model_len=engine.max_model_len)
    except ClientGone:
        tally.end("cancelled")
        return Response(status_code=400)  # nobody reads it
    except APIError as e:
        tally.end("unauthorized" if e.status == 401 else "model_not_found" if e.status == 404 else "invalid_request")
        return error_response(e)
    headers = {"X-Kvlab-Warning": "; ".join(req.warnings)} if req.warnings else {}
    for warning in req.warnings:
        log.warning("%s", warning)
    if not state.engine.alive:
        tally.end("rejected_unavailable")
        return error_response(_unavailable(state, STOPPED))
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    work = WorkloadRequest(rid, len(req.prompt_ids), req.max_tokens, received, "chat" if chat else "completion",
                           req.prompt_ids)
    try:
        stream = await state.engine.submit(work, SamplingParams(
            temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed,
            stop_token_ids=() if req.ignore_eos else state.stop_token_ids))
    except EngineRejected as e:
        if e.reason == "queue_full":
            tally.end("rejected_queue_full")
            return error_response(APIError(
                429, f"the server's queue is full ({engine.scheduler_config.max_waiting} requests waiting); "
                     f"retry after {state.retry_after_s} s", "queue_full", type_="rate_limit_error",
                headers={"Retry-After": str(state.retry_after_s)}))
        if e.reason == "prompt_too_long":
            tally.end("invalid_request")
            return error_response(APIError(400, "prompt + max_tokens exceed this model's context", "prompt_too_long"))
        tally.end("rejected_unavailable")
        return error_response(_unavailable(state, e.reason if e.reason == STOPPED else str(e)))
    shape = ResponseShape(rid, state.model_name, chat)
    if req.stream:
        return EngineStreamingResponse(_events(state, stream, shape, req, tally), _closer(state, stream, tally),
                                       media_type="text/event-stream",
                                       headers={"Cache-Control": "no-cache", "X-Request-Id": rid, **headers})
    return await _collect(state, request, stream, shape, tally, headers)


class EngineStreamingResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close`, even when the client left before the first byte.

    Starlette cancels a stream whose client disconnected; if that happens before the body generator started, the
    generator's own `finally` never runs. `on_close` frees the request in the engine and counts it, either way.
    """

    def __init__(self, content, on_close: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _closer(state: ServerState, stream: RequestStream, tally: Tally) -> Callable[[], None]:
    """What ends a request whatever way its handler stops: abort it if it is still open, count it, release it."""

    def close() -> None:
        if not tally.ended:  # the client went away (or the server is cancelling): free the request's blocks
            state.engine.abort(stream.request_id)
            tally.end("cancelled")
        state.engine.release(stream.request_id)

    return close


def _text(state: ServerState, token_id: int | None, finish_reason: str | None) -> str:
    """A token's text on its own; the stop token that ended a request has none."""
    if token_id is None or (finish_reason == "stop" and token_id in state.stop_token_ids):
        return ""
    return state.tokenizer.decode([token_id])


def _text_or_failure(state: ServerState, stream: RequestStream, out: RequestOutput) -> tuple[str, RequestOutput | None]:
    """(the token's text, None), or ("", the request's failed output) when turning it into text raised.

    A detokenizer fault belongs to this request alone: it is failed in the engine (which stops generating for it
    and frees its blocks) and answered as an engine error, while every other request goes on.
    """
    try:
        return _text(state, out.token_id, out.finish_reason if out.finished else None), None
    except Exception as e:
        why = f"turning token {out.token_id} into text failed ({type(e).__name__}: {e})"
        log.exception("request %s: %s", stream.request_id, why)
        state.engine.fail(stream.request_id, why)
        return "", RequestOutput(stream.request_id, None, out.num_output_tokens, True, ENGINE_ERROR, why)


def _early_end_message(out) -> str:
    return f"the request ended early: {out.finish_reason}" + (f" ({out.error})" if out.error else "")


async def _events(state: ServerState, stream: RequestStream, shape: ResponseShape, req: CompletionRequest,
                  tally: Tally):
    """The SSE body: (role chunk), one chunk per token, (usage chunk), [DONE]. Aborts if the client leaves."""
    try:
        if shape.chat:
            yield sse(shape.role_chunk())
        while True:
            out = await stream.queue.get()  # the watchdog answers it if the engine stops making progress
            text, failure = ("", out) if out.finished and out.finish_reason not in COMPLETED \
                else _text_or_failure(state, stream, out)  # cancelled, engine error; or its text failed
            if failure is not None:
                tally.end("cancelled" if failure.finish_reason == "cancelled" else "failed")
                yield sse({"error": {"message": _early_end_message(failure), "type": "server_error", "param": None,
                                     "code": failure.finish_reason}})  # OpenAI's error shape; [DONE] follows it
                yield sse("[DONE]")
                return
            tally.running()
            stream.num_output_tokens = out.num_output_tokens
            reason = out.finish_reason if out.finished else None
            if out.finished:
                tally.end("completed")
            yield sse(shape.chunk(text, reason))
            if out.finished:
                break
        if req.include_usage:
            yield sse(shape.usage_chunk(stream.prompt_tokens, stream.num_output_tokens))
        yield sse("[DONE]")
    finally:
        _closer(state, stream, tally)()


async def _collect(state: ServerState, request: Request, stream: RequestStream, shape: ResponseShape, tally: Tally,
                   headers: dict) -> Response:
    """A non-streamed answer: wait for the last token, unless the client leaves first."""
    texts: list[str] = []

    async def collect():
        while True:
            out = await stream.queue.get()
            if out.finished and out.finish_reason not in COMPLETED:
                return out
            text, failure = _text_or_failure(state, stream, out)
            if failure is not None:
                return failure
            tally.running()
            stream.num_output_tokens = out.num_output_tokens
            texts.append(text)
            if out.finished:
                return out

    collector = asyncio.create_task(collect())
    watcher = asyncio.create_task(_wait_for_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not collector.done():  # the client left (or we are being cancelled): abort the request
            collector.cancel()
        else:
            out = collector.result()
            tally.end("completed" if out.finish_reason in COMPLETED else
                      "cancelled" if out.finish_reason == "cancelled" else "failed")
        _closer(state, stream, tally)()
    if tally.outcome == "cancelled" and not collector.done():
        return Response(status_code=499)  # nobody reads it
    out = collector.result()
    if out.finish_reason not in COMPLETED:
        status = 500 if out.finish_reason == ENGINE_ERROR else 503
        return error_response(APIError(status, _early_end_message(out), out.finish_reason, type_="server_error",
                                        headers={"Retry-After": str(state.retry_after_s)} if status == 503 else None))
    return JSONResponse(shape.response("".join(texts), out.finish_reason, stream.prompt_tokens,
                                       stream.num_output_tokens), headers=headers)


def prometheus_text(state: ServerState) -> str:
    """The server's gauges and counters in Prometheus' text exposition format."""
    g, c, e = state.engine.gauges, state.engine.counters, state.engine
    t = state.counts.totals()  # read at one instant on the event loop: they add up
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
        ("engine_up", "gauge", "1 while the engine serves (ok or degraded), 0 once it stopped for good.",
         int(e.state != "stopped")),
        ("engine_failed_steps_total", "counter", "Engine steps that raised.", c["failed_steps"]),
        ("engine_failed_steps_in_a_row", "gauge",
         f"Failing steps since the last good one (the engine stops at {e.max_failed_steps}).", e.failed_steps_in_a_row),
        ("requests_sent_total", "counter", "Completion requests received (= completed + failed + cancelled + "
                                           "rejected + waiting + running).", t["sent"]),
        ("requests_completed_total", "counter", "Requests answered in full.", t["completed"]),
        ("requests_failed_total", "counter", "Requests the engine could not finish (engine_error).", t["failed"]),
        ("requests_cancelled_total", "counter", "Requests whose client left first.", t["cancelled"]),
        ("requests_rejected_total", "counter", "Requests refused before any work (4xx, 429, 503).", t["rejected"]),
        ("requests_waiting", "gauge", "Requests received and not answered a token yet.", t["waiting"]),
        ("requests_running", "gauge", "Requests whose answer is streaming.", t["running"]),
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
    p.add_argument("--threads", type=int, default=None,
                   help="the engine's torch threads (default: every core but one, which the front end keeps, as "
                        "vLLM's CPU backend does; with --engine-in-thread, torch's own)")
    p.add_argument("--engine-in-thread", action="store_true",
                   help="step the engine in a thread of the server's process, not in a process of its own "
                        "(kvlab.http.engine_process): the front end and the engine then share one interpreter lock")
    p.add_argument("--allocator", choices=ALLOCATORS, default=DEFAULT_ALLOCATOR,
                   help="kept: glibc keeps freed memory for the next step instead of page-faulting it in again "
                        "(kvlab.allocator; vLLM's CPU guide preloads TCMalloc for the same reason); system: malloc "
                        "as it is")
    s = p.add_argument_group("scheduling (kvlab.serving.SchedulerConfig)")
    # SERVE_SPEC: SchedulerConfig's own defaults, but a bounded queue: overload is answered 429, not queued forever
    add_engine_arguments(s, SERVE_SPEC, help={"max_waiting": "beyond it 429 + Retry-After"})
    p.add_argument("--drain-timeout", type=int, default=10, help="seconds open requests get to finish at shutdown")
    p.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds sent with 429 and 503")
    r = p.add_argument_group("faults (the engine keeps serving; see kvlab.http.engine_loop)")
    r.add_argument("--max-failed-steps", type=int, default=MAX_FAILED_STEPS,
                   help="failing engine steps in a row after which the engine stops and the server exits "
                        f"non-zero, for a supervisor to restart it (default {MAX_FAILED_STEPS})")
    r.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT_S,
                   help=f"seconds one engine step may run before the engine counts as stuck (default {STEP_TIMEOUT_S:g})")
    g = p.add_argument_group("a server for a room (kvlab.http.guard)")
    g.add_argument("--api-key", default=None,
                   help=f"require `Authorization: Bearer <key>` on /v1/*completions, /metrics and /kvlab/requests "
                        f"(default: ${API_KEY_ENV}; prefer the variable: a command line is visible to others)")
    g.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="larger request bodies get 413")
    g.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S,
                   help="seconds a client gets to send its request headers, and again its body (408)")
    p.add_argument("--log-level", default="info")


def build_engine(args: argparse.Namespace, spec: EngineSpec) -> tuple[Engine, str]:
    """The Engine (``spec`` on the model the options name) and the served model name."""
    from kvlab.threads import set_torch_threads  # imports torch: only once a server is really built

    set_torch_threads(args.threads or None)
    log.info("allocator %s", set_allocator(args.allocator))
    model, name = load_model(args.model, args.seed, args.device)
    return Engine(model, spec), args.served_model_name or name


def engine_process_threads() -> int:
    """Torch threads for an engine in a process of its own: every core this process may run on but one, which the
    HTTP front end keeps (vLLM's CPU backend reserves one the same way:
    https://docs.vllm.ai/en/latest/getting_started/installation/cpu/). More intra-op threads than free cores is
    worse than fewer: beside any other busy process, each parallel operation waits for its slowest thread, and a
    thread the OS has set aside holds every operation up until it runs again (on 2 cores beside two busy
    processes, the median request at 8 req/s took seconds on 2 threads, 0.2 s on 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # macOS
    return max(1, cores - 1)


def engine_from_args(args: argparse.Namespace, spec: EngineSpec) -> Engine:
    """`build_engine`'s engine alone: what the engine's own process builds (picklable as a partial)."""
    return build_engine(args, spec)[0]


def run_server(app: FastAPI, **changes) -> int:
    """Serve `app` with uvicorn until interrupted (0) or until its engine stops for good (1, for a supervisor).

    Where and how (`host`, `port`, `log_level`, `drain_timeout_s`) come from the app's `ServerSettings`, with any
    field changed by name."""
    import uvicorn

    state: ServerState = app.state.kvlab
    settings = state.settings.replace(**changes)
    if not is_loopback(settings.host) and state.api_key is None:
        log.warning("serving on %s, beyond this machine, with no API key: anyone who can reach it can use the "
                    "model and read /metrics and /kvlab/requests; set $%s (or --api-key)", settings.host, API_KEY_ENV)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                           access_log=False, timeout_graceful_shutdown=settings.drain_timeout_s,
                                           http=header_timeout_protocol(state.read_timeout_s)))
    exit_when_engine_stops(app, server)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn has shut down cleanly, then raises Ctrl-C's signal again: done, not failed
        pass
    if state.engine.error is not None:
        log.error("exiting with status 1: the engine stopped for good (%s)", state.engine.error)
        return 1
    return 0


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Serve until interrupted (exit status 0), or until the engine stops for good (1)."""
    args = command_args(args, "python -m kvlab serve", __doc__, add_arguments)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    settings = ServerSettings.from_args(args)  # checked before the model loads
    if not args.engine_in_thread and args.threads is None:
        args = argparse.Namespace(**{**vars(args), "threads": engine_process_threads()})
    factory = None if args.engine_in_thread else functools.partial(engine_from_args, args, settings.engine)
    if factory is not None:
        from kvlab.device import pick_device

        pick_device(args.device)  # a device that is not here is refused now, not by the engine process later
    # With an engine process, the front end's copy never steps: it stays on the CPU, whatever --device says, so a
    # GPU holds one copy of the weights and one KV pool (the engine process's).
    engine, name = build_engine(args if factory is None else argparse.Namespace(**{**vars(args), "device": "cpu"}),
                                settings.engine)
    app = create_app(engine, name, settings, engine_factory=factory)
    log.info("serving %s on http://%s:%d (OpenAI API under /v1)%s", name, settings.host, settings.port,
             ", API key required" if settings.api_key else "")
    return run_server(app)

if __name__ == "__main__":
    raise SystemExit(main())
