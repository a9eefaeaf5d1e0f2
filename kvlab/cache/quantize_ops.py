"""Low-bit quantization of K/V vectors: asymmetric min/max per group, codes packed into uint8.

A vector of ``n`` values is cut into groups of ``group_size`` consecutive values (along head_dim).
Each group keeps its minimum as ``zero`` and its range / (2**bits - 1) as ``scale``; every value
becomes an integer code in [0, 2**bits - 1] (KIVI's and transformers' asymmetric scheme)::

    code = round((x - zero) / scale)        x ~ code * scale + zero     (round half to even)

int8 codes are stored one per byte; int4 codes two per byte and int2 codes four per byte, the
first code in the lowest bits. Every function here is pure and works on any leading shape.
"""
from __future__ import annotations

import torch

SUPPORTED_BITS: tuple[int, ...] = (2, 4, 8)


def check_bits(bits: int) -> None:
    """Raise a clear error unless ``bits`` is 2, 4 or 8."""
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits {bits!r} is not supported; use 2, 4 or 8")


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (..., n) uint8 in [0, 2**bits) -> (..., n * bits / 8) uint8, 8 / bits codes per byte.

    Code j of each run of 8 / bits codes lands in bits [j * bits, (j + 1) * bits) of its byte.
    """
    check_bits(bits)
    if bits == 8:
        return codes.to(torch.uint8).contiguous()
    per = 8 // bits
    n = codes.size(-1)
    if n % per:
        raise ValueError(f"cannot pack {n} codes of {bits} bits into whole bytes; n must be a multiple of {per}")
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], n // per, per)  # (..., n/per, per)
    packed = c[..., 0].clone()  # (..., n/per)
    for j in range(1, per):  # at most 4 whole-tensor ops
        packed |= c[..., j] << (j * bits)
    return packed


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``pack``: (..., m) uint8 -> codes (..., m * 8 / bits) uint8."""
    check_bits(bits)
    if bits == 8:
        return packed
    mask = 2 ** bits - 1
    # one shift per slot, stacked: a few times faster than one broadcast shift over (..., m, per)
    codes = [packed & mask] + [(packed >> (j * bits)) & mask for j in range(1, 8 // bits)]
    return torch.stack(codes, dim=-1).flatten(-2)  # (..., m, per) -> (..., m * per)


def quantize(x: torch.Tensor, bits: int, group_size: int,
             scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (..., n) -> packed codes (..., n * bits / 8) uint8, scale (..., n / group_size), zero (same).

    scale and zero are stored in ``scale_dtype`` (default x's dtype); the codes are computed from
    the stored (rounded) scale and zero so that ``dequantize`` reproduces exactly what was meant.
    A constant group gets scale 0 and codes 0, and comes back exactly.
    """
    check_bits(bits)
    n = x.size(-1)
    if group_size < 1 or n % group_size:
        raise ValueError(f"group_size {group_size} does not divide the last dimension {n}")
    scale_dtype = scale_dtype or x.dtype
    qmax = 2 ** bits - 1
    g = x.float().reshape(*x.shape[:-1], n // group_size, group_size)  # (..., G, g)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # (..., G)
    scale, zero = ((hi - lo) / qmax).to(scale_dtype), lo.to(scale_dtype)  # (..., G), as stored
    s, z = scale.float()[..., None], zero.float()[..., None]  # (..., G, 1)
    safe = torch.where(s > 0, s, torch.ones_like(s))  # constant group: every code is 0
    codes = ((g - z) / safe).round_().clamp_(0, qmax).to(torch.uint8)  # (..., G, g)
    return pack(codes.reshape(x.shape), bits), scale, zero


def dequantize(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int,
               group_size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Packed codes (..., m) with scale, zero (..., G) -> values (..., n) = code * scale + zero."""
    codes = unpack(packed, bits)  # (..., n)
    n = codes.size(-1)
    x = codes.reshape(*codes.shape[:-1], n // group_size, group_size).to(scale.dtype)  # (..., G, g), a new tensor
    x.mul_(scale[..., None]).add_(zero[..., None])  # in place: no further temporaries
    return x.flatten(-2).to(dtype or scale.dtype)  # (..., n)

