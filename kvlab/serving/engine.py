"""Engine: requests in, tokens out — the serving loop around the scheduler, block manager and executor."""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, cast

import numpy as np
import pandas as pd
import torch

from kvlab.clocks import RequestRecord
from kvlab.model.config import ModelConfig
from kvlab.model.decoder import Decoder
from kvlab.sampling import NonFiniteLogits
from kvlab.workload import Request
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.config import EngineSpec
from kvlab.serving.cost_model import CostModel, CostModelExecutor
from kvlab.serving.executor import Executor, ModelExecutor
from kvlab.serving.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from kvlab.serving.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus

CLOCKS = ("wall", "virtual")


class StepRecord(NamedTuple):
    """One executed step, as the engine's trace keeps it: one row of ``trace_frame()``."""

    step: int
    start_s: float  # on the run's clock
    end_s: float
    duration_s: float
    num_tokens: int  # the batch's shape (StepShape): tokens and sequences, prefill and decode
    num_seqs: int
    num_prefill_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    kv_tokens_read: int
    num_running: int  # the queues after the step
    num_waiting: int
    kv_blocks_used: int  # the KV pool after the step
    kv_blocks_free: int
    kv_blocks_cached: int
    kv_tokens_held: int
    num_admitted: int  # what changed in this step
    num_preempted: int
    num_finished: int
    request_ids: list  # per sequence in the batch: its id, tokens fed, and whether it was a decode
    num_new_tokens: list[int]
    is_decode: list[bool]
    preempted_ids: list


TRACE_COLUMNS = StepRecord._fields


@dataclass
class RequestOutput:
    """What one step produced for one request (what a streaming server sends on)."""

    request_id: int | str
    token_id: int | None  # the new token, or None for a request that ended without one
    num_output_tokens: int
    finished: bool
    finish_reason: FinishReason | None
    error: str | None = None  # why, for a request ended by "engine_error"


ENGINE_ERROR: FinishReason = "engine_error"  # the finish reason of a request a failing step (or its own bad logits) ended
MODEL_FAILED = "model"  # StepFailed.where of a step that ran but gave no finite logits for any sequence


class StepFailed(RuntimeError):
    """A step raised; the requests it had to take down ended with "engine_error" and their blocks are free.

    ``outputs``: one finished RequestOutput per request ended (the step's batch; every running
    request if the scheduler itself failed, since its state can no longer be trusted). The
    engine can go on stepping the others. The original exception is ``__cause__``.

    A step that ran but whose logits were NaN or inf for every sequence sampled in it is a failed step too (``where`` is
    ``MODEL_FAILED``): each of its requests already ended on its own, with its own bad row, but a model that yields
    nothing finite is broken, and a server counts such steps with the raising ones (``kvlab.http.engine_loop``). A NaN
    row among finite ones is that request's fault alone, and no failed step.
    """

    def __init__(self, error: BaseException, outputs: list[RequestOutput], where: str) -> None:
        super().__init__(f"the {where} raised {type(error).__name__}: {error}; {len(outputs)} request(s) ended "
                         f"with {ENGINE_ERROR}")
        self.error, self.outputs, self.where = error, outputs, where


def derive_seed(seed: int, request_id) -> int:
    """A per-request seed from the engine's seed: runs repeat exactly, requests differ."""
    return int(np.random.SeedSequence([seed, zlib.crc32(str(request_id).encode())]).generate_state(1)[0])


