"""ModelConfig: the few numbers that define a decoder, and the presets the lab uses."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, overload

from kvlab.cache.base import kv_cache_bytes

ARCHITECTURES = ("llama", "gpt2")


@dataclass
class ModelConfig:
    """Shape of a decoder-only Transformer.

    arch "llama" covers Llama, Mistral and Qwen2 (RMSNorm, RoPE, grouped-query attention,
    SwiGLU, optional q/k/v bias); arch "gpt2" covers GPT-2 (LayerNorm, learned positions, GELU).
    """

    arch: str = "llama"
    vocab_size: int = 4096
    hidden_size: int = 512
    num_layers: int = 8
    num_heads: int = 8
    # None at construction: same as num_heads (no grouping); __post_init__ sets it, so it is an int thereafter
    num_kv_heads: int = None  # type: ignore[assignment]
    intermediate_size: int = 1376
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    name: str = "custom"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch {self.arch!r} is not supported; use one of {ARCHITECTURES}")
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @overload
    def kv_bytes_per_token(self, bytes_per_element: int = 4) -> int: ...
    @overload
    def kv_bytes_per_token(self, bytes_per_element: float) -> float: ...
    def kv_bytes_per_token(self, bytes_per_element: float = 4) -> float:
        """K and V bytes of one token across all layers: 2 x layers x kv_heads x head_dim x bytes (kv_cache_bytes)."""
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, 1, bytes_per_element)

    def num_parameters(self) -> int:
        """Parameter count implied by the config (embeddings counted once when tied)."""
        C, L, V, I = self.hidden_size, self.num_layers, self.vocab_size, self.intermediate_size
        kv = self.num_kv_heads * self.head_dim
        if self.arch == "llama":
            attn = C * (C + 2 * kv) + C * C + (C + 2 * kv if self.qkv_bias else 0)
            block, pos, final_norm = attn + 3 * C * I + 2 * C, 0, C
        else:
            attn = C * 3 * C + 3 * C + C * C + C
            block, pos, final_norm = attn + 2 * C * I + I + C + 4 * C, self.max_position_embeddings * C, 2 * C
        head = 0 if self.tie_word_embeddings else V * C
        return V * C + pos + L * block + final_norm + head

    def to_dict(self) -> dict:
        return asdict(self)


def llama_30m(**overrides) -> ModelConfig:
    """The ~30M-parameter Llama config the benchmarks use (hidden 512, 8 layers, 8 heads, vocab 4096)."""
    base = dict(arch="llama", vocab_size=4096, hidden_size=512, num_layers=8, num_heads=8,
                num_kv_heads=8, intermediate_size=1376, max_position_embeddings=2048, name="llama-30m")
    return ModelConfig(**{**base, **overrides})


def tiny_llama(**overrides) -> ModelConfig:
    """A tiny grouped-query Llama config for tests and quick notebook runs (runs in milliseconds)."""
    base = dict(arch="llama", vocab_size=320, hidden_size=64, num_layers=2, num_heads=4,
                num_kv_heads=2, intermediate_size=128, max_position_embeddings=1024, name="tiny-llama")
    return ModelConfig(**{**base, **overrides})


def tiny_gpt2(**overrides) -> ModelConfig:
    """A tiny GPT-2 config for tests."""
    base = dict(arch="gpt2", vocab_size=320, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                max_position_embeddings=1024, tie_word_embeddings=True, name="tiny-gpt2")
    return ModelConfig(**{**base, **overrides})


# Every preset by the name the commands take (--config of sweep, calibrate and the benchmarks; serve's --model,
# which also reads "_" as "-": tiny_llama). "tiny" is the short name the commands have always taken for tiny_llama.
PRESETS: dict[str, Callable[..., ModelConfig]] = {"llama-30m": llama_30m, "tiny": tiny_llama,
                                                  "tiny-llama": tiny_llama, "tiny-gpt2": tiny_gpt2}


def preset(name: str, **overrides) -> ModelConfig:
    """The config of the preset ``name`` (a key of ``PRESETS``; "_" reads as "-"), with ``overrides`` applied."""
    factory = PRESETS.get(name.replace("_", "-")) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"unknown config {name!r}; choose one of {', '.join(PRESETS)}")
    return factory(**overrides)


# Published configurations, for the memory calculator (no weights needed to count cache bytes).
PUBLISHED_CONFIGS: dict[str, ModelConfig] = {
    "GPT-2 small (124M)": ModelConfig(arch="gpt2", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                                      intermediate_size=3072, max_position_embeddings=1024, tie_word_embeddings=True,
                                      name="gpt2"),
    "GPT-2 XL (1.5B)": ModelConfig(arch="gpt2", vocab_size=50257, hidden_size=1600, num_layers=48, num_heads=25,
                                   intermediate_size=6400, max_position_embeddings=1024, tie_word_embeddings=True,
                                   name="gpt2-xl"),
    "Llama-2-7B (MHA)": ModelConfig(arch="llama", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                                    num_kv_heads=32, intermediate_size=11008, max_position_embeddings=4096,
                                    name="llama-2-7b"),
    "Llama-3-8B (GQA)": ModelConfig(arch="llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
                                    num_kv_heads=8, intermediate_size=14336, max_position_embeddings=8192,
                                    rope_theta=500000.0, name="llama-3-8b"),
    "Llama-3-70B (GQA)": ModelConfig(arch="llama", vocab_size=128256, hidden_size=8192, num_layers=80, num_heads=64,
                                     num_kv_heads=8, intermediate_size=28672, max_position_embeddings=8192,
                                     rope_theta=500000.0, name="llama-3-70b"),
    "Qwen2-0.5B (GQA)": ModelConfig(arch="llama", vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                                    num_kv_heads=2, intermediate_size=4864, max_position_embeddings=32768,
                                    qkv_bias=True, tie_word_embeddings=True, rope_theta=1000000.0, name="qwen2-0.5b"),
}
