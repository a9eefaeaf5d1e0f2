"""DynamicCache: K/V tensors that grow by concatenation with every token seen."""
from __future__ import annotations

import torch

from kvlab.cache.base import CacheMemory, KVCache, tensor_bytes


class DynamicCache(KVCache):
    """Grows exactly with the tokens stored: memory = the formula, nothing reserved.

    Each update concatenates the new keys/values onto the layer's tensors (as transformers'
    DynamicCache does); the price is a copy of the layer's history on every step.
    """

    name = "dynamic"

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device)
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # each (B, nkv, S, hs)
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if keys is None or values is None:  # a layer's keys and values are set together
            # A copy, not .contiguous(): k/v may be views into the fused qkv output, which would stay alive.
            keys = self.keys[layer_idx] = k.clone(memory_format=torch.contiguous_format)  # (B, nkv, T, hs)
            values = self.values[layer_idx] = v.clone(memory_format=torch.contiguous_format)
        else:
            keys = self.keys[layer_idx] = torch.cat([keys, k], dim=2)  # (B, nkv, S+T, hs)
            values = self.values[layer_idx] = torch.cat([values, v], dim=2)
        return keys, values

    @property
    def seq_len(self) -> int:
        last = self.keys[-1]
        return 0 if last is None else last.size(2)

    def reset(self) -> None:
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers

    def memory(self) -> CacheMemory:
        n = tensor_bytes(*self.keys, *self.values)
        return CacheMemory(allocated_bytes=n, used_bytes=n, reserved_bytes=0, device_bytes=n)
