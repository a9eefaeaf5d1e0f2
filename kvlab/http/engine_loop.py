"""One engine loop for every connection: a thread stepping the Engine, and a token queue per request.

The `Engine` is synchronous and not thread-safe, so exactly one thread owns
it. HTTP handlers (on the asyncio event loop) talk to it only through a
command queue — add a request, abort one, stop — and it answers through
`loop.call_soon_threadsafe`: the verdict on each add (queued, or rejected
with the engine's reason) and, after every step, each request's new token.
Continuous batching is the engine's: whatever is queued joins the running
batch at the next step, whichever connection it came from.

Engine-side `RequestRecord`s (stamped on the engine's clock, from the moment
the server received the request) are kept for the last `keep_records`
requests, so client-side and engine-side clocks can be compared
(`kvlab.http.compare`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from dataclasses import dataclass, field

from kvlab.clocks import RequestRecord
from kvlab.serving import Engine, RequestOutput, SamplingParams
from kvlab.workload import Request

log = logging.getLogger("kvlab.serve")
IDLE_POLL_S = 0.002  # how often a non-empty engine that cannot step yet (a static batch filling) looks again


class EngineRejected(Exception):
    """The engine refused a request at once; `reason` is its fail reason ("queue_full", ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class RequestStream:
    """What a handler reads: the engine's outputs for one request, in order, ending with a finished one."""

    request_id: str
    prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_output_tokens: int = 0
    finish_reason: str | None = None


class AsyncEngine:
    """Runs `engine` in its own thread; `submit` / `abort` from the event loop."""

    def __init__(self, engine: Engine, keep_records: int = 10_000, keep_steps: int = 10_000) -> None:
        self.engine = engine
        self.records: collections.deque[RequestRecord] = collections.deque(maxlen=keep_records)
        self.keep_steps = keep_steps
        self.streams: dict[str, RequestStream] = {}  # touched only on the event loop
        self.gauges: dict = {}
        self.counters = collections.Counter()  # prompt_tokens, generation_tokens, steps (engine thread)
        self.error: BaseException | None = None
        self._commands: queue.Queue = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._publish_gauges()

    # -- life cycle (event loop side) -----------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="kvlab-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    async def stop(self, timeout_s: float = 10.0) -> int:
        """Cancel whatever is still queued or running, free its blocks, end the thread; returns how many."""
        if self._thread is None or not self._thread.is_alive():
            return 0
        done: asyncio.Future = self._loop.create_future()
        self._commands.put(("stop", done))
        try:
            return await asyncio.wait_for(done, timeout_s)
        finally:
            await asyncio.to_thread(self._thread.join, timeout_s)

    # -- requests (event loop side) -------------------------------------------------------------
    async def submit(self, request: Request, sampling: SamplingParams) -> RequestStream:
        """Hand `request` to the engine; its stream, or EngineRejected with the engine's reason."""
        if not self.alive:
            raise EngineRejected("engine_stopped")
        stream = RequestStream(str(request.request_id), request.prompt_tokens)
        self.streams[stream.request_id] = stream
        verdict: asyncio.Future = self._loop.create_future()
        self._commands.put(("add", request, sampling, verdict))
        try:
            reason = await verdict
        except asyncio.CancelledError:  # the handler is cancelled (shutdown) before the engine answered
            self.abort(stream.request_id)
            self.streams.pop(stream.request_id, None)
            raise
        if reason is not None:
            self.streams.pop(stream.request_id, None)
            raise EngineRejected(reason)
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (the client left); its blocks are freed at the engine's next turn."""
        self._commands.put(("abort", request_id))

    def release(self, request_id: str) -> None:
        """The handler is done with this stream."""
        self.streams.pop(request_id, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            stream = self.streams.get(str(o.request_id))
            if stream is not None:
                stream.queue.put_nowait(o)

    def _reply(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                busy = engine.has_unfinished_requests()
                try:  # block while idle; otherwise just take what has arrived since the last step
                    commands = [self._commands.get(timeout=None if not busy else 0)]
                except queue.Empty:
                    commands = []
                while True:
                    try:
                        commands.append(self._commands.get_nowait())
                    except queue.Empty:
                        break
                for command in commands:
                    if command[0] == "stop":
                        self._reply(_resolve, command[1], self._abort_all())
                        return
                    self._handle(command)
                if engine.has_unfinished_requests():
                    self._step()
        except Exception as e:  # a bug in a step: fail every request loudly rather than leave them hanging
            log.exception("the engine loop stopped")
            self.error = e
            self._reply(self._fail_all_streams)

    def _handle(self, command: tuple) -> None:
        engine = self.engine
        if command[0] == "add":
            _, request, sampling, verdict = command
            try:
                record = engine.add_request(request, sampling, now=engine.now())
            except ValueError as e:  # the server checks first; this is a safety net, not the path
                self._reply(_resolve, verdict, f"invalid_request: {e}")
                return
            if record.status == "failed":
                self._retire(request.request_id)
                self._reply(_resolve, verdict, record.fail_reason or "rejected")
            else:
                self.counters["prompt_tokens"] += request.prompt_tokens
                self._reply(_resolve, verdict, None)
            self._publish_gauges()
        elif command[0] == "abort":
            rid = command[1]
            if engine.abort(rid):
                self._retire(rid)
                self._publish_gauges()

    def _step(self) -> None:
        engine = self.engine
        steps = engine.scheduler.num_steps
        outputs = engine.step()
        if engine.scheduler.num_steps == steps:  # nothing could run yet (a static batch filling up)
            try:
                self._handle_or_requeue(self._commands.get(timeout=IDLE_POLL_S))
            except queue.Empty:
                pass
            return
        self.counters["steps"] += 1
        self.counters["generation_tokens"] += sum(o.token_id is not None for o in outputs)
        for o in outputs:
            if o.finished:
                self._retire(o.request_id)
        if len(engine.trace) > 2 * self.keep_steps:  # a server runs for days: keep the recent steps only
            del engine.trace[:-self.keep_steps]
        self._publish_gauges()
        if outputs:
            self._reply(self._deliver, outputs)

    def _handle_or_requeue(self, command: tuple) -> None:
        if command[0] == "stop":
            self._commands.put(command)  # handled at the top of the loop
        else:
            self._handle(command)

    def _retire(self, request_id) -> None:
        """Move an ended request's record out of the engine into the bounded history."""
        record = self.engine.records.pop(request_id, None)
        self.engine.sequences.pop(request_id, None)
        if record is not None:
            self.records.append(record)

    def _abort_all(self) -> int:
        engine = self.engine
        ids = [s.request_id for s in (*engine.scheduler.waiting, *engine.scheduler.running)]
        for rid in ids:
            engine.abort(rid)
            self._retire(rid)
        self._publish_gauges()
        if ids:
            self._reply(self._deliver, [RequestOutput(rid, None, 0, True, "cancelled") for rid in ids])
        return len(ids)

    def _fail_all_streams(self) -> None:
        for stream in self.streams.values():
            stream.queue.put_nowait(RequestOutput(stream.request_id, None, 0, True, "engine_error"))

    def _publish_gauges(self) -> None:
        """A snapshot for /metrics and /health, replaced whole (readers never see it half-written)."""
        engine = self.engine
        stats = engine.block_manager.stats()
        self.gauges = {"num_requests_waiting": len(engine.scheduler.waiting),
                       "num_requests_running": len(engine.scheduler.running),
                       "kv_blocks_total": stats.num_blocks, "kv_blocks_used": stats.used,
                       "kv_blocks_free": stats.free, "kv_blocks_cached": stats.cached,
                       "num_preemptions": engine.scheduler.num_preemptions,
                       "prefix_hit_tokens": stats.prefix_hit_tokens}


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)
