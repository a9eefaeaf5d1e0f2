"""The course's exercises: the framework (``framework``) and one module of checkers per notebook (``exNN_*``).

Notebooks import checkers from here: ``from kvlab.exercises import check_kv_bytes``.
"""
from __future__ import annotations

from . import (ex00_start_here, ex01_the_slowdown, ex02_kv_cache, ex03_cache_strategies, ex04_four_clocks,
               ex05_batching, ex06_under_load, ex07_memory_is_capacity, ex08_prefix_and_chunks,
               ex09_measure_a_real_server)
from .framework import (EXERCISES, Answer, Exercise, Feedback, cells, check_choice, check_function, check_number,
                        exercise, exercises_for, lazy, right, wrong)

_MODULES = (ex00_start_here, ex01_the_slowdown, ex02_kv_cache, ex03_cache_strategies, ex04_four_clocks,
            ex05_batching, ex06_under_load, ex07_memory_is_capacity, ex08_prefix_and_chunks,
            ex09_measure_a_real_server)

# Every registered checker is importable from kvlab.exercises, as the notebooks do.
globals().update({name: getattr(next(m for m in _MODULES if hasattr(m, name)), name) for name in EXERCISES})

__all__ = ["EXERCISES", "Answer", "Exercise", "Feedback", "cells", "check_choice", "check_function", "check_number",
           "exercise", "exercises_for", "lazy", "right", "wrong", *EXERCISES]
