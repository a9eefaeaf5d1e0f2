"""The engine loop in a process of its own, beside the HTTP front end (vLLM's EngineCore process beside its API server).

In one process, the front end's Python (reading requests, turning tokens into text, writing every chunk) and the
engine's Python between its tensor operations take turns on one interpreter lock, so each step waits for the front
end's work of the step before. Here the engine steps in a child process on a core of its own, and the two exchange
small messages over two one-way pipes: commands down (add, abort, fail, stop), and up the calls the engine loop makes
on the front end (`engine_loop.ENGINE_MESSAGES`: verdicts, tokens, gauges, records, stop). vLLM does the same with
ZeroMQ sockets between its API server and `EngineCoreProc` (https://docs.vllm.ai/en/latest/design/arch_overview/);
SGLang puts its tokenizer, scheduler and detokenizer in three processes.

The child is started with the "spawn" method on every platform (no fork of a process that already runs threads
and OpenMP) and builds its engine itself from a picklable factory; the front end keeps its own copy for what it
reads before any step (the tokenizer, the model's length, the pool's size), and both count time from the same
`time.perf_counter()` origin, so the engine's records and the front end's stamps share one clock. What the
watchdog reads (when the running step started) is one shared double.
"""
from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import signal
import threading
import traceback
from typing import Any, Callable, Final

START_METHOD: Final = "spawn"
CHILD_OPTIONS = ("keep_steps", "max_failed_steps", "step_timeout_s")  # the AsyncEngine options the engine side uses


class EngineProcess:
    """Starts, watches and ends the engine's process; `AsyncEngine.in_process` holds one."""

    def __init__(self, loop_class: type, factory: Callable[[], Any], clock_origin: float, options: dict) -> None:
        self.loop_class, self.factory, self.clock_origin = loop_class, factory, clock_origin
        self.options = {k: v for k, v in options.items() if k in CHILD_OPTIONS}
        self.ctx = multiprocessing.get_context(START_METHOD)
        self.process: Any = None
        self.ready_future: asyncio.Future | None = None
        self.info: dict = {}

    def start(self) -> tuple[Any, Any, Any]:
        """Start the child; (the commands' sending end, the messages' receiving end, the shared step clock)."""
        commands_in, commands_out = self.ctx.Pipe(duplex=False)
        messages_in, messages_out = self.ctx.Pipe(duplex=False)
        step_clock = self.ctx.RawValue("d", math.nan)
        self.ready_future = asyncio.get_running_loop().create_future()
        self.process = self.ctx.Process(target=run_engine_process, name="kvlab-engine", daemon=True,
                                        args=(self.loop_class, self.factory, commands_in, messages_out,
                                              step_clock, self.clock_origin, self.options))
        self.process.start()
        commands_in.close()  # the child's ends: held by the child alone, so either side sees the other leave
        messages_out.close()
        return commands_out, messages_in, step_clock

    async def ready(self, timeout_s: float) -> None:
        """Wait until the child has built its engine; RuntimeError with its traceback if it could not."""
        assert self.ready_future is not None, "start() first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.ready_future.done():
            if not self.alive():
                raise RuntimeError(f"the engine process ended before it was ready (exit code {self.process.exitcode})")
            if loop.time() > deadline:
                raise RuntimeError(f"the engine process was not ready within {timeout_s:.0f} s")
            await asyncio.wait([self.ready_future], timeout=0.1)
        self.ready_future.result()  # raises the child's failure

    def on_ready(self, info: dict) -> None:
        self.info = info
        if self.ready_future is not None and not self.ready_future.done():
            self.ready_future.set_result(info)

    def on_start_failed(self, text: str) -> None:
        if self.ready_future is not None and not self.ready_future.done():
            self.ready_future.set_exception(RuntimeError(f"the engine process could not build its engine:\n{text}"))

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def kill(self) -> None:
        """End a stuck child at once (the watchdog's last word)."""
        if self.alive():
            self.process.kill()

    def end(self, timeout_s: float) -> None:
        """Wait for the child to exit after its stop command; ended if it does not within `timeout_s`."""
        if self.process is None:
            return
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2.0)
        self.kill()


def run_engine_process(loop_class: type, factory: Callable[[], Any], commands: Any, messages: Any, step_clock: Any,
                       clock_origin: float, options: dict) -> None:
    """The child: build the engine, then run the same engine loop a thread would (`loop_class`, the front end's
    `AsyncEngine`, passed by name), its calls going up `messages`. Ctrl-C in a terminal reaches the whole process
    group: the child ignores it, and stops when the front end says so (or leaves)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = factory()
        engine.share_clock(clock_origin)
    except BaseException:  # noqa: BLE001 -- told to the front end whole, which refuses to start
        messages.send(("_start_failed", (traceback.format_exc(),)))
        return
    loop = loop_class(engine, **options)
    loop._pipe, loop._step_clock = messages, step_clock
    threading.Thread(target=_feed, args=(commands, loop._commands), name="kvlab-engine-commands", daemon=True).start()
    import torch

    messages.send(("_engine_ready", ({"pid": os.getpid(), "torch_threads": torch.get_num_threads()},)))
    loop._publish_gauges()
    loop._run()


def _feed(commands: Any, inbox: Any) -> None:
    """Child: commands from the pipe onto the engine loop's queue; a front end that has gone means stop."""
    while True:
        try:
            inbox.put(commands.recv())
        except (EOFError, OSError):
            inbox.put(("stop",))
            return
