"""Faults on purpose: an executor and a scheduler that fail at a chosen step, to show a failure stays in its request.

The test device of the engine's fault handling (``tests/test_faults.py``,
``scripts/fault_figures.py``); test scaffolding, so it lives here in tests/, not in the package. ``FaultyExecutor`` is the real ``ModelExecutor`` with one
fault added at its ``at_step``-th call of ``execute`` (counted from 0):

- ``raise_once``: a RuntimeError at that step only;
- ``raise_always``: a RuntimeError at that step and every step after it;
- ``oom``: ``torch.OutOfMemoryError`` at that step, as a GPU that ran out of memory raises;
- ``nan_row``: the logits of one sampled row (``row``) become NaN at that step;
- ``nan_step``: every sampled row's logits become NaN at that step (a failed step);
- ``nan_always``: every sampled row's logits are NaN at that step and every step after it (a broken model
  that still runs: it never raises, it only returns NaN);
- ``hang``: that step sleeps ``hang_s`` seconds before it runs (a stuck kernel, a deadlock).

``FaultyScheduler`` raises from inside ``schedule`` at its ``at_step``-th non-empty step, after
it has admitted, preempted and allocated blocks: the worst place, where the batch it built is
lost with blocks taken. ``install`` puts one into an engine in place of its scheduler.

``FaultyTokenizer`` wraps a tokenizer whose ``decode`` raises at its ``at_call``-th call (counted
from 0), once or from then on: a server's detokenizer failing on one request's text.
"""
from __future__ import annotations

import time

import torch

from kvlab.model.decoder import Decoder
from kvlab.serving.executor import ModelExecutor, StepResult
from kvlab.serving.scheduler import Scheduler, SchedulerOutput
from kvlab.serving.config import EngineSpec

FAULTS = ("raise_once", "raise_always", "oom", "nan_row", "nan_step", "nan_always", "hang")
NAN_FAULTS = ("nan_row", "nan_step", "nan_always")


class InjectedFault(RuntimeError):
    """The error a faulty executor or scheduler raises on purpose."""


class FaultyExecutor(ModelExecutor):
    """``ModelExecutor`` with one fault (see the module docstring) from its ``at_step``-th step."""

    name = "model+fault"

    def __init__(self, model: Decoder, fault: str, at_step: int = 0, row: int = 0, hang_s: float = 5.0) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
        if at_step < 0 or row < 0:
            raise ValueError(f"at_step ({at_step}) and row ({row}) must be >= 0")
        super().__init__(model)
        self.fault, self.at_step, self.row, self.hang_s = fault, at_step, row, hang_s
        self.calls = 0  # execute calls so far
        self.faults = 0  # faults injected so far

    def _due(self) -> bool:
        step = self.calls - 1
        return step >= self.at_step if self.fault in ("raise_always", "nan_always") else step == self.at_step

    def execute(self, out: SchedulerOutput) -> StepResult:
        self.calls += 1
        if self._due() and self.fault not in NAN_FAULTS:
            self.faults += 1
            if self.fault == "hang":
                time.sleep(self.hang_s)
                return super().execute(out)
            if self.fault == "oom":
                raise torch.OutOfMemoryError(f"injected: CUDA out of memory at step {self.calls - 1}")
            raise InjectedFault(f"injected executor fault at step {self.calls - 1}")
        return super().execute(out)

    def compute_logits(self, out: SchedulerOutput, rows: list[int]) -> torch.Tensor:
        logits = super().compute_logits(out, rows)  # (len(rows), V)
        if self.fault in NAN_FAULTS and self._due() and len(rows):
            self.faults += 1
            logits = logits.clone()
            if self.fault == "nan_row":
                logits[min(self.row, len(rows) - 1)] = float("nan")
            else:
                logits[:] = float("nan")
        return logits

    def poisoned_request(self, out: SchedulerOutput) -> object:
        """The request id whose row ``nan_row`` poisons in step ``out`` (for a test to name it)."""
        rows = [i for i, s in enumerate(out.do_sample) if s]
        return out.seqs[rows[min(self.row, len(rows) - 1)]].request_id


class FaultyScheduler(Scheduler):
    """A Scheduler that raises inside ``schedule`` at its ``at_step``-th non-empty step (and after, if ``always``)."""

    def __init__(self, *args, at_step: int = 0, always: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at_step, self.always = at_step, always
        self.calls = 0  # non-empty steps built so far
        self.faults = 0

    def schedule(self, now: float) -> SchedulerOutput:
        out = super().schedule(now)  # admissions made and blocks allocated: then the fault
        if out.seqs:
            self.calls += 1
            step = self.calls - 1
            if step == self.at_step or (self.always and step > self.at_step):
                self.faults += 1
                raise InjectedFault(f"injected scheduler fault at step {step}, with {len(out.seqs)} "
                                    "sequence(s) scheduled and their blocks allocated")
        return out

    @classmethod
    def install(cls, engine, at_step: int = 0, always: bool = False) -> "FaultyScheduler":
        """Replace ``engine``'s (empty) scheduler by a faulty one over the same pool; returns it."""
        if engine.scheduler.has_unfinished():
            raise ValueError("install a faulty scheduler before any request is added")
        engine.scheduler = cls(engine.scheduler_config, engine.block_manager, engine.max_model_len,
                               at_step=at_step, always=always)
        return engine.scheduler


class FaultyTokenizer:
    """A tokenizer whose ``decode`` raises ``InjectedFault`` at its ``at_call``-th call (and after, if ``always``).

    Everything else is the wrapped tokenizer's. ``calls`` counts decodes, ``faults`` the ones that raised.
    """

    def __init__(self, tokenizer, at_call: int = 0, always: bool = False) -> None:
        if at_call < 0:
            raise ValueError(f"at_call ({at_call}) must be >= 0")
        self.tokenizer, self.at_call, self.always = tokenizer, at_call, always
        self.calls = 0
        self.faults = 0

    def decode(self, ids, *args, **kwargs) -> str:
        call = self.calls
        self.calls += 1
        if call == self.at_call or (self.always and call > self.at_call):
            self.faults += 1
            raise InjectedFault(f"injected detokenizer fault at decode call {call} (token ids {list(ids)[:8]})")
        return self.tokenizer.decode(ids, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


__all__ = ["FAULTS", "FaultyExecutor", "FaultyScheduler", "FaultyTokenizer", "InjectedFault"]


def tiny_engine(fault: str | None = None, at_step: int = 2, max_seqs: int = 4, **fault_options):
    """The tests' tiny-Llama engine (one torch thread), with `fault` at `at_step` when asked: what an engine's own
    process builds (`AsyncEngine.in_process`), so a module-level function, picklable by name."""
    import kvlab
    from kvlab.serving import Engine, SchedulerConfig

    torch.set_num_threads(1)
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")
    executor = FaultyExecutor(model, fault, at_step, **fault_options) if fault else None
    return Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=128, max_waiting=64)), executor=executor)
