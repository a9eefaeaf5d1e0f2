"""One engine loop for every connection: a thread stepping the Engine, and a token queue per request.

The `Engine` is synchronous and not thread-safe, so exactly one thread owns it. HTTP handlers (on the asyncio event
loop) talk to it only through a command queue — add a request, abort one, stop — and it answers through
`loop.call_soon_threadsafe`: the verdict on each add (queued, or rejected with the engine's reason) and, after every
step, each request's new token. Continuous batching is the engine's: whatever is queued joins the running batch at the
next step, whichever connection it came from.

A fault stays in its request. A step that raises (`StepFailed`: the executor ran out of memory, a kernel failed, the
scheduler broke) ends the requests of that step with `engine_error`, their KV blocks freed, and the engine goes on with
everything else; a request whose own logits are NaN ends alone, but a step that yields no finite logits for any of its
sequences is a failed step like a raising one (a model that only returns NaN is broken). A request the server itself
cannot go on with (its tokens cannot be turned into text) is failed with `fail`: the engine stops generating for it and
frees its blocks at its next turn. After `max_failed_steps` failing steps in a row the engine stops for good (vLLM's
choice: a broken engine is restarted, not nursed): every open request is answered (`engine_error`, or 503
`engine_stopped` for one not yet admitted), and `on_stop` is called so the server can exit non-zero for its supervisor
to restart it.

Nothing waits on the engine thread without a bound: a watchdog on the event loop checks every `WATCHDOG_S` that the
thread is alive and that no step has run longer than `step_timeout_s`; if either fails, the engine is declared stopped
and every open request is answered from the event loop itself. So a request's verdict comes within `step_timeout_s` +
`WATCHDOG_S`, and no stream waits longer than that without the engine making progress.

Engine-side `RequestRecord`s (stamped on the engine's clock, from the moment the server received the request) are kept
for the last `keep_records` requests, so client-side and engine-side clocks can be compared (`kvlab.http.compare`).

Where the loop runs: in a thread of the server's process (`AsyncEngine(engine)`), or in a process of its own
(`AsyncEngine.in_process(factory)`, `kvlab.http.engine_process`), as vLLM runs its EngineCore beside its API server. In
a thread, the HTTP front end (parsing, turning tokens into text, writing each chunk) takes Python's one interpreter
lock from the engine between its operations; in its own process the engine steps on its own core. The same loop and the
same messages either way: everything the engine says to the front end goes through `_reply`, everything the front end
asks through `_send`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from kvlab.clocks import RequestRecord
from kvlab.http.engine_process import EngineProcess
from kvlab.serving import ENGINE_ERROR, Engine, RequestOutput, SamplingParams, StepFailed
from kvlab.workload import Request

log = logging.getLogger("kvlab.serve")
IDLE_POLL_S = 0.002  # how often a non-empty engine that cannot step yet (a static batch filling) looks again
WATCHDOG_S = 0.5  # how often the event loop checks that the engine thread lives and its step is not stuck
MAX_FAILED_STEPS = 3  # consecutive failing steps after which the engine stops for good
STEP_TIMEOUT_S = 60.0  # a step running longer than this means the engine is stuck: it is stopped
# Why the engine refused a request at once: its scheduler's reasons, then the loop's own.
RejectReason = Literal["queue_full", "prompt_too_long", "engine_stopped", "no_verdict", "invalid_request", "rejected"]
STOPPED: RejectReason = "engine_stopped"  # the reason a request is refused once the engine stopped for good


class EngineRejected(Exception):
    """The engine refused a request at once: `reason` says why, `detail` what the engine said, if anything."""

    def __init__(self, reason: RejectReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass
class RequestStream:
    """What a handler reads: the engine's outputs for one request, in order, ending with a finished one."""

    request_id: str
    prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_output_tokens: int = 0
    finish_reason: str | None = None
    finished: bool = False  # a finished output has been put in the queue


