"""kvlab.serving: continuous batching over paged KV memory, in vLLM's vocabulary.

sequence.py (Sequence, SamplingParams) -> block_manager.py (BlockManager) -> scheduler.py
(SchedulerConfig, Scheduler, SchedulerOutput, StepShape) -> executor.py (Executor,
ModelExecutor) -> engine.py (Engine). The paged KV pool itself is kvlab.cache.paged.PagedKVCache.
"""
from __future__ import annotations

from ..cache.paged import PagedAttentionMetadata, PagedKVCache
from .block_manager import Block, BlockManager, BlockStats, bytes_per_block, num_blocks_for_budget
from .engine import TRACE_COLUMNS, Engine, RequestOutput
from .executor import Executor, ModelExecutor, StepResult
from .scheduler import PRIORITIES, POLICIES, Scheduler, SchedulerConfig, SchedulerOutput, StepShape
from .sequence import SamplingParams, Sequence, SequenceStatus

__all__ = [
    "Block", "BlockManager", "BlockStats", "Engine", "Executor", "ModelExecutor", "POLICIES", "PRIORITIES",
    "PagedAttentionMetadata", "PagedKVCache", "RequestOutput", "SamplingParams", "Scheduler", "SchedulerConfig",
    "SchedulerOutput", "Sequence", "SequenceStatus", "StepResult", "StepShape", "TRACE_COLUMNS",
    "bytes_per_block", "num_blocks_for_budget",
]
