"""matvec: the weight product of a decode step, a few rows against a big [in, out] matrix, at memory speed.

On CPU, torch splits a product of a few rows with an [in, out] matrix across threads by output columns, so each thread
reads a piece of every row of the weight (1 KB of each 2 KB row when N = 512) and memory streams at 13-24 GB/s on 2
cores. Splitting the inner dimension K instead hands each thread one contiguous block of rows (one batched product) and
sums the partial results: 23-37 GB/s on the same shapes (llama-30m's, measured on 2 cores); the 33 products of a
llama-30m decode step took 4.4 ms instead of 7.0 ms. Same products, added in another order (fp32 results differ in the
last bits). More than SPLIT_MAX_ROWS rows (a prompt) are compute-bound, not memory-bound: they take the plain product,
as does a single thread or another device.

Under ``torch.compile`` the split product is one opaque operator (``kvlab::split_matvec``): left visible, inductor
lowers a one-row batched product on CPU to a multiply and a sum of its own, and a compiled llama-30m decode came out
slower than the eager one (1.08 against 0.92 s for 256 + 128 tokens on 2 cores). Kept whole, the compiler fuses the
small operations around it and calls it as it is (each call pays about 10 µs more than a direct one: the operator's
dispatch). With one thread there is nothing to split, and the plain product is left to the compiler (after
``prepare_compile``, which kvlab's compile entry points call).
"""
from __future__ import annotations

import torch

SPLIT_MAX_ROWS = 16  # products of up to this many rows (decode steps) are split by their inner dimension
_THREADS_ARE_CONSTANT = False  # set by prepare_compile: torch.compile may read torch's threads while tracing


def _threads() -> int:
    return torch.get_num_threads()


def prepare_compile() -> None:
    """Let torch.compile read torch's thread count as a constant of the program it builds.

    kvlab's compile entry points call it (kvlab/compiled.py, kvlab.experiments.static_compile). It
    imports torch._dynamo, about a second, which is why importing kvlab does not. Then a one-thread
    program leaves the products to the compiler; without it every decode product is the operator.
    """
    global _THREADS_ARE_CONSTANT
    torch.compiler.assume_constant_result(_threads)
    _THREADS_ARE_CONSTANT = True


def split_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (K, N) as one contiguous block of w's rows per thread, the partial results summed."""
    splits, (K, N) = torch.get_num_threads(), w.shape
    if splits < 2 or K % splits:
        return x @ w
    parts = x.reshape(-1, splits, K // splits).transpose(0, 1)  # (splits, rows, K/splits)
    y = torch.bmm(parts, w.view(splits, K // splits, N)).sum(0)  # (rows, N): partial products summed
    return y.view(*x.shape[:-1], N)


@torch.library.custom_op("kvlab::split_matvec", mutates_args=())
def split_matvec(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``split_product`` as one operator the compiler calls but does not rewrite."""
    return split_product(x, w)


@split_matvec.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[1])


def matvec(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (K, N): split by K across threads for a decode step's few rows on CPU, else plain."""
    compiling = torch.compiler.is_compiling()
    if compiling and _THREADS_ARE_CONSTANT and _threads() < 2:
        return x @ w  # one thread, nothing to split (asked first: a program for any number of rows needs no guard)
    rows = x.numel() // w.shape[0]
    if x.device.type != "cpu" or not 0 < rows <= SPLIT_MAX_ROWS:
        return x @ w  # a prompt, or another device: the plain product
    return split_matvec(x, w) if compiling else split_product(x, w)


__all__ = ["SPLIT_MAX_ROWS", "matvec", "prepare_compile", "split_matvec", "split_product"]
