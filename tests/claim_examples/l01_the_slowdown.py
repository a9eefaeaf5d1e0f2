"""Claim examples of notebook 01 (the slowdown): a ``run_slowdown`` sized for the device, a ``run_context_steps``,
and runs built by hand on which each wall-clock sentence is false."""
from __future__ import annotations

import functools
from typing import Any, Callable

import pandas as pd

from kvlab.experiments.long_context import run_context_steps
from kvlab.experiments.slowdown import run_slowdown, slowdown_model
from kvlab.model.lessons import LessonScale, lesson_scale

from . import counterexample, example


EXAMPLE_NEW_TOKENS_CPU = 80  # on CPU the example is shorter than the lesson's run (seconds, not a minute)


def example_sizes(scale: LessonScale | None = None) -> dict:
    """The example run's prompt and new tokens, from the lesson sizes of this device (``lesson_scale()``).

    On CPU: the lesson's prompt and 80 new tokens. On a GPU: the lesson's own sizes (512 + 400 on the
    90M model), since short steps there cost their kernel launches whatever they hold, and uncached
    tokens would not slow down.
    """
    scale = lesson_scale() if scale is None else scale
    new = min(scale.max_new_tokens, EXAMPLE_NEW_TOKENS_CPU) if scale.device == "cpu" else scale.max_new_tokens
    return dict(prompt_tokens=scale.prompt_tokens, max_new_tokens=new)


@example("uncached_tokens_slow_down", "cached_steps_stay_flat", "uncached_wait_gap_widens",
         "measured_slowdown_below_work", "many_tokens_per_pass_cost_less_each", "uncached_steps_share_a_per_pass_cost")
@functools.lru_cache(maxsize=1)
def _example() -> pd.DataFrame:
    return run_slowdown(slowdown_model(), **example_sizes(), repeats=2)


def steps_by_hand(step_ms: dict[str, Callable[[int, int], float]], prompt_tokens: int = 32,
                  new_tokens: int = 80) -> pd.DataFrame:
    """A ``run_slowdown`` frame built by hand (one repeat): each cache's step time in ms, a function of
    (token, tokens that step pushes through the model). For the counter-examples of the claims."""
    rows = []
    for cache, ms_of in step_ms.items():
        t = 0.0
        for token in range(new_tokens):
            processed = prompt_tokens if token == 0 else (prompt_tokens + token if cache == "none" else 1)
            ms = float(ms_of(token, processed))
            t += ms / 1e3
            rows.append(dict(cache=cache, repeat=0, token=token, position=prompt_tokens + token,
                             tokens_processed=processed, time_s=t, step_ms=ms,
                             phase="prefill" if token == 0 else "decode", cache_bytes=0))
    frame = pd.DataFrame(rows)
    frame.attrs.update(prompt_tokens=prompt_tokens, max_new_tokens=new_tokens, repeats=1)
    return frame


@counterexample("uncached_tokens_slow_down")
def _flat_uncached(_example: Any) -> pd.DataFrame:  # uncached steps that do not grow
    return steps_by_hand({"none": lambda token, n: 1.0 + 0.01 * (token % 2), "dynamic": lambda token, n: 1.0})


@counterexample("cached_steps_stay_flat")
def _growing_cached(_example: Any) -> pd.DataFrame:  # cached steps that double over the run
    return steps_by_hand({"none": lambda token, n: 0.05 * n, "dynamic": lambda token, n: 1.0 + 0.02 * token})


@counterexample("uncached_wait_gap_widens")
def _constant_difference_per_step(_example: Any) -> pd.DataFrame:
    """No slowdown at all: every uncached step costs the same 1 ms more than a cached one (with the jitter of a real
    run), so the gap grows linearly and doubles from the middle to the end, yet never widens faster."""
    return steps_by_hand({"none": lambda token, n: 2.0 + 0.05 * ((token * 7) % 5 - 2),
                          "dynamic": lambda token, n: 1.0 + 0.05 * ((token * 3) % 4 - 1.5)})


@counterexample("many_tokens_per_pass_cost_less_each")
def _no_fixed_part(_example: Any) -> pd.DataFrame:  # an uncached pass costs per token exactly a cached step
    return steps_by_hand({"none": lambda token, n: 1.0 * n, "dynamic": lambda token, n: 1.0})


@example("cached_steps_grow_at_long_context")
@functools.lru_cache(maxsize=1)
def _long_context_example() -> pd.DataFrame:
    return run_context_steps(slowdown_model(), repeats=2)


@counterexample("cached_steps_grow_at_long_context")
def _flat_long_context(frame: pd.DataFrame) -> pd.DataFrame:
    """The example with every step at every context as fast as the shortest context's: no growth to see."""
    frame = frame.copy()
    frame["step_ms"] = float(frame.loc[frame["context"] == frame["context"].min(), "step_ms"].min())
    return frame
