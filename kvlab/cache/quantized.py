"""QuantizedCache: K/V history stored as packed 8/4/2-bit codes, a recent window kept in full precision."""
from __future__ import annotations

import math

import torch

from kvlab.cache.base import CacheMemory, KVCache, tensor_bytes
from kvlab.cache.quantize_ops import check_bits, dequantize, quantize


class QuantizedCache(KVCache):
    """Stores old keys/values in low precision and the newest ``residual`` tokens as they came.

    Like transformers' QuantizedCache (``residual_length``) and KIVI: each token's key and value vectors are quantized
    in groups of ``group_size`` along head_dim (asymmetric min/max, one scale and one zero-point per group, see
    quantize_ops). The codes are really stored packed in uint8 (1, 2 or 4 codes per byte); scales and zero-points are
    stored in the model dtype (fp32 on CPU), so they cost 2 x dtype bytes per group — with fp32 and group 32 that is
    0.25 bytes per value, as much as the 2-bit payload itself.

    When the full-precision window holds more than ``residual`` tokens, the oldest are quantized and appended to the
    packed store; with ``residual=0`` every token, the current one included, is quantized before it is attended over.
    ``update`` dequantizes the whole history and concatenates the window, so the model always attends over exactly what
    is stored — also at prefill (transformers hands back the full-precision prompt there). Dequantizing every step is
    the price of the memory saved: at short contexts this cache is slower than dynamic.

    KIVI quantizes keys per channel (groups along tokens); here keys and values are both grouped
    along head_dim, which keeps every token independent and the window logic simple.
    """

    name = "quantized"

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 bits: int = 4, group_size: int | None = None, residual: int = 64) -> None:
        if group_size is None:  # the largest power of two <= 32 that divides head_dim
            group_size = math.gcd(head_dim, 32)
        self.check_options(head_dim, bits, group_size, residual)  # before anything is allocated
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device)
        self.bits, self.group_size, self.residual = bits, group_size, residual
        B, nkv, hs, G = batch, num_kv_heads, head_dim, head_dim // group_size

        def empty(last: int, dt: torch.dtype) -> list[torch.Tensor]:
            return [torch.empty(2, B, nkv, 0, last, dtype=dt, device=self.device) for _ in range(num_layers)]

        # Per layer, K and V stacked on a leading axis of 2 (one set of ops serves both).
        # Packed history: codes (2, B, nkv, Sq, hs*bits/8) uint8; scale and zero (2, B, nkv, Sq, hs/g).
        self.packed = empty(hs * bits // 8, torch.uint8)
        self.scale, self.zero = empty(G, dtype), empty(G, dtype)
        # Full-precision window of the newest tokens: (2, B, nkv, R, hs), R <= residual.
        self.window = empty(hs, dtype)

    @staticmethod
    def check_options(head_dim: int, bits: int, group_size: int, residual: int) -> None:
        """Raise a clear ValueError for options this cache cannot honour."""
        check_bits(bits)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        if head_dim % group_size:
            divisors = [d for d in range(1, head_dim + 1) if head_dim % d == 0]
            raise ValueError(f"group_size {group_size} does not divide head_dim {head_dim}; "
                             f"use one of {divisors}")
        if head_dim * bits % 8:
            raise ValueError(f"head_dim {head_dim} x {bits} bits does not fill whole bytes; use bits=8")
        if isinstance(residual, bool) or not isinstance(residual, int) or residual < 0:
            raise ValueError(f"residual must be an integer >= 0 (tokens kept in full precision), got {residual!r}")

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i = layer_idx
        window = torch.cat([self.window[i], torch.stack([k, v])], dim=3)  # (2, B, nkv, R+T, hs)
        overflow = window.size(3) - self.residual
        if overflow > 0:  # the oldest tokens leave the window: quantize them into the packed store
            # (2, B, nkv, n, hs*bits/8), (.., n, G) x2
            q, scale, zero = quantize(window[:, :, :, :overflow], self.bits, self.group_size, scale_dtype=self.dtype)
            self.packed[i] = torch.cat([self.packed[i], q], dim=3)  # (2, B, nkv, Sq+n, hs*bits/8)
            self.scale[i] = torch.cat([self.scale[i], scale], dim=3)  # (2, B, nkv, Sq+n, G)
            self.zero[i] = torch.cat([self.zero[i], zero], dim=3)
            window = window[:, :, :, overflow:].clone()  # clone: a slice would pin the old buffer (hidden bytes)
        self.window[i] = window  # (2, B, nkv, min(R, total), hs)
        if self.packed[i].size(3):
            history = dequantize(self.packed[i], self.scale[i], self.zero[i], self.bits, self.group_size,
                                 dtype=self.dtype)  # (2, B, nkv, Sq, hs)
            window = torch.cat([history, window], dim=3)  # (2, B, nkv, S, hs)
        return window[0], window[1]

    @property
    def seq_len(self) -> int:
        return self.packed[-1].size(3) + self.window[-1].size(3)

    def reset(self) -> None:
        for store in (self.packed, self.scale, self.zero, self.window):
            for i, t in enumerate(store):
                store[i] = t[:, :, :, :0].clone()  # empty, same dtype and other dimensions

    def memory_breakdown(self) -> dict[str, int]:
        """Bytes of the packed codes, of the scales + zero-points, and of the full-precision window."""
        return dict(payload_bytes=tensor_bytes(*self.packed), scale_bytes=tensor_bytes(*self.scale, *self.zero),
                    residual_bytes=tensor_bytes(*self.window))

    def memory(self) -> CacheMemory:
        n = sum(self.memory_breakdown().values())  # every stored tensor has exactly its own size
        return CacheMemory(allocated_bytes=n, used_bytes=n, reserved_bytes=0, device_bytes=n)

    def __repr__(self) -> str:
        return (f"QuantizedCache(bits={self.bits}, group_size={self.group_size}, residual={self.residual}, "
                f"seq_len={self.seq_len}, {self.memory_breakdown()})")
