"""Admission rules: which waiting requests join the running batch, run in the engine and audited step by step.

The engine's scheduler takes a rule of your own through ``SchedulerConfig(admission=rule)``::

    def rule(waiting, free_blocks, token_budget, free_slots):   # waiting: WaitingRequest views, oldest first
        ...                                                      # each has .tokens and .blocks
        return admitted                                          # some of them, in the order they join

``admission_run(rule)`` serves a small workload (``admission_workload``) with that rule on the virtual clock
(``FixedStepCostExecutor``: exact, the same on every machine) and keeps an ``AdmissionAudit`` of every call: what the
rule saw, what it picked, the first pick that broke a limit (more blocks, tokens or slots than were free), which stops
the run, and the first call whose pick is not the engine's own rule's (``Difference``), which does not. The workload is
made so that each limit binds at some step, and so that a rule that lets short requests overtake a long one keeps the
long one waiting while they pass. ``builtin_admission`` is the engine's own rule written as such a function;
``clocks_table`` puts the four clocks of two runs side by side.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd

from kvlab.model.config import tiny_llama
from kvlab.serving.config import EngineSpec
from kvlab.serving.scheduler import AdmissionError, SchedulerConfig, WaitingRequest
from kvlab.workload import Request
from kvlab.experiments.serving_run import FixedStepCostExecutor, ServingRun, runs_table, serve

Rule = Callable[[list[WaitingRequest], int, int, int], list]

# The exercise's engine: KV blocks of 16 tokens, 8 of them; 4 slots; 64 tokens per step, prompts whole.
BLOCK_SIZE, NUM_BLOCKS, MAX_SEQS, MAX_BATCH_TOKENS, MAX_MODEL_LEN = 16, 8, 4, 64, 64
STEP_S, TOKEN_S = 0.010, 0.0001  # the fixed step cost: 10 ms a step plus 0.1 ms a token
STARVED_AFTER = 4  # requests admitted ahead of a waiting one before it counts as passed over for good


def builtin_admission(waiting: list[WaitingRequest], free_blocks: int, token_budget: int,
                      free_slots: int) -> list[WaitingRequest]:
    """The engine's built-in rule as a function: first come, first served, up to the first request that does not fit."""
    admitted = []
    for request in waiting:  # oldest first
        if free_slots == 0 or request.blocks > free_blocks or request.tokens > token_budget:
            break  # the head waits, and everyone behind it: nobody overtakes, so nobody starves
        admitted.append(request)
        free_slots -= 1
        free_blocks -= request.blocks
        token_budget -= request.tokens
    return admitted


def admission_workload() -> list[Request]:
    """Two mid-size prompts and a long one at t = 0, then a short request every step.

    The two 40-token prompts do not fit one step's 64-token budget together; the 60-token prompt needs 4 of the 8
    blocks, more than are free while the first two run; the short ones (1 block each) always fit somewhere.
    """
    shapes = [(40, 16, 0.0), (40, 8, 0.0), (60, 4, 0.0)]
    shapes += [(10, 6, round(0.005 + 0.010 * i, 6)) for i in range(14)]
    return [Request(i, p, o, t, "admission", prompt=[(7 * i + j) % 300 + 1 for j in range(p)])
            for i, (p, o, t) in enumerate(shapes)]


@dataclass(frozen=True)
class Violation:
    """The first pick that broke a limit: ``kind`` is "blocks", "tokens", "slots", "pick", "idle" or "raised"."""

    kind: str
    call: int  # which call of the rule, from 0
    message: str
    alone_fits: bool = False  # every picked request fit on its own: the sum is what broke the limit


@dataclass(frozen=True)
class Difference:
    """A call where the rule picked other requests than the engine's own rule would have, from the same queue."""

    call: int  # which call of the rule, from 0
    waiting: tuple  # the WaitingRequest views it saw, oldest first
    free_blocks: int
    token_budget: int
    free_slots: int
    expected: list  # request ids the built-in rule admits
    got: list  # request ids the rule admitted


class _Stop(Exception):
    """Raised inside the engine to end a run at the first violation."""


