"""Continuous batching over paged KV memory, in vLLM's vocabulary: sequence, block manager, scheduler, executor, engine."""
from __future__ import annotations

# Read in that order: sequence.py -> block_manager.py -> scheduler.py -> executor.py -> config.py -> engine.py.
# The paged KV pool itself is kvlab.cache.paged.PagedKVCache.

from kvlab.cache.paged import PagedAttentionMetadata, PagedKVCache
from kvlab.serving.block_manager import Block, BlockManager, BlockStats
from kvlab.serving.config import EngineSpec
from kvlab.serving.engine import ENGINE_ERROR, MODEL_FAILED, TRACE_COLUMNS, Engine, RequestOutput, StepFailed, StepRecord
from kvlab.serving.executor import Executor, ModelExecutor, StepResult
from kvlab.serving.scheduler import (PRIORITIES, POLICIES, AdmissionError, Scheduler, SchedulerConfig, SchedulerOutput, StepShape,
                        WaitingRequest)
from kvlab.serving.sequence import SamplingParams, Sequence, SequenceStatus

__all__ = [
    "ENGINE_ERROR", "MODEL_FAILED", "AdmissionError", "Block", "BlockManager", "BlockStats", "Engine", "EngineSpec", "Executor", "ModelExecutor", "POLICIES",
    "PRIORITIES", "PagedAttentionMetadata", "PagedKVCache", "RequestOutput", "SamplingParams", "Scheduler",
    "SchedulerConfig", "SchedulerOutput", "Sequence", "SequenceStatus", "StepFailed", "StepRecord", "StepResult", "StepShape",
    "TRACE_COLUMNS", "WaitingRequest",
]
