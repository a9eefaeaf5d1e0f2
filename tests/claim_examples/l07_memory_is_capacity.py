"""Claim examples of notebook 07 (memory is capacity): the notebook's counting tables for its own setting."""
from __future__ import annotations

from functools import lru_cache

import pandas as pd

from kvlab.experiments.capacity import (block_size_table, budget_for_tokens, capacity_levers,
                                                           capacity_workload, paged_vs_reserved)
from kvlab.experiments.presets import LESSON_SPEC
from kvlab.model.lessons import lesson_config

from . import example


@lru_cache(maxsize=1)
def _setting():
    """The notebook's setting: the lesson model's config, 64 mixed requests, a budget of 8,192 tokens."""
    cfg = lesson_config()
    return cfg, capacity_workload(cfg, n=64), budget_for_tokens(cfg, 8 * 1024)


@example("reservation_fits_budget_over_context", "paging_fits_more_sequences", "reservation_wastes_most",
         "paging_wastes_only_last_blocks")
@lru_cache(maxsize=1)
def _table() -> pd.DataFrame:
    cfg, requests, budget = _setting()
    return paged_vs_reserved(cfg, requests, LESSON_SPEC.replace(kv_budget_bytes=budget, max_model_len=1024))


@example("waste_is_about_half_a_block", "bigger_blocks_fit_fewer")
@lru_cache(maxsize=1)
def _sizes() -> pd.DataFrame:
    cfg, requests, budget = _setting()
    return block_size_table(cfg, requests, budget)


@example("shorter_answers_help_reservation_most", "small_reservation_matches_paging", "short_context_cuts_prompts")
@lru_cache(maxsize=1)
def _levers() -> pd.DataFrame:
    cfg, requests, budget = _setting()
    return capacity_levers(cfg, requests, LESSON_SPEC.replace(kv_budget_bytes=budget))