@dataclass
class AdmissionAudit:
    """Wraps a rule: checks every pick against the step's limits and counts who overtook whom."""

    rule: Rule
    calls: int = 0
    violation: Violation | None = None
    passed_over: dict = field(default_factory=dict)  # request id -> requests admitted ahead of it while it waited
    admitted: list = field(default_factory=list)  # request ids in the order they were admitted (first time)
    difference: Difference | None = None  # the first call that picked otherwise than builtin_admission
    max_calls: int = 2000

    def __call__(self, waiting: list[WaitingRequest], free_blocks: int, token_budget: int, free_slots: int) -> list:
        call, self.calls = self.calls, self.calls + 1
        if self.calls > self.max_calls:
            self._stop("idle", call, f"the run did not end within {self.max_calls} calls of your rule")
        try:
            picked = self.rule(list(waiting), free_blocks, token_budget, free_slots)
        except Exception as exc:
            self._stop("raised", call, f"in call {call} your rule raised {type(exc).__name__}: {exc} (with "
                                       f"{len(waiting)} waiting, {free_blocks} free blocks, {token_budget} tokens "
                                       f"of budget, {free_slots} free slots)")
        if picked is None:
            picked = []
        if isinstance(picked, (WaitingRequest, str, int)) or not hasattr(picked, "__iter__"):
            self._stop("pick", call, f"the rule should return a list of waiting requests; it returned {picked!r}")
        picked = list(picked)
        by_id = {w.request_id: w for w in waiting}
        ids = [getattr(p, "request_id", p) for p in picked]
        if any(not isinstance(i, (int, str)) or i not in by_id for i in ids) or len(set(ids)) != len(ids):
            self._stop("pick", call, f"the rule returned {picked!r}: return some of the waiting requests, each at "
                                     "most once")
        chosen = [by_id[i] for i in ids]
        self._check(call, chosen, waiting, free_blocks, token_budget, free_slots)
        expected = [w.request_id for w in builtin_admission(list(waiting), free_blocks, token_budget, free_slots)]
        if self.difference is None and ids != expected:
            self.difference = Difference(call, tuple(waiting), free_blocks, token_budget, free_slots, expected, ids)
        first = {w.request_id for w in waiting if not w.preempted}
        for rank, w in enumerate(waiting):
            if w.request_id not in ids:
                ahead = sum(1 for v in waiting[rank + 1:] if v.request_id in ids)
                self.passed_over[w.request_id] = self.passed_over.get(w.request_id, 0) + ahead
        self.admitted += [i for i in ids if i in first]
        return picked

    def _check(self, call: int, chosen: list[WaitingRequest], waiting: list[WaitingRequest], free_blocks: int,
               token_budget: int, free_slots: int) -> None:
        names = ", ".join(f"request {w.request_id} ({w.tokens} tokens, {w.blocks} blocks)" for w in chosen)
        tokens, blocks = sum(w.tokens for w in chosen), sum(w.blocks for w in chosen)
        if blocks > free_blocks:
            self._stop("blocks", call, f"in call {call} your rule admitted {names}: {blocks} KV blocks, with "
                                       f"{free_blocks} free", alone_fits=all(w.blocks <= free_blocks for w in chosen))
        if tokens > token_budget:
            self._stop("tokens", call, f"in call {call} your rule admitted {names}: {tokens} prompt tokens, with "
                                       f"{token_budget} left in the step's budget",
                       alone_fits=all(w.tokens <= token_budget for w in chosen))
        if len(chosen) > free_slots:
            self._stop("slots", call, f"in call {call} your rule admitted {len(chosen)} requests with "
                                      f"{free_slots} free slots", alone_fits=True)
        head = waiting[0] if waiting else None
        if (not chosen and free_slots == MAX_SEQS and head is not None and head.blocks <= free_blocks
                and head.tokens <= token_budget):
            self._stop("idle", call, f"in call {call} nothing was running and request {head.request_id} fit "
                                     f"({head.tokens} tokens of {token_budget}, {head.blocks} blocks of "
                                     f"{free_blocks}), but your rule admitted nobody")

    def _stop(self, kind: str, call: int, message: str, alone_fits: bool = False) -> None:
        self.violation = Violation(kind, call, message, alone_fits)
        raise _Stop(message)

    def starved(self) -> tuple[Any, int] | None:
        """The request passed over most often, when that is more than ``STARVED_AFTER`` times."""
        rid, n = max(self.passed_over.items(), key=lambda kv: kv[1], default=(None, 0))
        return (rid, n) if n > STARVED_AFTER else None


def admission_run(rule: Rule | None = None, requests: Sequence[Request] | None = None,
                  label: str | None = None) -> tuple[ServingRun | None, AdmissionAudit | None]:
    """Serve ``requests`` (default: ``admission_workload()``) with ``rule`` on the virtual clock.

    Returns the run and the audit of the rule (None for the built-in rule). A pick that breaks a limit stops the run:
    the run is then None and ``audit.violation`` says what happened.
    """
    requests = admission_workload() if requests is None else list(requests)
    audit = None if rule is None else AdmissionAudit(rule)
    config = tiny_llama()
    try:
        sched = SchedulerConfig(policy="continuous", max_seqs=MAX_SEQS, max_batch_tokens=MAX_BATCH_TOKENS,
                                chunked_prefill=False, max_model_len=MAX_MODEL_LEN, admission=audit)
        spec = EngineSpec(block_size=BLOCK_SIZE, enable_prefix_caching=False,
                          scheduler=sched).with_blocks(config, NUM_BLOCKS)
        run = serve(config, requests, spec, label=label or ("built-in rule" if rule is None else "your rule"),
                    clock="virtual", executor=FixedStepCostExecutor(STEP_S, TOKEN_S), threads=None)
    except (_Stop, AdmissionError):
        return None, audit
    except RuntimeError as err:  # the engine could not make progress: someone waits for ever
        if audit is None or "cannot make progress" not in str(err):
            raise
        waiting = sorted(set(r.request_id for r in requests) - set(audit.admitted), key=str)
        audit.violation = Violation("idle", audit.calls, f"the run stopped with requests {waiting} never admitted: "
                                                         "nothing was running and your rule admitted none of them")
        return None, audit
    return run, audit


CLOCK_COLUMNS = {"ttft_p50_s": "TTFT p50", "ttft_p95_s": "TTFT p95", "tpot_p50_s": "TPOT p50",
                 "e2e_p50_s": "E2E p50", "output_tokens_per_s": "output tokens/s"}


def clocks_table(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """The four clocks of each run, one row per run: TTFT, time per output token, E2E (ms), throughput, n."""
    table = runs_table(runs)
    out = pd.DataFrame({"run": table["run"], "n": table["completed"]})
    for col, name in CLOCK_COLUMNS.items():
        out[name if col == "output_tokens_per_s" else f"{name} (ms)"] = (
            table[col].round(1) if col == "output_tokens_per_s" else (table[col] * 1e3).round(1))
    out["steps"] = table["steps"]
    return out
