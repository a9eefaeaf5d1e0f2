"""Scheduler: which sequences run in each step, how many tokens each — static or continuous batching."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Literal, get_args

from kvlab.serving.block_manager import BlockManager
from kvlab.serving.sequence import FinishReason, Sequence, SequenceStatus

Policy = Literal["continuous", "static"]  # admit whenever a slot frees, or only when the whole batch has finished
Priority = Literal["decode_first", "prefill_first"]  # who goes first in a step's token budget
POLICIES: tuple[Policy, ...] = get_args(Policy)
PRIORITIES: tuple[Priority, ...] = get_args(Priority)


MAX_BATCH_TOKENS = 512  # tokens computed per step by default: a whole 512-token prompt fits in one step


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduling rules (vLLM's names where they exist).

    - ``policy``: "continuous" rebuilds the batch every step (Orca's iteration-level scheduling); "static" forms a batch
      from the queue and runs it until its longest member finishes, admitting nobody meanwhile (optionally waiting up to
      ``batch_wait_s`` for the batch to fill to ``max_seqs``).
    - ``priority``: "decode_first" lets every running sequence decode, then fills the step's leftover token budget with
      prompt chunks (vLLM with chunked prefill, Sarathi-Serve): steady time between tokens. "prefill_first" gives the
      step to prompts whenever there are any and decodes only in steps with no prompt work (vLLM's original scheduler):
      earlier first tokens, decodes stall while prompts run.
    - ``max_seqs``: sequences admitted at once; ``max_batch_tokens``: tokens computed per step (prompt chunks + one per
      decode); ``chunked_prefill``: split a prompt across steps to fit the budget (else a prompt runs whole, so
      max_batch_tokens must cover max_model_len).
    - ``max_waiting``: queue bound (None: unbounded); a request arriving to a full queue fails with "queue_full".
      ``max_model_len``: prompt + max_new_tokens allowed (None: the model's context); a longer request fails with
      "prompt_too_long".
    """

    policy: Policy = "continuous"
    priority: Priority = "decode_first"
    max_seqs: int = 16
    max_batch_tokens: int = MAX_BATCH_TOKENS
    chunked_prefill: bool = True
    max_waiting: int | None = None
    max_model_len: int | None = None
    batch_wait_s: float = 0.0
    admission: Callable[..., list] | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.priority not in PRIORITIES:
            raise ValueError(f"unknown priority {self.priority!r}; choose one of {', '.join(PRIORITIES)}")
        for name in ("max_seqs", "max_batch_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_batch_tokens < self.max_seqs:
            raise ValueError(f"max_batch_tokens ({self.max_batch_tokens}) < max_seqs ({self.max_seqs}): some running "
                             "sequences could never decode; raise max_batch_tokens or lower max_seqs")
        if self.max_waiting is not None and (not isinstance(self.max_waiting, int) or self.max_waiting < 1):
            raise ValueError(f"max_waiting must be an integer >= 1 or None (unbounded), got {self.max_waiting!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2 or None (the model's context), "
                             f"got {self.max_model_len!r}")
        if not self.batch_wait_s >= 0:
            raise ValueError(f"batch_wait_s must be >= 0 seconds, got {self.batch_wait_s!r}")
        if self.admission is not None:
            if not callable(self.admission):
                raise ValueError(f"admission must be a function admission(waiting, free_blocks, token_budget, "
                                 f"free_slots) -> list, or None for the built-in rule; got {self.admission!r}")
            if self.policy != "continuous" or self.chunked_prefill:
                raise ValueError("an admission rule admits whole prompts under continuous batching: use "
                                 "policy='continuous' and chunked_prefill=False with admission=")

    def check(self, block_manager: BlockManager, max_model_len: int) -> None:
        """Checks that need the KV pool's block size and the resolved context length."""
        block_size = block_manager.block_size
        if self.max_batch_tokens < block_size:
            raise ValueError(f"max_batch_tokens ({self.max_batch_tokens}) < block_size ({block_size}); "
                             "raise max_batch_tokens or lower block_size")
        if not self.chunked_prefill and self.max_batch_tokens < max_model_len:
            raise ValueError(
                f"without chunked prefill a prompt runs in one step, but max_batch_tokens ({self.max_batch_tokens}) "
                f"< max_model_len ({max_model_len}); raise max_batch_tokens, lower max_model_len, "
                "or set chunked_prefill=True")


@dataclass(frozen=True)
class StepShape:
    """What a step computes, in the terms a cost model prices.

    A prefill sequence runs several new tokens (a prompt chunk, or a recompute after
    preemption) or its very first token; a decode sequence runs exactly its newest token.
    KV tokens read: every scheduled sequence attends over its whole context after the step's write.
    """

    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    num_decode_seqs: int = 0
    prefill_kv_tokens: int = 0  # sum of context lengths of the prefill sequences
    decode_kv_tokens: int = 0  # sum of context lengths of the decode sequences

    @property
    def num_tokens(self) -> int:
        """Tokens through the model this step (rows of every matrix product)."""
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    @property
    def kv_tokens_read(self) -> int:
        return self.prefill_kv_tokens + self.decode_kv_tokens

    @classmethod
    def of(cls, seqs: list[Sequence], num_new_tokens: list[int]) -> "StepShape":
        """The shape of running ``num_new_tokens[i]`` tokens of ``seqs[i]`` (before the step's bookkeeping)."""
        pt = ps = ds = pkv = dkv = 0
        for seq, n in zip(seqs, num_new_tokens):
            ctx = seq.num_computed_tokens + n
            if seq.is_decoding and n == 1:
                ds, dkv = ds + 1, dkv + ctx
            else:
                pt, ps, pkv = pt + n, ps + 1, pkv + ctx
        return cls(pt, ps, ds, pkv, dkv)


@dataclass(frozen=True)
class WaitingRequest:
    """What an admission rule (``SchedulerConfig.admission``) sees of one waiting request."""

    request_id: int | str
    tokens: int  # tokens it computes when it joins: its prompt (after a preemption, plus its output so far)
    blocks: int  # free KV blocks it takes when it joins (prefix-cache hits on used blocks cost none)
    arrival_s: float  # when the engine received it
    preempted: bool  # back in the queue after a preemption (it goes to the front)


class AdmissionError(ValueError):
    """An admission rule picked what this step cannot hold (more blocks, tokens or slots than are free)."""


@dataclass
class SchedulerOutput:
    """One step's plan: run ``num_new_tokens[i]`` tokens of ``seqs[i]``, using its ``block_table``.

    ``do_sample[i]`` is True when the step reaches the end of seqs[i]'s tokens, so a next token
    is sampled (a prompt chunk that stops short produces none). ``wake_at_s`` is set on an
    empty step when the scheduler is deliberately waiting (a static batch filling up).
    """

    step: int
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    do_sample: list[bool] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    shape: StepShape = field(default_factory=StepShape)
    num_running: int = 0
    num_waiting: int = 0
    wake_at_s: float | None = None

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    """Keeps the ``waiting`` and ``running`` queues and builds each step's batch.

    Admission takes waiting sequences first come, first served, only when the block manager can give them blocks for all
    their tokens (a prefix-cache hit counts as computed); a rule of your own (``SchedulerConfig.admission``) can take
    its place. When a decoding sequence needs a new block and none is free, the most recently admitted running sequence
    is preempted by recompute: its blocks are freed and it returns to the front of the queue, to prefill its prompt and
    its tokens so far again on re-admission.
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int) -> None:
        config.check(block_manager, max_model_len)
        self.config, self.block_manager, self.max_model_len = config, block_manager, max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last one is preempted first
        self.static_batch: set = set()  # request ids of the current static batch
        self.num_steps = self.num_preemptions = 0

    # -- queue entry and exit ----------------------------------------------------------------
    def add_sequence(self, seq: Sequence) -> FinishReason | None:
        """Queue ``seq``, or return why it is rejected ("prompt_too_long", "queue_full")."""
        reason: FinishReason
        if seq.num_prompt_tokens + seq.max_new_tokens > self.max_model_len:
            reason = "prompt_too_long"
        elif self.config.max_waiting is not None and len(self.waiting) >= self.config.max_waiting:
            reason = "queue_full"
        else:
            self.waiting.append(seq)
            return None
        seq.status, seq.finish_reason = SequenceStatus.FAILED, reason
        return reason

    def abort(self, request_id) -> Sequence | None:
        """Remove a waiting or running sequence, freeing its blocks; None if it is not here."""
        seq = next((s for queue in (self.waiting, self.running) for s in queue if s.request_id == request_id), None)
        if seq is not None:
            self.fail(seq, "cancelled")
        return seq

    def fail(self, seq: Sequence, reason: FinishReason) -> None:
        """End ``seq`` with ``reason`` wherever it is (waiting, running, or half-way between after a fault), freeing its blocks."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self.block_manager.free(seq)
        self.static_batch.discard(seq.request_id)
        seq.status, seq.finish_reason = SequenceStatus.FAILED, reason

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- building a step ---------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide this step's batch: admissions, preemptions, and tokens per sequence."""
        cfg = self.config
        out = SchedulerOutput(step=self.num_steps)
        budget = cfg.max_batch_tokens
        if cfg.policy == "static" and not self.static_batch:
            out.wake_at_s = self._form_static_batch(now, out)
        if cfg.priority == "decode_first":
            budget = self._schedule_decodes(out, budget)
            budget = self._schedule_running_prefills(out, budget)
            if not out.preempted:  # blocks just ran out: admitting now would only thrash
                budget = self._admit(out, budget)
        else:
            budget = self._schedule_running_prefills(out, budget)
            budget = self._admit(out, budget)
            if not out.seqs:  # no prompt work this step: let the running sequences decode
                budget = self._schedule_decodes(out, budget)
        out.shape = StepShape.of(out.seqs, out.num_new_tokens)
        out.do_sample = [s.num_computed_tokens + n == s.num_tokens for s, n in zip(out.seqs, out.num_new_tokens)]
        out.num_running, out.num_waiting = len(self.running), len(self.waiting)
        if out.seqs:
            self.num_steps += 1
        return out

    def _add(self, out: SchedulerOutput, seq: Sequence, n: int) -> None:
        out.seqs.append(seq)
        out.num_new_tokens.append(n)

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        """One token for each decoding sequence, in admission order, preempting the newest for blocks."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if not seq.is_decoding:
                i += 1
                continue
            while not self.block_manager.can_append(seq):
                victim = self.running.pop()  # never scheduled yet: everything before index i is
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:  # preempted itself: nothing after it remains
                break
            self.block_manager.append_slot(seq)
            self._add(out, seq, 1)
            budget -= 1
            i += 1
        return budget

    def _schedule_running_prefills(self, out: SchedulerOutput, budget: int) -> int:
        """Continue prompts (or recomputes) of admitted sequences, chunked to the budget."""
        for seq in self.running:
            if budget <= 0:
                break
            if seq.is_decoding:
                continue
            n = seq.num_uncomputed_tokens
            if n > budget:
                if not self.config.chunked_prefill:
                    continue
                n = budget
            self._add(out, seq, n)
            budget -= n
        return budget

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting sequences while the budget, max_seqs and free blocks allow (first come, first served)."""
        if self.config.admission is not None:
            return self._admit_by_rule(out, budget, self.config.admission)
        static = self.config.policy == "static"
        while self.waiting and budget > 0 and len(self.running) < self.config.max_seqs:
            seq = self.waiting[0]
            if static and seq.request_id not in self.static_batch:
                break  # a static batch readmits only its own preempted members
            cached = len(self.block_manager.match_prefix(seq)) * self.block_manager.block_size
            n = seq.num_tokens - cached
            if n > budget and not self.config.chunked_prefill:
                break
            if not self.block_manager.can_allocate(seq):
                break
            self.waiting.popleft()
            self._start_running(seq, out)
            n = min(seq.num_uncomputed_tokens, budget)
            self._add(out, seq, n)
            budget -= n
        return budget

    def _admit_by_rule(self, out: SchedulerOutput, budget: int, admission: Callable[..., list]) -> int:
        """Admit what ``config.admission`` picks, once the pick is checked against this step's limits."""
        if not self.waiting:
            return budget
        bm, views = self.block_manager, []  # the queue as the rule sees it, oldest first, before anyone joins
        for seq in self.waiting:
            hits = bm.match_prefix(seq)
            hits_in_free = sum(1 for b in hits if bm.blocks[b].ref_count == 0)
            views.append(WaitingRequest(seq.request_id, seq.num_tokens - len(hits) * bm.block_size,
                                        bm.blocks_for(seq) - len(hits) + hits_in_free,
                                        seq.arrival_s, seq.num_preemptions > 0))
        free_blocks, free_slots = self.block_manager.num_free_blocks, self.config.max_seqs - len(self.running)
        picked = admission(list(views), free_blocks, budget, free_slots)
        ids = [getattr(p, "request_id", p) for p in (picked or [])]
        by_id = {v.request_id: v for v in views}
        unknown = [i for i in ids if i not in by_id]
        if unknown or len(set(ids)) != len(ids):
            raise AdmissionError(f"the admission rule returned {ids}: pick each request at most once, among the "
                                 f"waiting ones {list(by_id)}")
        tokens, blocks = sum(by_id[i].tokens for i in ids), sum(by_id[i].blocks for i in ids)
        if len(ids) > free_slots or tokens > budget or blocks > free_blocks:
            raise AdmissionError(f"the admission rule admitted {ids}: {len(ids)} sequences, {tokens} tokens and "
                                 f"{blocks} blocks, but this step has {free_slots} free slots, {budget} tokens of "
                                 f"budget and {free_blocks} free blocks")
        for i in ids:
            seq = next(s for s in self.waiting if s.request_id == i)
            if not self.block_manager.can_allocate(seq):  # an earlier pick evicted a prefix this one counted on
                raise AdmissionError(f"request {i} no longer fits in the free blocks once the requests admitted "
                                     "before it took theirs")
            self.waiting.remove(seq)
            self._start_running(seq, out)
            self._add(out, seq, seq.num_uncomputed_tokens)
            budget -= seq.num_uncomputed_tokens
        return budget

    def _form_static_batch(self, now: float, out: SchedulerOutput) -> float | None:
        """Take up to max_seqs queued sequences as the next static batch (or wait for more to come)."""
        cfg = self.config
        if not self.waiting:
            return None
        if len(self.waiting) < cfg.max_seqs and now < self.waiting[0].arrival_s + cfg.batch_wait_s:
            return self.waiting[0].arrival_s + cfg.batch_wait_s  # wait for the batch to fill
        while self.waiting and len(self.running) < cfg.max_seqs and self.block_manager.can_allocate(self.waiting[0]):
            seq = self.waiting.popleft()
            self._start_running(seq, out)
            self.static_batch.add(seq.request_id)
        return None

    def _start_running(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.block_manager.allocate(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        out.admitted.append(seq)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Preemption by recompute: free the blocks, forget the computed KV, back to the queue's front."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    # -- after the step ----------------------------------------------------------------------
    def postprocess(self, out: SchedulerOutput, token_ids: list[int | None]) -> list[Sequence]:
        """Account the computed tokens, append sampled ones, finish and free the sequences that are done.

        Returns the sequences that got a new token (their newest is ``seq.token_ids[-1]``;
        ``seq.is_finished`` says whether it was their last).
        """
        got_token, finished = [], False
        for seq, n, sample, token in zip(out.seqs, out.num_new_tokens, out.do_sample, token_ids):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
            if not sample:
                continue
            if token is None:
                raise RuntimeError(f"the executor sampled no token for request {seq.request_id}")
            seq.append_token(int(token))
            got_token.append(seq)
            if seq.finish_reason is not None:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.free(seq)
                self.static_batch.discard(seq.request_id)
                finished = True
        if finished:
            self.running = [s for s in self.running if s.status is SequenceStatus.RUNNING]
        return got_token
