"""matvec: the weight product of a decode step, a few rows against a big [in, out] matrix, at memory speed.

On CPU, torch splits a product of a few rows with an [in, out] matrix across threads by output
columns, so each thread reads a piece of every row of the weight (1 KB of each 2 KB row when
N = 512) and memory streams at 13-24 GB/s on 2 cores. Splitting the inner dimension K instead
hands each thread one contiguous block of rows (one batched product) and sums the partial
results: 23-37 GB/s on the same shapes (llama-30m's, measured on 2 cores); the 33 products of a
llama-30m decode step took 4.4 ms instead of 7.0 ms. Same products, added in another order (fp32
results differ in the last bits). More than SPLIT_MAX_ROWS rows (a prompt) are compute-bound, not
memory-bound: they take the plain product, as does a single thread or another device.

Under ``torch.compile`` the split product is one opaque operator (``kvlab::split_matvec``): left
visible, inductor rewrites a one-row batched product into a multiply and a sum of its own, which
streams the weights at half the speed, and a compiled decode step came out slower than the eager
one. Kept whole, the compiler fuses the small operations around it and calls it as it is.
"""
from __future__ import annotations

import torch

SPLIT_MAX_ROWS = 16  # products of up to this many rows (decode steps) are split by their inner dimension


@torch.compiler.assume_constant_result
def _threads() -> int:
    """torch's CPU threads; under torch.compile a constant of the compiled program, read when it is built."""
    return torch.get_num_threads()


def split_product(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """x (..., K) @ w (K, N) as ``splits`` contiguous blocks of w's rows (one per thread), the partial results summed."""
    K, N = w.shape
    parts = x.reshape(-1, splits, K // splits).transpose(0, 1)  # (splits, rows, K/splits)
    y = torch.bmm(parts, w.view(splits, K // splits, N)).sum(0)  # (rows, N): partial products summed
    return y.view(*x.shape[:-1], N)


@torch.library.custom_op("kvlab::split_matvec", mutates_args=())
def split_matvec(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """``split_product`` as one operator the compiler calls but does not rewrite."""
    return split_product(x, w, splits)


@split_matvec.register_fake
def _(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[1])


def matvec(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (K, N): split by K across threads for a decode step's few rows on CPU, else plain."""
    splits, K = _threads(), w.shape[0]
    rows = x.numel() // K
    if x.device.type != "cpu" or splits < 2 or K % splits or not 0 < rows <= SPLIT_MAX_ROWS:
        return x @ w  # a prompt, one thread, or another device: the plain product (the compiler may rewrite it)
    if torch.compiler.is_compiling():
        return split_matvec(x, w, splits)
    return split_product(x, w, splits)


__all__ = ["SPLIT_MAX_ROWS", "matvec", "split_matvec", "split_product"]
