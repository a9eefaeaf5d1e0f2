"""NoCache: keep nothing, so every step recomputes the whole sequence (the slowdown's baseline)."""
from __future__ import annotations

import torch

from kvlab.cache.base import CacheMemory, KVCache


class NoCache(KVCache):
    """Stores nothing. ``update`` hands back exactly the keys/values of the current forward pass.

    With this cache, generation must feed the whole sequence (prompt + every token so far) at every step: keys and
    values of old tokens are rebuilt each time, which is the cost a KV cache removes.
    """

    name = "none"

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v  # (B, nkv, T, hs): only what this pass computed

    @property
    def seq_len(self) -> int:
        return 0  # nothing is ever stored, so every pass starts at position 0

    def reset(self) -> None:
        pass

    def memory(self) -> CacheMemory:
        return CacheMemory(allocated_bytes=0, used_bytes=0, reserved_bytes=0, device_bytes=0)