class AsyncEngine:
    """Runs `engine` in its own thread; `submit` / `abort` from the event loop.

    `state`: "ok", "degraded" (the last step failed, fewer than `max_failed_steps` in a row)
    or "stopped" (for good: `error` says why).
    """

    def __init__(self, engine: Engine, keep_records: int = 10_000, keep_steps: int = 10_000,
                 max_failed_steps: int = MAX_FAILED_STEPS, step_timeout_s: float = STEP_TIMEOUT_S,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.engine = engine  # max_failed_steps and step_timeout_s come checked (kvlab.http.settings.ServerSettings)
        self.records: collections.deque[RequestRecord] = collections.deque(maxlen=keep_records)
        self.keep_steps = keep_steps
        self.max_failed_steps, self.step_timeout_s = max_failed_steps, step_timeout_s
        self.on_stop = on_stop  # called on the event loop once, when the engine stops for good
        self.streams: dict[str, RequestStream] = {}  # touched only on the event loop
        self.gauges: dict = {}
        # prompt_tokens, generation_tokens, steps, failed_steps (engine thread)
        self.counters: collections.Counter[str] = collections.Counter()
        self.failed_steps_in_a_row = 0
        self.last_error: str | None = None  # the last failing step's error, for /health
        self.error: BaseException | None = None  # set when the engine stopped for good
        self._commands: queue.Queue = queue.Queue()  # what the engine loop reads (fed by _send, or by a pipe)
        self._accepting = True  # guarded by _lock: once False, no add command is queued any more
        self._lock = threading.Lock()
        self._verdicts: dict[str, asyncio.Future] = {}  # request id -> its pending verdict (event loop)
        self._stop_done: asyncio.Future | None = None  # answered with the number cancelled when the loop stops
        self._step_clock: Any = _StepClock()  # .value: time.monotonic() of the running step, NaN between steps
        self._stopped_on_loop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._process: Any = None  # the engine's own process (kvlab.http.engine_process), when it has one
        self._pipe: Any = None  # the sending end: (front end) commands to that process; (engine process) messages up
        self._inbox: Any = None  # (front end) the receiving end of the engine process's messages
        self._send_lock = threading.Lock()
        self._watchdog: asyncio.Task | None = None
        self._publish_gauges()

    @classmethod
    def in_process(cls, factory: Callable[[], Engine], front: Engine, **options) -> "AsyncEngine":
        """The engine loop in a process of its own, over the engine `factory()` builds there (picklable: a module-level
        function or a functools.partial of one). `front` is the front end's copy, for what the server reads before
        any step (the tokenizer, the model's length, the pool's size) and for its clock, which the engine shares."""
        loop = cls(front, **options)
        loop._process = EngineProcess(cls, factory, front.clock_origin, options)
        return loop

    # -- life cycle (event loop side) -----------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._process is None:
            self._thread = threading.Thread(target=self._run, name="kvlab-engine", daemon=True)
        else:  # the engine steps in its own process; this thread only carries its messages onto the event loop
            self._pipe, self._inbox, self._step_clock = self._process.start()
            self._thread = threading.Thread(target=self._receive, name="kvlab-engine-pipe", daemon=True)
        self._thread.start()
        self._watchdog = self._loop.create_task(self._watch())

    async def ready(self, timeout_s: float = 600.0) -> None:
        """Return once the engine can take requests (at once in a thread; once its process has built it)."""
        if self._process is not None:
            await self._process.ready(timeout_s)

    @property
    def in_own_process(self) -> bool:
        return self._process is not None

    def _worker_alive(self) -> bool:
        """The engine's thread, or its process and the thread carrying its messages, are running."""
        if self._thread is None or not self._thread.is_alive():
            return False
        return self._process is None or self._process.alive()

    @property
    def alive(self) -> bool:
        return self._worker_alive() and self.error is None

    @property
    def state(self) -> EngineState:
        if self.error is not None or (self._thread is not None and not self._worker_alive()):
            return "stopped"
        return "degraded" if self.failed_steps_in_a_row else "ok"

    async def stop(self, timeout_s: float = 10.0) -> int:
        """Cancel whatever is still queued or running, free its blocks, end the thread; returns how many."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._thread is None or not self._worker_alive() or self.error is not None:
            if self._process is not None:
                await asyncio.to_thread(self._process.end, timeout_s)
            return 0  # not started, or stopped for good: everything was answered then (a stuck thread is a daemon)
        assert self._loop is not None, "start() first"  # a started thread means start() ran
        self._stop_done = self._loop.create_future()
        self._send(("stop",))
        try:
            return await asyncio.wait_for(self._stop_done, timeout_s)
        except asyncio.TimeoutError:  # the engine is stuck in a step: answer everyone from here
            self._stopped(RuntimeError(f"the engine did not stop within {timeout_s} s"))
            return len(self.streams)
        finally:
            if self._process is not None:
                await asyncio.to_thread(self._process.end, timeout_s)
            await asyncio.to_thread(self._thread.join, timeout_s)

    async def _watch(self) -> None:
        """The watchdog: declare the engine stopped if its thread (or process) died or a step is stuck."""
        while self.error is None:
            await asyncio.sleep(WATCHDOG_S)
            started = self._step_clock.value
            if not self._worker_alive():
                self._stopped(RuntimeError("the engine process ended" if self._process is not None
                                           else "the engine thread ended"))
            elif not math.isnan(started) and time.monotonic() - started > self.step_timeout_s:
                log.error("an engine step has run for more than %.0f s: stopping the engine", self.step_timeout_s)
                self._stopped(TimeoutError(f"an engine step ran longer than step_timeout_s={self.step_timeout_s} s"))
                if self._process is not None:  # a process can be ended, unlike a thread: its core is freed
                    self._process.kill()

    # -- requests (event loop side) -------------------------------------------------------------
    async def submit(self, request: Request, sampling: SamplingParams) -> RequestStream:
        """Hand `request` to the engine; its stream, or EngineRejected with the engine's reason."""
        assert self._loop is not None, "start() first"
        stream = RequestStream(str(request.request_id), request.prompt_tokens)
        verdict: asyncio.Future = self._loop.create_future()
        with self._lock:
            if not self._accepting or not self.alive:
                raise EngineRejected(STOPPED)
            self.streams[stream.request_id] = stream
            self._verdicts[stream.request_id] = verdict
            self._send(("add", request, sampling))
        answer: tuple[RejectReason, str] | None
        try:  # the engine answers between two steps; the watchdog answers if it cannot
            answer = await asyncio.wait_for(asyncio.shield(verdict), self.step_timeout_s + 2 * WATCHDOG_S)
        except asyncio.TimeoutError:  # cannot happen while the watchdog runs; a bound all the same
            answer = ("no_verdict", "")
        except asyncio.CancelledError:  # the handler is cancelled (shutdown) before the engine answered
            self.abort(stream.request_id)
            self.streams.pop(stream.request_id, None)
            raise
        finally:
            self._verdicts.pop(stream.request_id, None)
        if answer is not None:
            reason, detail = answer
            if reason == "no_verdict":
                self.abort(stream.request_id)
            self.streams.pop(stream.request_id, None)
            raise EngineRejected(reason, detail)
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (the client left); its blocks are freed at the engine's next turn."""
        self._send(("abort", request_id))

    def fail(self, request_id: str, why: str) -> None:
        """End a request with `engine_error` (`why` kept in its record): the engine stops generating for it and
        frees its blocks at its next turn. For a fault of the request's own outside the engine (its text)."""
        self._send(("fail", request_id, why))

    def _send(self, command: tuple) -> None:
        """A command for the engine loop: onto its queue, or down the pipe to its process."""
        if self._pipe is None:
            self._commands.put(command)
            return
        try:
            with self._send_lock:
                self._pipe.send(command)
        except (OSError, ValueError):  # the process has gone: the watchdog answers whatever is open
            pass

    def release(self, request_id: str) -> None:
        """The handler is done with this stream."""
        self.streams.pop(request_id, None)

    def _verdict(self, request_id: str, reason: RejectReason | None, detail: str = "") -> None:
        """Event loop: the engine's verdict on an add (None: queued; else why it was refused, and its words)."""
        verdict = self._verdicts.get(request_id)
        if verdict is not None:
            _resolve(verdict, None if reason is None else (reason, detail))

    def _stopped_with(self, cancelled: int) -> None:
        """Event loop: the engine loop has ended on a stop command, `cancelled` requests aborted."""
        if self._stop_done is not None:
            _resolve(self._stop_done, cancelled)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            stream = self.streams.get(str(o.request_id))
            if stream is not None and not stream.finished:
                stream.finished = o.finished
                stream.queue.put_nowait(o)

    def _stopped(self, error: BaseException) -> None:
        """On the event loop, once: the engine is stopped for good; answer every open request and call on_stop."""
        with self._lock:
            self._accepting = False
        if self.error is None:
            self.error = error
        if self._stopped_on_loop:
            return
        self._stopped_on_loop = True
        for verdict in list(self._verdicts.values()):
            _resolve(verdict, (STOPPED, ""))
        why = f"the engine stopped: {self.error}"
        self._deliver([RequestOutput(s.request_id, None, s.num_output_tokens, True, ENGINE_ERROR, why)
                       for s in list(self.streams.values())])
        if self.on_stop is not None:
            self.on_stop()

    def _reply(self, fn, *args) -> None:
        """Engine side: call `fn(*args)` on the front end's event loop (through the pipe from a process of its own)."""
        if self._loop is None:  # in the engine's own process: the method's name and its arguments go down the pipe
            try:
                self._pipe.send((fn.__name__, args))
            except (OSError, ValueError):  # the front end has gone
                pass
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _receive(self) -> None:
        """Front end, the pipe's thread: each message from the engine's process, called on the event loop."""
        while True:
            try:
                name, args = self._inbox.recv()
            except (EOFError, OSError):  # the process ended: the watchdog declares it stopped
                return
            if name in ENGINE_MESSAGES:
                self._reply(getattr(self, name), *args)

    def _synced(self, gauges: dict, counters: dict, failed_steps_in_a_row: int, last_error: str | None) -> None:
        """Event loop: the engine process's gauges and counts after its last step."""
        self.gauges, self.counters = gauges, collections.Counter(counters)
        self.failed_steps_in_a_row, self.last_error = failed_steps_in_a_row, last_error

    def _kept(self, record: RequestRecord) -> None:
        """Event loop: an ended request's record, from the engine process."""
        self.records.append(record)

    def _stopped_remote(self, why: str) -> None:
        """Event loop: the engine process stopped for good (its exception, told as text)."""
        self._stopped(RuntimeError(why))

    def _engine_ready(self, info: dict) -> None:
        """Event loop: the engine process has built its engine (`info`: its pid and torch threads)."""
        self._process.on_ready(info)

    def _start_failed(self, text: str) -> None:
        """Event loop: the engine process could not build its engine (`text`: its traceback)."""
        self._process.on_start_failed(text)

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while self.error is None:
                busy = engine.has_unfinished_requests()
                try:  # block while idle; otherwise just take what has arrived since the last step
                    commands = [self._commands.get(timeout=None if not busy else 0)]
                except queue.Empty:
                    commands = []
                for command in commands + self._queued():
                    if command[0] == "stop":
                        self._reply(self._stopped_with, self._abort_all())
                        return
                    self._handle(command)
                if engine.has_unfinished_requests():
                    self._step()
        except Exception as e:  # a bug in the loop itself: stop for good, answering every request
            log.exception("the engine loop failed")
            self._stop_for_good(e)

    def _handle(self, command: tuple) -> None:
        engine = self.engine
        if command[0] == "add":
            _, request, sampling = command
            rid = str(request.request_id)
            if self.error is not None:
                self._reply(self._verdict, rid, STOPPED)
                return
            try:
                record = engine.add_request(request, sampling, now=engine.now())
            except ValueError as e:  # the server checks first; this is a safety net, not the path
                self._reply(self._verdict, rid, "invalid_request", str(e))
                return
            if record.status == "failed":
                self._retire(request.request_id)
                reason = record.fail_reason if record.fail_reason in ("queue_full", "prompt_too_long") else "rejected"
                self._reply(self._verdict, rid, reason, record.fail_reason or "")
            else:
                self.counters["prompt_tokens"] += request.prompt_tokens
                self._reply(self._verdict, rid, None)
            self._publish_gauges()
        elif command[0] == "abort":
            rid = command[1]
            if engine.abort(rid):
                self._retire(rid)
                self._publish_gauges()
        elif command[0] == "fail":
            _, rid, why = command
            if engine.fail(rid, why) is not None:  # None: it had ended already
                self.counters["failed_requests"] += 1
                self._retire(rid)
                self._publish_gauges()
        elif command[0] == "stop":
            self._reply(self._stopped_with, 0)

    def _step(self) -> None:
        engine = self.engine
        steps = engine.scheduler.num_steps
        self._step_clock.value = time.monotonic()
        try:
            outputs = engine.step()
        except StepFailed as failed:
            self._step_failed(failed)
            return
        finally:
            self._step_clock.value = math.nan
        if engine.scheduler.num_steps == steps:  # nothing could run yet (a static batch filling up)
            try:
                self._handle_or_requeue(self._commands.get(timeout=IDLE_POLL_S))
            except queue.Empty:
                pass
            return
        if any(o.token_id is not None for o in outputs):  # a good step: the model gave a token (a step that only
            self.failed_steps_in_a_row = 0                # prefilled a chunk says nothing about a model's NaN)
        self.counters["steps"] += 1
        self.counters["generation_tokens"] += sum(o.token_id is not None for o in outputs)
        self.counters["failed_requests"] += sum(o.finish_reason == ENGINE_ERROR for o in outputs)
        if len(engine.trace) > 2 * self.keep_steps:  # a server runs for days: keep the recent steps only
            del engine.trace[:-self.keep_steps]
        self._end(outputs)

    def _end(self, outputs: list[RequestOutput]) -> None:
        """Retire the requests ``outputs`` finish, publish the gauges, and hand ``outputs`` to their streams."""
        for o in outputs:
            if o.finished:
                self._retire(o.request_id)
        self._publish_gauges()
        if outputs:
            self._reply(self._deliver, outputs)

    def _step_failed(self, failed: StepFailed) -> None:
        """A step raised: its requests are already ended and freed by the engine; tell them, count, maybe stop."""
        self.failed_steps_in_a_row += 1
        self.counters["failed_steps"] += 1
        self.counters["failed_requests"] += len(failed.outputs)
        self.last_error = str(failed)
        log.error("engine step failed (%d in a row, stop at %d): %s", self.failed_steps_in_a_row,
                  self.max_failed_steps, failed, exc_info=failed.error)
        self._end(failed.outputs)
        if self.failed_steps_in_a_row >= self.max_failed_steps:
            self._stop_for_good(failed)

    def _stop_for_good(self, error: BaseException) -> None:
        """Engine thread: refuse new requests, answer the queued ones, end every request in the engine."""
        log.error("the engine stops for good after %d failing step(s) in a row: %s", self.failed_steps_in_a_row, error)
        with self._lock:
            self._accepting = False  # from here no add command is queued: the drain below sees them all
        self.error = error
        for command in self._queued():
            self._handle(command)  # adds are answered engine_stopped, aborts done, stops answered
        engine, why = self.engine, f"the engine stopped: {error}"
        ids = self._open_ids()
        outputs = [o for o in (engine.fail(rid, why) for rid in ids) if o is not None]
        for rid in ids:
            self._retire(rid)
        self.counters["failed_requests"] += len(outputs)
        self._end(outputs)
        if self._loop is None:  # from the engine's own process: its exception as text (it may not unpickle)
            self._reply(self._stopped_remote, f"{type(error).__name__}: {error}")
        else:
            self._reply(self._stopped, error)

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
            if self._loop is None:  # in the engine's own process: the front end keeps the records
                self._reply(self._kept, record)
            else:
                self.records.append(record)

    def _queued(self) -> list[tuple]:
        """Every command queued now, taken off the queue without waiting."""
        commands = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _open_ids(self) -> list:
        """The ids of every request waiting or running in the engine."""
        return [s.request_id for s in (*self.engine.scheduler.waiting, *self.engine.scheduler.running)]

    def _abort_all(self) -> int:
        ids = self._open_ids()
        for rid in ids:
            self.engine.abort(rid)
        self._end([RequestOutput(rid, None, 0, True, "cancelled") for rid in ids])
        return len(ids)

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
        if self._pipe is not None and self._loop is None:  # in the engine's own process: tell the front end
            self._reply(self._synced, self.gauges, dict(self.counters), self.failed_steps_in_a_row, self.last_error)


EngineState = Literal["ok", "degraded", "stopped"]  # what /health says


class _StepClock:
    """When the running step started (time.monotonic()), NaN between steps: what the watchdog reads. A process of
    its own shares one `multiprocessing` value instead, with the same `.value`."""

    value: float = math.nan


# The front-end methods an engine process may call through the pipe (nothing else is called by name).
ENGINE_MESSAGES = frozenset({"_verdict", "_deliver", "_stopped_with", "_synced", "_kept", "_stopped_remote",
                             "_engine_ready", "_start_failed"})


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)
