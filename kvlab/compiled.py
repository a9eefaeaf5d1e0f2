"""A static cache's payoff: one decode step compiled once for fixed shapes, replayed for every token.

``generate(model, prompt, cache="static", compile=True)`` runs the prefill as usual, then every decode step through
``torch.compile`` of the decoder's forward over a ``FixedShapeStaticCache`` (every step has the same shapes, so one
program serves token 1 and token 500 alike; gpt-fast's recipe). The compiled program is kept per model and reused by
later calls with the same cache length; a new length compiles again. What the compiler gains on a CPU is the many small
operations between the weight products, fused into a few loops; the products themselves stay kvlab's K-split product,
called as one operator (``kvlab::split_matvec``, kvlab/model/matvec.py), because the compiler's own one-row product
streams the weights more slowly.

Compiling takes seconds to minutes on a CPU (inductor writes and builds C++), so it is never silent: the first step of
a new shape prints one line before and after, and its seconds are kept in ``compile_s`` (and in the generation's
``settings``). Where the compiler fails (no C++ toolchain, an unsupported op), the step says why once and runs eagerly
on the same fixed-shape cache: same tokens, no speed-up (``fallback`` holds the reason).
"""
from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kvlab.cache.static import FixedShapeStaticCache
from kvlab.model.decoder import Decoder
from kvlab.model.matvec import prepare_compile


class CompiledDecodeStep:
    """``torch.compile`` of one decode step (token (B, 1) -> logits (B, V)) over a FixedShapeStaticCache.

    The cache is an argument, not a closure: a fresh cache of the same shape reuses the program.
    """

    def __init__(self, model: Decoder, backend: str = "inductor", mode: str | None = None) -> None:
        self.model, self.backend, self.mode = model, backend, mode
        prepare_compile()  # the thread count is a constant of the program (kvlab/model/matvec.py)
        self.compiled = torch.compile(self.step, backend=backend, mode=mode, dynamic=False)
        self.compile_s: dict[tuple, float] = {}  # shape key -> seconds its first (compiling) call took
        self.fallback: str | None = None  # why compiled steps could not run (then they run eagerly)

    def step(self, token: torch.Tensor, positions: torch.Tensor, cache: FixedShapeStaticCache) -> torch.Tensor:
        """The plain decode step the compiler traces: token (B, 1) at positions (B, 1) -> logits (B, V)."""
        return self.model(token, cache, positions=positions, last_only=True)[:, -1]

    def __call__(self, token: torch.Tensor, cache: FixedShapeStaticCache) -> torch.Tensor:
        """One decode step: writes the token's K/V into its slot, returns logits (B, V), advances the cache."""
        positions = cache.position.view(1, 1).expand(token.size(0), 1)  # (B, 1)
        key = (cache.max_len, cache.batch, cache.dtype, str(cache.device))
        if self.fallback is not None:
            logits = self.step(token, positions, cache)
        elif key in self.compile_s:
            logits = self.compiled(token, positions, cache)
        else:
            logits = self._first_call(key, token, positions, cache)
        cache.advance()
        return logits

    def _first_call(self, key: tuple, token: torch.Tensor, positions: torch.Tensor,
                    cache: FixedShapeStaticCache) -> torch.Tensor:
        backend = getattr(self.backend, "__name__", self.backend)
        print(f"kvlab: compiling the decode step for a {cache.max_len}-token static cache with torch.compile "
              f"({backend}); once per model and cache length...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            logits = self.compiled(token, positions, cache)
        except Exception as e:  # no compiler, or one that fails on this machine: run the same step eagerly
            self.fallback = short_reason(e)
            print(f"kvlab: torch.compile failed ({self.fallback}); decode steps run uncompiled (same tokens, "
                  "no speed-up)", file=sys.stderr, flush=True)
            return self.step(token, positions, cache)  # rewrites the same slot: safe after a partial run
        self.compile_s[key] = time.perf_counter() - t0
        print(f"kvlab: compiled in {self.compile_s[key]:.1f} s", file=sys.stderr, flush=True)
        return logits


def run_compiled(compiled: Callable[..., Any], *args: Any) -> Any:
    """``compiled(*args)`` with the programs it already has, never compiling one mid-service (seconds every request
    would wait): None where none fits these inputs (the caller runs the step eagerly). Only the guards that tell its
    programs apart run (``skip_guard_eval_unsafe``; the lookup 265 -> 86-104 us a decode step here): the callers build
    every input the same way each step, so the guards left out (dtypes, devices, the model, the pool) cannot change."""
    try:
        with torch.compiler.set_stance("fail_on_recompile", skip_guard_eval_unsafe=True):
            return compiled(*args)
    except RuntimeError as e:
        if "recompil" not in str(e).lower():  # fail_on_recompile's words, or skip_guard_eval_unsafe's
            raise
        return None


def short_reason(e: Exception, limit: int = 300) -> str:
    """One line saying why compiling failed: the exception's type and its first lines, without torch's hints."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Set TORCH", "You can suppress", "For even more"))]
    return f"{type(e).__name__}: {' '.join(lines[:2])}"[:limit]


_STEPS: "weakref.WeakKeyDictionary[Decoder, dict[tuple, CompiledDecodeStep]]" = weakref.WeakKeyDictionary()


def compiled_step(model: Decoder, backend: str = "inductor", mode: str | None = None) -> CompiledDecodeStep:
    """The model's compiled decode step for this backend and mode, built on first use and kept with the model."""
    steps = _STEPS.setdefault(model, {})
    if (backend, mode) not in steps:
        steps[(backend, mode)] = CompiledDecodeStep(model, backend, mode)
    return steps[(backend, mode)]


__all__ = ["CompiledDecodeStep", "compiled_step", "run_compiled", "short_reason"]
