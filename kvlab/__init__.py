"""kvlab: a hands-on lab about KV caches, batching, and why a fast AI service can keep people waiting."""
from __future__ import annotations

from kvlab.version import __version__

from kvlab.cache import CACHE_NAMES, CacheMemory, KVCache, kv_cache_bytes, make_cache
from kvlab.clocks import SLO, RequestRecord, requests_frame, summarize
from kvlab.device import pick_device
from kvlab.generate import GenerationConfig, GenerationResult, Timeline, TokenEvent, generate, stream
from kvlab.model.config import PUBLISHED_CONFIGS, ModelConfig, llama_30m, tiny_gpt2, tiny_llama
from kvlab.model.decoder import Decoder, build_model
from kvlab.model.loading import from_pretrained, from_transformers, to_transformers
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.serving import BlockManager, Engine, SamplingParams, SchedulerConfig
from kvlab.traces import replay_trace
from kvlab.workload import Request, make_workload

# Lesson layers (ipywidgets, matplotlib) are imported explicitly by notebooks:
#   from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel; from kvlab.lessons import verdicts

__all__ = [
    "SLO", "BlockManager", "Engine", "Request", "RequestRecord", "SamplingParams", "SchedulerConfig",
    "make_workload", "replay_trace", "requests_frame", "summarize",
    "CACHE_NAMES", "ByteTokenizer", "CacheMemory", "Decoder", "GenerationConfig", "GenerationResult", "KVCache",
    "ModelConfig", "PUBLISHED_CONFIGS", "Timeline", "TokenEvent", "__version__", "build_model", "from_pretrained",
    "from_transformers", "generate", "kv_cache_bytes", "llama_30m", "make_cache", "pick_device", "stream",
    "tiny_gpt2", "tiny_llama", "to_transformers",
]
