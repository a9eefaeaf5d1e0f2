"""Max-length reservation: the KV allocation paging replaced, run on the same engine for a side-by-side.

Before paged attention, a serving system gave each admitted request one contiguous KV region
big enough for the longest sequence it might become (``max_model_len`` tokens, or at best its
prompt + max_new_tokens), reserved at admission and held until it finished. Most of that
region holds nothing most of the time: the request has not grown into it yet, or never will.

``ReservingBlockManager`` reproduces that policy with blocks: at admission it takes every block the reservation needs,
at once, and the sequence never needs another. Everything else (the scheduler, the executor, the clocks) is the paged
engine's, so the only difference measured is the allocation rule. ``ReservationEngine`` is an ``Engine`` that uses it.
Prefix caching is off: a reserved region is private.
"""
from __future__ import annotations

from kvlab.serving.block_manager import BlockManager
from kvlab.model.config import ModelConfig
from kvlab.model.decoder import Decoder
from kvlab.serving.config import EngineSpec
from kvlab.serving.cost_model import CostModel
from kvlab.serving.engine import Engine
from kvlab.serving.sequence import Sequence

RESERVE_MODES = ("max_model_len", "request")


class ReservingBlockManager(BlockManager):
    """A BlockManager that allocates a sequence's whole reservation at admission.

    ``reserve="max_model_len"``: every sequence reserves ``max_model_len`` tokens (what a server must assume when it
    cannot know the final length). ``"request"``: prompt + max_new_tokens, the most this request may use.
    """

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, reserve: str = "max_model_len") -> None:
        if reserve not in RESERVE_MODES:
            raise ValueError(f"unknown reserve mode {reserve!r}; choose one of {', '.join(RESERVE_MODES)}")
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
        self.max_model_len, self.reserve = max_model_len, reserve

    def blocks_to_admit(self, seq: Sequence) -> int:
        """The whole reservation, taken at admission; ``append_slot`` then never needs a new block."""
        reserved = self.max_model_len if self.reserve == "max_model_len" else seq.num_prompt_tokens + seq.max_new_tokens
        return self.blocks_for(seq, max(reserved, seq.num_tokens))


class ReservationEngine(Engine):
    """An Engine whose KV pool reserves per request (``reserve``: one of RESERVE_MODES) instead of paging."""

    def __init__(self, model: Decoder | ModelConfig | CostModel, spec: EngineSpec | None = None, *,
                 reserve: str = "max_model_len", **kwargs) -> None:
        self.reserve = reserve
        spec = (spec or EngineSpec()).replace(enable_prefix_caching=False)
        super().__init__(model, spec, block_manager_factory=self.reserving_block_manager, **kwargs)

    def reserving_block_manager(self) -> ReservingBlockManager:
        """The engine's allocator: each request's whole reservation at admission."""
        return ReservingBlockManager(self.num_blocks, self.block_size, self.max_model_len, self.reserve)

    def settings(self) -> dict:
        return {**super().settings(), "kv_allocation": f"reserve {self.reserve}"}


__all__ = ["RESERVE_MODES", "ReservationEngine", "ReservingBlockManager"]
