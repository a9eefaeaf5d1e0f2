"""The runnable experiments behind each lesson; each returns a tidy pandas DataFrame."""
from __future__ import annotations

from .memory import (CACHE_PRECISIONS, GIB, kv_memory_table, max_sequences, measure_cache_memory,
                     resolve_config)
from .progress import Progress, no_progress
from .slowdown import (prompt_ids, run_slowdown, slowdown_config, slowdown_fit, slowdown_model,
                       slowdown_summary, step_curves, tokens_processed)
from ..threads import torch_threads

__all__ = ["CACHE_PRECISIONS", "GIB", "Progress", "kv_memory_table", "max_sequences", "measure_cache_memory",
           "no_progress", "prompt_ids", "resolve_config", "run_slowdown", "slowdown_config",
           "slowdown_fit", "slowdown_model", "slowdown_summary", "step_curves", "tokens_processed", "torch_threads"]
