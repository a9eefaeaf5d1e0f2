"""OffloadedModelExecutor: the model runner over a paged KV pool kept in a slower tier (an offloaded serving engine).

``Engine(model, executor=OffloadedModelExecutor(model, link_gbps=1.0))`` serves exactly as ``Engine(model)`` does — same
scheduler, same block tables, same tokens — but its KV pool lives in
``kvlab.cache.paged_offloaded.OffloadedPagedKVCache``: every step copies in the blocks its batch attends over and writes
the new tokens back. ``step_log`` keeps, per executed step, the bytes moved each way and the seconds spent copying, to
read beside the engine's trace (join on ``step``).
"""
from __future__ import annotations

import pandas as pd

from kvlab.cache.paged_offloaded import OffloadedPagedKVCache
from kvlab.model.decoder import Decoder
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.executor import ModelExecutor, StepResult
from kvlab.serving.scheduler import SchedulerOutput

STEP_LOG_COLUMNS = ("step", "bytes_read", "bytes_written", "bytes_moved", "copy_s", "link_wait_s")


class OffloadedModelExecutor(ModelExecutor):
    """``ModelExecutor`` whose paged pool is an ``OffloadedPagedKVCache`` (``link_gbps``: None = memory speed)."""

    name = "model_offloaded"
    cache: OffloadedPagedKVCache | None

    def __init__(self, model: Decoder, link_gbps: float | None = None, storage_dir: str | None = None) -> None:
        super().__init__(model)
        self.link_gbps, self.storage_dir = link_gbps, storage_dir
        self.step_log: list[tuple] = []

    def initialize_cache(self, pool: BlockManager) -> None:
        cfg = self.model.config
        if self.cache is not None:
            self.cache.close()
        self.cache = OffloadedPagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype=self.model.dtype,
                                           device=self.model.device, num_blocks=pool.num_blocks,
                                           block_size=pool.block_size,
                                           link_gbps=self.link_gbps, storage_dir=self.storage_dir)
        self.step_log = []

    def execute(self, out: SchedulerOutput) -> StepResult:
        c = self.cache
        if c is None:
            return super().execute(out)  # raises: initialize_cache comes first
        copy0, wait0 = c.copy_s_total, c.link_wait_s_total
        result = super().execute(out)
        self.step_log.append((out.step, c.bytes_read_last_step, c.bytes_written_last_step, c.bytes_moved_last_step,
                              c.copy_s_total - copy0, c.link_wait_s_total - wait0))
        return result

    def step_frame(self) -> pd.DataFrame:
        """One row per executed step: bytes read from the tier, written to it, both, seconds copying and waiting."""
        return pd.DataFrame(self.step_log, columns=list(STEP_LOG_COLUMNS))

    def close(self) -> None:
        """Delete the tier's file (CPU); the executor cannot run afterwards."""
        if self.cache is not None:
            self.cache.close()


__all__ = ["OffloadedModelExecutor", "STEP_LOG_COLUMNS"]
