"""Notebook 07's claims: the counts of sequences that fit a KV budget hold, and fail when they should."""
from __future__ import annotations

import pytest

from kvlab.lessons import CLAIMS, claims_for, verdicts
from kvlab.experiments.capacity import budget_for_tokens, capacity_levers, paged_vs_reserved
from kvlab.experiments.slowdown import slowdown_config
from kvlab.workload import Request

from claim_examples import example_of

NOTEBOOK = "07_memory_is_capacity.ipynb"


def test_every_claim_of_notebook_07_is_deterministic_and_holds_on_the_notebooks_setting():
    claims = claims_for(NOTEBOOK)
    assert len(claims) >= 8
    for c in claims:
        assert c.clock == "deterministic", c.name
        first, again = c.on(example_of(c)()), c.on(example_of(c)())
        assert first.holds is True, str(first)
        assert str(first) == str(again)  # nbval compares these lines: nothing may change between runs


def test_the_verdicts_quote_the_hand_counts():
    table = example_of("paging_fits_more_sequences")()
    text = str(verdicts(table, "reservation_fits_budget_over_context", "paging_fits_more_sequences"))
    assert "8,192 // 1,024 = 8" in text and "4.0× the 8 of the reservation" in text


def test_paging_wins_nothing_when_every_request_reaches_its_reservation():
    cfg = slowdown_config()
    full = [Request(i, 200, 56, 0.0, "full") for i in range(16)]  # 256 tokens each: exactly the context
    table = paged_vs_reserved(cfg, full, budget_for_tokens(cfg, 1024), block_size=16, max_model_len=256)
    assert CLAIMS["paging_fits_more_sequences"].on(table).holds is False
    assert CLAIMS["reservation_wastes_most"].on(table).holds is False
    assert CLAIMS["paging_wastes_only_last_blocks"].on(table).holds is True  # 256 is a whole number of blocks


def test_the_levers_claims_read_the_smallest_cap_and_the_longest_context():
    cfg = slowdown_config()
    short = [Request(i, 20, 10, 0.0, "short") for i in range(40)]  # answers far below every cap
    levers = capacity_levers(cfg, short, budget_for_tokens(cfg, 2048), max_model_lens=(128, 512),
                             max_new_tokens=(16, 64))
    v = CLAIMS["short_context_cuts_prompts"].on(levers)
    assert v.holds is False and "cuts 0 of the 40 prompts" in v.text  # nothing to cut: the sentence says so
    with pytest.raises(ValueError):
        verdicts(levers, "no_such_claim")


def test_the_capacity_panel_counts_what_the_notebook_counts():
    from kvlab.experiments.capacity import budget_for_tokens, capacity_workload, paged_vs_reserved
    from kvlab.experiments.serving_run import lesson_model
    from kvlab.lessons.l07_memory_is_capacity.panel import capacity_panel

    cfg = lesson_model().config
    panel = capacity_panel(cfg)
    assert "kvlab-run" in panel.button._dom_classes
    result = panel.run(budget_tokens=4096, block_size=32)
    expected = paged_vs_reserved(cfg, capacity_workload(cfg, n=64, max_context=1024), budget_for_tokens(cfg, 4096),
                                 block_size=32, max_model_len=1024)
    assert result.frame["sequences_fit"].tolist() == expected["sequences_fit"].tolist()
    assert result.figure is not None
