"""StaticCache: K/V preallocated to a maximum length; tokens are written in place."""
from __future__ import annotations

import torch

from .base import CacheMemory, KVCache, kv_cache_bytes


class StaticCache(KVCache):
    """Reserves ``max_len`` tokens per layer up front.

    Shapes never change, which is what lets compilers and CUDA graphs specialise; the cost is
    memory reserved for tokens that may never come (reported as reserved_bytes).
    """

    name = "static"

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 max_len: int = 1024) -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device)
        if max_len < 1:
            raise ValueError(f"static cache max_len must be >= 1, got {max_len}")
        self.max_len = max_len
        shape = (batch, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self._len = [0] * num_layers

    def check_fits(self, tokens: int) -> None:
        """Raise before any work if ``tokens`` would not fit."""
        if tokens > self.max_len:
            raise ValueError(
                f"static cache holds {self.max_len} tokens but {tokens} are needed; "
                f"raise max_len or shorten the prompt / lower max_new_tokens")

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, T = self._len[layer_idx], k.size(2)
        self.check_fits(start + T)
        self.keys[layer_idx][:, :, start:start + T] = k  # write in place: (B, nkv, T, hs)
        self.values[layer_idx][:, :, start:start + T] = v
        self._len[layer_idx] = start + T
        # Attend over the filled prefix only (a view, no copy): (B, nkv, start+T, hs)
        return self.keys[layer_idx][:, :, :start + T], self.values[layer_idx][:, :, :start + T]

    @property
    def seq_len(self) -> int:
        return self._len[-1]

    def reset(self) -> None:
        self._len = [0] * self.num_layers

    def memory(self) -> CacheMemory:
        elem = self.keys[0].element_size()
        allocated = kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.max_len, self.batch, elem)
        used = sum(kv_cache_bytes(1, self.num_kv_heads, self.head_dim, n, self.batch, elem) for n in self._len)
        return CacheMemory(allocated_bytes=allocated, used_bytes=used, reserved_bytes=allocated - used,
                           device_bytes=allocated)