class Engine:
    """Continuous (or static) batching of many requests over one model and one paged KV pool.

    ``Engine(model, spec)`` runs the real decoder (``ModelExecutor``); ``Engine(cost_model, spec)`` runs the simulator,
    whose steps a ``CostModel`` prices with no weights at all; ``Engine(config, spec, executor=...)`` runs any other
    executor. ``spec`` (an ``EngineSpec``, default ``EngineSpec()``) holds the pool, the scheduler, the seed and how the
    model's steps run. The KV pool holds ``spec.kv_budget_bytes`` // (block_size x config.kv_bytes_per_token) blocks; it
    must hold at least one request of ``max_model_len`` tokens (default budget: ``max_seqs`` of them, so nothing is ever
    preempted).
    ``block_manager_factory()`` builds the pool's allocator (from the engine's ``num_blocks``, ``block_size`` and
    ``max_model_len``) at every reset: by default the paged ``BlockManager``; ``ReservationEngine`` passes one that
    reserves per request.

    Every request gets a ``RequestRecord`` stamped on the engine's clock in seconds since the run started: arrival
    (scheduled), hand-over to the engine (sent), first admission, every token, and the end (completed, or failed with a
    reason). ``trace_frame()`` has one row per step.
    """

    def __init__(self, model: Decoder | ModelConfig | CostModel, spec: EngineSpec | None = None, *,
                 executor: Executor | None = None, sampling: SamplingParams | None = None,
                 block_manager_factory: Callable[[], BlockManager] | None = None) -> None:
        spec = EngineSpec() if spec is None else spec
        if not isinstance(spec, EngineSpec):
            raise TypeError(f"Engine(model, spec): spec takes an EngineSpec, got {type(spec).__name__}")
        self.spec = spec
        self.model: Decoder | None
        kv_dtype = spec.kv_dtype
        if isinstance(model, CostModel):
            if spec.block_size != model.block_size:
                raise ValueError(f"the cost model was calibrated with blocks of {model.block_size} tokens, the spec "
                                 f"asks for {spec.block_size}: use spec.replace(block_size={model.block_size}), or "
                                 f"calibrate again with --block-size {spec.block_size}")
            executor = executor or CostModelExecutor(model)
            model = ModelConfig(**model.config)
        if isinstance(model, Decoder):
            self.model, self.config = model, model.config
            kv_dtype = kv_dtype or model.dtype
        elif isinstance(model, ModelConfig):
            self.model, self.config = None, model
            kv_dtype = kv_dtype or torch.float32
            if executor is None:
                raise ValueError("a ModelConfig has no weights to run: pass a Decoder, a CostModel, or an "
                                 "executor= that prices each step")
        else:
            raise TypeError(f"Engine takes a kvlab Decoder, a CostModel or a ModelConfig, got {type(model).__name__}")
        self.scheduler_config = cfg = spec.scheduler
        block_size = spec.block_size
        context = self.config.max_position_embeddings
        self.max_model_len = cfg.max_model_len or context
        if self.max_model_len > context:
            raise ValueError(f"max_model_len ({self.max_model_len}) exceeds the model's context of {context} "
                             f"positions; lower max_model_len to <= {context}")
        per_block = spec.block_bytes(self.config, kv_dtype)
        blocks_per_request = -(-self.max_model_len // block_size)
        kv_budget_bytes = spec.kv_budget_bytes or cfg.max_seqs * blocks_per_request * per_block  # a given one is >= 1
        num_blocks = spec.num_blocks(self.config, kv_budget_bytes, kv_dtype)
        if num_blocks < blocks_per_request:
            raise ValueError(
                f"kv_budget_bytes={kv_budget_bytes:,} holds {num_blocks} blocks = {num_blocks * block_size} tokens, "
                f"fewer than max_model_len={self.max_model_len}: a request that long could never run. Raise "
                f"kv_budget_bytes to >= {blocks_per_request * per_block:,} or lower max_model_len to "
                f"<= {num_blocks * block_size}")
        self.block_size, self.num_blocks, self.kv_budget_bytes = block_size, num_blocks, kv_budget_bytes
        self.kv_dtype, self.enable_prefix_caching = kv_dtype, spec.enable_prefix_caching
        self.block_manager_factory = block_manager_factory or self.paged_block_manager
        self.sampling = sampling or SamplingParams()
        self.seed = spec.seed
        # a ModelConfig came with an executor; a Decoder's runs it as the spec says
        self.executor = executor or ModelExecutor(cast(Decoder, self.model), spec.compile_sizes, spec.attention,
                                                  spec.compile_mixed)
        self.clock = "wall"
        self.reset()
        self.executor.initialize_cache(self.block_manager)

    # -- state ------------------------------------------------------------------------------
    def paged_block_manager(self) -> BlockManager:
        """The default allocator: blocks taken as sequences grow, prefix caching as the engine was asked."""
        return BlockManager(self.num_blocks, self.block_size, self.enable_prefix_caching)

    def reset(self) -> None:
        """Forget every request, the prefix cache and the trace; restart the clock at 0."""
        self.block_manager = self.block_manager_factory()
        self.scheduler = Scheduler(self.scheduler_config, self.block_manager, self.max_model_len)
        self.sequences: dict = {}  # request_id -> Sequence
        self.records: dict = {}  # request_id -> RequestRecord
        self.trace: list[StepRecord] = []  # one per executed step
        self._t0 = time.perf_counter()
        self._virtual_now = 0.0

    @property
    def clock_origin(self) -> float:
        """The ``time.perf_counter()`` reading the wall clock counts from."""
        return self._t0

    def share_clock(self, origin: float) -> None:
        """Count wall-clock time from ``origin``: an engine in another process keeps its front end's clock."""
        self._t0 = origin

    def now(self) -> float:
        """Seconds since the run started, on the engine's clock (wall or virtual)."""
        return self._virtual_now if self.clock == "virtual" else time.perf_counter() - self._t0

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- requests in --------------------------------------------------------------------------
    def add_request(self, request: Request, sampling: SamplingParams | None = None,
                    now: float | None = None) -> RequestRecord:
        """Hand a request to the engine; it is queued, or fails at once with a reason.

        ``request.arrival_s`` is its scheduled arrival on the engine's clock. Without
        ``request.prompt`` token ids, a seeded random prompt of ``prompt_tokens`` ids is used.
        """
        if request.request_id in self.records:
            raise ValueError(f"request id {request.request_id!r} was already added; request ids must be unique")
        now = self.now() if now is None else now
        sampling = sampling or self.sampling
        record = RequestRecord.from_request(request, sent_s=now)
        record.extra.update(cached_tokens=0, preemptions=0, finish_reason=None)
        prompt = self._prompt_ids(request)
        seq = Sequence(request.request_id, prompt, request.max_new_tokens, sampling, record, arrival_s=now)
        if not sampling.greedy:
            seed = sampling.seed if sampling.seed is not None else derive_seed(self.seed, request.request_id)
            seq.generator = torch.Generator().manual_seed(seed)
        self.sequences[request.request_id], self.records[request.request_id] = seq, record
        reason = self.scheduler.add_sequence(seq)
        if reason is not None:
            record.fail(now, reason)
            record.extra["finish_reason"] = reason
        return record

    def _prompt_ids(self, request: Request) -> list[int]:
        vocab = self.config.vocab_size
        if request.prompt is None:
            rng = np.random.default_rng([self.seed, zlib.crc32(str(request.request_id).encode())])
            return rng.integers(0, vocab, size=request.prompt_tokens).tolist()
        bad = [t for t in request.prompt if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"request {request.request_id}: token id {bad[0]} is outside the vocabulary [0, {vocab}); "
                             f"build the workload with vocab_size={vocab}")
        return [int(t) for t in request.prompt]

    def abort(self, request_id) -> bool:
        """Cancel a waiting or running request, freeing its blocks (status failed, reason "cancelled")."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        seq.record.fail(self.now(), "cancelled")
        seq.record.extra["finish_reason"] = "cancelled"
        return True

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, execute and account one step; returns what each request got from it."""
        return self._step()[0]

    def _step(self) -> tuple[list[RequestOutput], SchedulerOutput]:
        start = self.now()
        try:
            out = self.scheduler.schedule(start)
        except Exception as e:  # half-built batch: blocks may be taken by sequences in no queue
            raise self._fail_step(e, None, "scheduler") from e
        for seq in out.admitted:
            if seq.record.admitted_s is None:
                seq.record.extra["cached_tokens"] = seq.num_cached_tokens
            seq.record.admit(start)
        for seq in out.preempted:  # back in the queue; to its client the request is still in progress
            seq.record.extra["preemptions"] = seq.num_preemptions
        if out.is_empty:
            return [], out
        try:
            result = self.executor.execute(out)
        except Exception as e:  # out of memory, a kernel error...: this step's batch is lost, the rest goes on
            raise self._fail_step(e, out, "executor") from e
        if self.clock == "virtual":
            self._virtual_now = start + result.duration_s
        end = self.now()
        outputs = [self._end(out.seqs[i], why, end) for i, why in (result.failed or {}).items()]
        try:
            got_token = self.scheduler.postprocess(out, result.token_ids)
        except Exception as e:
            raise self._fail_step(e, out, "postprocess") from e
        for seq in got_token:
            seq.record.token(end)
            if seq.is_finished:
                seq.record.finish(end)
                seq.record.extra["finish_reason"] = seq.finish_reason
            outputs.append(RequestOutput(seq.request_id, seq.token_ids[-1], seq.num_output_tokens,
                                         seq.is_finished, seq.finish_reason if seq.is_finished else None))
        self._record_step(out, start, end, sum(o.finished for o in outputs))
        sampled = sum(out.do_sample)
        if sampled and len(result.nonfinite) == sampled:  # no finite logits at all: the model failed, not a request
            raise StepFailed(NonFiniteLogits(list(range(sampled))), outputs, MODEL_FAILED)
        return outputs, out

    def fail(self, request_id, why: str) -> RequestOutput | None:
        """End a waiting or running request with "engine_error" (``why`` kept with it), freeing its blocks."""
        seq = self.sequences.get(request_id)
        if seq is None or seq.is_finished:
            return None
        return self._end(seq, why, self.now())

    def _end(self, seq: Sequence, why: str, now: float) -> RequestOutput:
        """Fail one request with "engine_error" (its blocks freed); what its client is told."""
        self.scheduler.fail(seq, ENGINE_ERROR)
        seq.record.fail(now, ENGINE_ERROR)
        seq.record.extra.update(finish_reason=ENGINE_ERROR, error=why)
        return RequestOutput(seq.request_id, None, seq.num_output_tokens, True, ENGINE_ERROR, why)

    def _fail_step(self, error: Exception, out: SchedulerOutput | None, where: str) -> StepFailed:
        """End what a failed step takes down and leave the pool consistent; the StepFailed to raise."""
        why = f"{type(error).__name__} in the {where}: {error}"
        if out is not None:
            victims = [s for s in out.seqs if s.status is SequenceStatus.RUNNING]
        else:  # every sequence not safely queued: running, or popped from the queue when it failed
            queued = {id(s) for s in self.scheduler.waiting}
            victims = [s for s in self.sequences.values() if not s.is_finished and id(s) not in queued]
        now = self.now()
        outputs = [self._end(seq, why, now) for seq in victims]
        if not self.scheduler.running and self.block_manager.stats().used:
            # blocks held by no running sequence (a half-done allocation): start the pool afresh
            self.block_manager = self.block_manager_factory()
            self.scheduler.block_manager = self.block_manager
            for seq in self.scheduler.waiting:
                seq.block_table, seq.num_registered_blocks = [], 0
        return StepFailed(error, outputs, where)

    def _record_step(self, out: SchedulerOutput, start: float, end: float, num_finished: int) -> None:
        stats = self.block_manager.stats()
        held = self.block_manager.num_tokens_held(self.scheduler.running)
        self.executor.set_kv_usage(held, stats.used)
        s = out.shape
        self.trace.append(StepRecord(
            step=out.step, start_s=start, end_s=end, duration_s=end - start, num_tokens=s.num_tokens,
            num_seqs=s.num_seqs, num_prefill_tokens=s.num_prefill_tokens, num_prefill_seqs=s.num_prefill_seqs,
            num_decode_seqs=s.num_decode_seqs, kv_tokens_read=s.kv_tokens_read,
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=stats.used, kv_blocks_free=stats.free, kv_blocks_cached=stats.cached, kv_tokens_held=held,
            num_admitted=len(out.admitted), num_preempted=len(out.preempted), num_finished=num_finished,
            request_ids=[q.request_id for q in out.seqs], num_new_tokens=list(out.num_new_tokens),
            is_decode=[q.is_decoding and n == 1 for q, n in zip(out.seqs, out.num_new_tokens)],
            preempted_ids=[q.request_id for q in out.preempted],
        ))

    # -- a whole workload -------------------------------------------------------------------
    def run(self, requests: Iterable[Request], clock: str = "wall", sampling: SamplingParams | None = None,
            progress: Callable[[int, int], None] | None = None) -> list[RequestRecord]:
        """Release each request at its ``arrival_s`` and serve until all have ended; one record per request.

        ``clock="wall"``: real time (time.perf_counter), sleeping until the next arrival when idle. ``clock="virtual"``:
        time advances only by the executor's step durations (and jumps over idle gaps), so a cost-model executor
        simulates hours in seconds. ``progress(done, total)`` is called whenever a request ends. A step that raises ends
        the run with that error (a learner's admission rule that over-admits, say); the server goes on instead.
        """
        if clock not in CLOCKS:
            raise ValueError(f"unknown clock {clock!r}; choose one of {', '.join(CLOCKS)}")
        requests = list(requests)
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"request id {dup!r} appears more than once; request ids must be unique")
        bad = [r for r in requests if not (isinstance(r.arrival_s, (int, float)) and math.isfinite(r.arrival_s))]
        if bad:
            raise ValueError(f"request {bad[0].request_id}: arrival_s={bad[0].arrival_s!r} must be a finite number")
        self.clock = clock
        self.reset()
        pending = sorted(requests, key=lambda r: r.arrival_s)  # stable: ties keep the given order
        total, done, i = len(pending), 0, 0
        while i < total or self.scheduler.has_unfinished():
            now = self.now()
            while i < total and pending[i].arrival_s <= now:
                if self.add_request(pending[i], sampling, now).status == "failed":
                    done += 1
                    if progress:
                        progress(done, total)
                i += 1
            next_arrival = pending[i].arrival_s if i < total else None
            if not self.scheduler.has_unfinished():
                if next_arrival is not None:
                    self._advance_to(next_arrival)
                continue
            try:
                outputs, out = self._step()
            except StepFailed as failed:  # an offline run serves no one else: it ends with the step's own error
                if failed.where != MODEL_FAILED:
                    raise failed.error from failed
                outputs, out = failed.outputs, None  # its requests ended with their rows; the others go on
            ended = sum(o.finished for o in outputs)
            done += ended
            if ended and progress:
                progress(done, total)
            if out is not None and out.is_empty:
                wake = [t for t in (out.wake_at_s, next_arrival) if t is not None]
                if not wake:
                    raise RuntimeError(f"the scheduler cannot make progress: {len(self.scheduler.waiting)} waiting, "
                                       f"{len(self.scheduler.running)} running, {self.block_manager}")
                self._advance_to(min(wake))
        return [self.records[r.request_id] for r in requests]

    def _advance_to(self, t: float) -> None:
        if self.clock == "virtual":
            self._virtual_now = max(self._virtual_now, t)
        else:
            time.sleep(max(0.0, t - self.now()))

    # -- what happened -------------------------------------------------------------------------
    def trace_frame(self) -> pd.DataFrame:
        """One row per executed step (columns: the fields of StepRecord; times in seconds on the run's clock)."""
        return pd.DataFrame(self.trace, columns=list(TRACE_COLUMNS))

    def step_requests_frame(self) -> pd.DataFrame:
        """One row per (step, request) that ran: phase "prefill" or "decode", tokens, start/end — for Gantt charts."""
        rows = [(r.step, rid, "decode" if dec else "prefill", n, r.start_s, r.end_s)
                for r in self.trace for rid, n, dec in zip(r.request_ids, r.num_new_tokens, r.is_decode)]
        return pd.DataFrame(rows, columns=["step", "request_id", "phase", "num_tokens", "start_s", "end_s"])

    def stats(self) -> dict:
        """Totals of the run so far: steps, preemptions, prefix-cache hits, pool size."""
        b = self.block_manager.stats()
        return {"steps": self.scheduler.num_steps, "preemptions": self.scheduler.num_preemptions,
                "num_blocks": self.num_blocks, "block_size": self.block_size, "kv_budget_bytes": self.kv_budget_bytes,
                "max_model_len": self.max_model_len, "prefix_hit_tokens": b.prefix_hit_tokens,
                "prefix_queries_tokens": b.prefix_queries_tokens, "prefix_hit_rate": b.prefix_hit_rate,
                "kv_blocks_used": b.used, "kv_blocks_cached": b.cached}

    def settings(self) -> dict:
        """Everything that shapes a run, for saving next to results."""
        return {"executor": self.executor.name, "model": self.config.name, "block_size": self.block_size,
                "num_blocks": self.num_blocks, "kv_budget_bytes": self.kv_budget_bytes,
                "kv_dtype": str(self.kv_dtype), "max_model_len": self.max_model_len,
                "enable_prefix_caching": self.enable_prefix_caching, "seed": self.seed, "clock": self.clock,
                **{k: getattr(self.scheduler_config, k) for k in self.scheduler_config.__dataclass_fields__},
                "temperature": self.sampling.temperature}
