"""kvlab: a hands-on lab about KV caches, batching, and why a fast AI service can keep people waiting."""
from __future__ import annotations

__version__ = "0.1.0"

from .cache import CACHE_NAMES, CacheMemory, KVCache, kv_cache_bytes, make_cache
from .device import pick_device
from .generate import GenerationResult, Timeline, TokenEvent, generate, stream
from .model.config import PUBLISHED_CONFIGS, ModelConfig, llama_30m, tiny_gpt2, tiny_llama
from .model.decoder import Decoder, build_model
from .model.loading import from_pretrained, from_transformers, to_transformers
from .model.tokenizer import ByteTokenizer

__all__ = [
    "CACHE_NAMES", "ByteTokenizer", "CacheMemory", "Decoder", "GenerationResult", "KVCache", "ModelConfig",
    "PUBLISHED_CONFIGS", "Timeline", "TokenEvent", "__version__", "build_model", "from_pretrained",
    "from_transformers", "generate", "kv_cache_bytes", "llama_30m", "make_cache", "pick_device", "stream",
    "tiny_gpt2", "tiny_llama", "to_transformers",
]
