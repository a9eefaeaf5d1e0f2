"""The decoder: its config and presets, the Llama / GPT-2 model, transformers in and out, tokenizers."""
from __future__ import annotations

from kvlab.model.config import ARCHITECTURES, PUBLISHED_CONFIGS, ModelConfig, llama_30m, tiny_gpt2, tiny_llama
from kvlab.model.decoder import Decoder, build_model
from kvlab.model.loading import config_from_transformers, from_pretrained, from_transformers, to_transformers
from kvlab.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = ["ARCHITECTURES", "PUBLISHED_CONFIGS", "ByteTokenizer", "Decoder", "HFTokenizer", "ModelConfig", "Tokenizer",
           "build_model", "config_from_transformers", "from_pretrained", "from_transformers", "llama_30m",
           "to_transformers", "tiny_gpt2", "tiny_llama"]
