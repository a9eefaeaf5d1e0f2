"""StaticCache: K/V preallocated to a maximum length; tokens are written in place (and, fixed-shape, compiled)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.cache.base import CacheMemory, KVCache, check_fits, kv_cache_bytes


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

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, T = self._len[layer_idx], k.size(2)
        check_fits(self.name, self.max_len, start + T)
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


class FixedShapeStaticCache(StaticCache):
    """A StaticCache whose decode steps all have the same shapes (prefill takes the ordinary path).

    ``StaticCache.update`` hands back the filled prefix, so the keys attended over grow by one token each step and a
    compiler sees a new shape every step. Here the new token is written into its slot with ``index_copy_`` at a position
    held in a tensor, and attention runs over all ``max_len`` slots with the empty ones masked: token 1 and token 500
    run with identical shapes, which is what lets ``torch.compile`` (and CUDA graphs) build one program and replay it
    (gpt-fast's trick). The price: every step reads all ``max_len`` slots, filled or not.

    ``position`` (a 1-element tensor) is the slot the next decode step writes; it lives on the
    device so a compiled step reads it as data, not as a Python constant baked into the program.
    Call ``sync()`` after a prefill and ``advance()`` after each decode step (outside the compiled function).

    The K/V tensors, ``slots`` and ``position`` are marked as static addresses (``mark_static``): a CUDA
    graph may then replay a step that writes into them in place. Unmarked, they are ordinary inputs that
    the step mutates, and CUDA graph trees silently skip such a graph (pytorch #103985, #123231).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 max_len: int = 1024) -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device, max_len)
        self.slots = torch.arange(max_len, device=self.device)  # (max_len,)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)  # (1,)
        self.mark_static()

    def mark_static(self) -> None:
        """Tell torch.compile these tensors keep their addresses between calls (``reset`` only rewinds ``position``)."""
        from torch._dynamo import mark_static_address

        for t in (*self.keys, *self.values, self.slots, self.position):
            mark_static_address(t)  # sets t._dynamo_static_input_type

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.size(2) != 1:  # prefill: its length varies anyway; fill the prefix as StaticCache does
            return super().attend(layer_idx, q, k, v)
        K, V = self.keys[layer_idx], self.values[layer_idx]  # (B, nkv, max_len, hs)
        K.index_copy_(2, self.position, k)  # k: (B, nkv, 1, hs) into its slot
        V.index_copy_(2, self.position, v)
        visible = (self.slots <= self.position)[None, :]  # (1, max_len): filled slots, the new token included
        B, nh, _, hs = q.shape
        nkv = K.size(1)
        # grouped-query attention: the nh / nkv query heads of one K/V head become rows of one query
        y = F.scaled_dot_product_attention(q.reshape(B, nkv, nh // nkv, hs), K, V, attn_mask=visible)
        return y.reshape(B, nh, 1, hs)  # (B, nh, 1, hs)

    def sync(self) -> None:
        """Point ``position`` at the first empty slot (after a prefill)."""
        self.position.fill_(self.seq_len)

    def advance(self) -> None:
        """Count the token the last decode step stored (in every layer) and move to the next slot."""
        check_fits(self.name, self.max_len, self.seq_len + 1)
        self._len = [n + 1 for n in self._len]
        self.position.add_(1)

    def reset(self) -> None:
        super().reset()
        self.position.zero_()
