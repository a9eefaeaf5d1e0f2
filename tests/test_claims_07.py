"""Notebook 07's claims: the counts of sequences that fit a KV budget hold, and fail when they should."""
from __future__ import annotations

import pytest

from kvlab.lessons import CLAIMS, claims_for, verdicts
from kvlab.experiments.capacity import budget_for_tokens, capacity_levers, paged_vs_reserved
from kvlab.experiments.presets import LESSON_SPEC
from kvlab.experiments.slowdown import slowdown_config
from kvlab.workload import Request

from claim_examples import example_of

LESSONS = ("01", "07")  # the lessons these tests belong to: `pytest -m lNN`

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
    table = paged_vs_reserved(cfg, full, LESSON_SPEC.replace(kv_budget_bytes=budget_for_tokens(cfg, 1024), max_model_len=256))
    assert CLAIMS["paging_fits_more_sequences"].on(table).holds is False
    assert CLAIMS["reservation_wastes_most"].on(table).holds is False
    assert CLAIMS["paging_wastes_only_last_blocks"].on(table).holds is True  # 256 is a whole number of blocks


def test_the_levers_claims_read_the_smallest_cap_and_the_longest_context():
    cfg = slowdown_config()
    short = [Request(i, 20, 10, 0.0, "short") for i in range(40)]  # answers far below every cap
    levers = capacity_levers(cfg, short, LESSON_SPEC.replace(kv_budget_bytes=budget_for_tokens(cfg, 2048)), max_model_lens=(128, 512),
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
    spec = LESSON_SPEC.replace(kv_budget_bytes=budget_for_tokens(cfg, 4096), block_size=32, max_model_len=1024)
    expected = paged_vs_reserved(cfg, capacity_workload(cfg, n=64, max_context=1024), spec)
    assert result.frame["sequences_fit"].tolist() == expected["sequences_fit"].tolist()
    assert result.figure is not None


def test_the_waste_claim_names_the_block_size_of_its_largest_gap():
    """The sentence once put the largest gap (1.72 slots, at blocks of 128) beside the numbers of blocks of 16, whose
    gap is 0.72: it now says where the largest gap is."""
    import pandas as pd

    sizes = pd.DataFrame({"block_size": [1, 16, 128], "waste_per_sequence": [0.0, 8.22, 65.22],
                          "rule_of_thumb": [0.0, 7.5, 63.5], "sequences_fit": [33, 32, 28]})
    v = CLAIMS["waste_is_about_half_a_block"].on(sizes)
    assert v.holds is True and "the largest gap is 1.72 slots, at blocks of 128 (65.2 slots, rule 63.5)" in v.text
    assert "at blocks of 16, 8.2 slots against 7.5" in v.text, v.text


def test_the_block_fit_claim_says_never_more_and_fewer_at_the_largest():
    """The fit is flat over the small blocks (33 for 1 to 8): the sentence says what is checked, never more and
    fewer at the largest block than at the smallest, and lists every block size; all equal or a rise fails."""
    import pandas as pd

    c = CLAIMS["bigger_blocks_fit_fewer"]
    sizes = pd.DataFrame({"block_size": [1, 2, 4, 8, 16, 128], "sequences_fit": [33, 33, 33, 33, 32, 28]})
    v = c.on(sizes)
    assert v.holds is True and "never fit more sequences, and the largest fit fewer than the smallest" in v.text
    assert "33 with blocks of 1, 2, 4 and 8; 32 with blocks of 16; 28 with blocks of 128" in v.text, v.text
    assert c.on(sizes.assign(sequences_fit=33)).holds is False
    assert c.on(sizes.assign(sequences_fit=[33, 33, 34, 33, 32, 28])).holds is False
