"""Sequence: one request inside the engine — its tokens, how many have KV computed, its blocks, its state."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, get_args

import torch

from kvlab.clocks import RequestRecord
from kvlab.sampling import check_sampling


# Why a request ended: it completed ("length": max_new_tokens reached, "stop": a stop token), was rejected
# ("queue_full", "prompt_too_long"), aborted ("cancelled") or failed ("engine_error"); OpenAI's and vLLM's names
# for the first two.
FinishReason = Literal["length", "stop", "queue_full", "prompt_too_long", "cancelled", "engine_error"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)
COMPLETED: tuple[FinishReason, ...] = ("length", "stop")  # the reasons of a request that completed


class SequenceStatus(Enum):
    """Where a sequence is: queued, in the running batch, or done (vLLM's names, trimmed)."""

    WAITING = "waiting"  # in the queue: not admitted yet, or preempted and waiting to be recomputed
    RUNNING = "running"  # admitted: holds KV blocks and takes part in steps
    FINISHED = "finished"  # completed: hit max_new_tokens or a stop token
    FAILED = "failed"  # rejected (queue_full, prompt_too_long) or aborted (cancelled)


@dataclass(frozen=True)
class SamplingParams:
    """How a sequence picks its next token: greedy by default, or seeded sampling with a temperature.

    ``stop_token_ids`` end the sequence early (finish_reason "stop"); with none given a request
    always produces exactly ``max_new_tokens`` tokens (vLLM bench's ``ignore_eos``).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None  # None: derived from the engine's seed and the request id
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sequence:
    """The engine's view of one request.

    ``token_ids`` holds the prompt followed by every token generated so far. KV has been computed for the first
    ``num_computed_tokens`` of them; a step computes the next chunk, and when it reaches the end of ``token_ids`` a new
    token is sampled and appended. Decoding is the case where exactly one token (the newest) is left to compute.
    Preemption by recompute resets ``num_computed_tokens`` to 0 and keeps ``token_ids``: the prompt and the tokens
    already streamed are prefilled again on re-admission.
    """

    def __init__(self, request_id: int | str, prompt_token_ids: list[int], max_new_tokens: int,
                 sampling: SamplingParams, record: RequestRecord, arrival_s: float) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: the prompt is empty; give at least one token id")
        if max_new_tokens < 1:
            raise ValueError(f"request {request_id}: max_new_tokens must be >= 1, got {max_new_tokens}")
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_new_tokens = max_new_tokens
        self.sampling, self.record = sampling, record
        self.arrival_s = arrival_s  # when the engine received it (starts the static batch's wait)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V sit in this sequence's blocks
        self.num_cached_tokens = 0  # of those, found in the prefix cache at the last admission
        self.block_table: list[int] = []  # physical block ids, in token order
        self.num_preemptions = 0
        # Prefix-cache bookkeeping of the BlockManager: chain hashes of the full blocks seen so far
        # (tokens never change, so they stay valid across preemption), and how many blocks of the
        # current block table were already offered to the cache.
        self.block_hashes: list[int] = []
        self.num_registered_blocks = 0
        self.finish_reason: FinishReason | None = None
        self.generator: torch.Generator | None = None  # set by the engine for seeded sampling

    # -- lengths -----------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Only the newest sampled token is left to compute: a decode step (one query)."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1

    # -- state changes -------------------------------------------------------------------------
    def append_token(self, token_id: int) -> None:
        """Add a sampled token; finish if it is a stop token or the output budget is spent."""
        self.token_ids.append(token_id)
        if token_id in self.sampling.stop_token_ids:
            self.finish_reason = "stop"
        elif self.num_output_tokens >= self.max_new_tokens:
            self.finish_reason = "length"

    @property
    def is_finished(self) -> bool:
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.FAILED)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.request_id}, {self.status.value}, tokens={self.num_tokens} "
                f"(prompt {self.num_prompt_tokens}), computed={self.num_computed_tokens}, "
                f"blocks={self.block_table})")
