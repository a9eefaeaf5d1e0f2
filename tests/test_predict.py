"""Predict, then run: the learner's number beside the measurement, never an exception, and never the answer first.

Until the box is filled, the measurement (and the claims that state it, ``verdicts(..., after=guess)``)
is folded into a ``<details>`` the learner clicks, and the plain text holds no number at all.
"""
from __future__ import annotations

import html as html_lib
import re

import pytest

from kvlab.lessons import CLAIMS, verdicts
from kvlab.lessons.common.predict import predict

from claim_examples import example_of

DETAILS_BODY = re.compile(r"(<details\b[^>]*>\s*<summary>.*?</summary>).*?</details>", re.S)
TAG = re.compile(r"<[^>]+>")


def shown_without_clicking(html: str) -> str:
    """The text a reader sees of ``html`` before opening any ``<details>``: tags gone, folded bodies gone."""
    return html_lib.unescape(TAG.sub(" ", DETAILS_BODY.sub(r"\1", html)))


def test_an_empty_box_asks_for_a_number_and_hides_the_measurement_until_clicked():
    guess = predict("How many times as long?", unit="×")
    assert guess.value is None
    c = guess.against(4.19)
    text, page = str(c), c._repr_html_()
    assert text.startswith("no prediction yet") and "run this cell again" in text
    assert not re.search(r"\d", text), f"the plain text gives the answer away: {text!r}"
    assert c.hidden and c.measured == 4.19  # the number is still there for code
    assert '<details class="kvlab-reveal">' in page and "click here to reveal" in page
    assert "4.19×" in page and "4.19" not in shown_without_clicking(page)  # folded, one click away


def test_the_reveal_names_what_was_measured():
    c = predict("How many GiB?", unit="GiB").against(2.0, what="the formula gives")
    assert "reveal what the formula gives" in c._repr_html_() and "2 GiB" in c._repr_html_()


def test_a_typed_prediction_is_shown_beside_the_measurement_with_their_ratio():
    guess = predict("How many times as long?", unit="×")
    guess.box.value = 4.0  # what typing in the box does
    c = guess.against(2.0)
    assert c.predicted == 4.0 and str(c) == "you predicted 4×; your run measured 2× (0.5 times your prediction)"
    assert not c.hidden and "<details" not in c._repr_html_()
    assert "2×" in shown_without_clicking(c._repr_html_())  # counter-example: nothing folded once predicted


def test_a_prediction_set_in_code_and_a_zero_prediction_do_not_raise():
    assert "bytes" in str(predict("How many bytes?", unit="bytes", value=1024).against(2048))
    assert "inf" in str(predict("How many?", value=0).against(3))


# --- verdicts that would answer the prediction -------------------------------------------------------

NAME = "paging_fits_more_sequences"  # a deterministic claim of notebook 07 that states the predicted count


@pytest.fixture(scope="module")
def capacity_result():
    return example_of(NAME)()


def test_checks_after_an_empty_prediction_are_folded_and_their_numbers_left_out(capacity_result):
    shown = verdicts(capacity_result, NAME)
    folded = verdicts(capacity_result, NAME, after=predict("How many fit?", unit="sequences"))
    assert re.search(r"\d", str(shown)) and str(shown).startswith("✓")
    text, page = str(folded), folded._repr_html_()
    assert folded.hidden and "hidden until you predict" in text and "run this cell again" in text
    assert not re.search(r"\d", text) and "✓" not in text, text
    assert '<details class="kvlab-reveal">' in page and shown._repr_html_() in page  # one click shows them all
    assert not re.search(r"\d", shown_without_clicking(page))


def test_checks_after_a_made_prediction_are_shown_in_full(capacity_result):
    guess = predict("How many fit?", unit="sequences")
    guess.box.value = 20.0
    after = verdicts(capacity_result, NAME, after=guess)
    assert not after.hidden and str(after) == str(verdicts(capacity_result, NAME))
    assert after._repr_html_() == verdicts(capacity_result, NAME)._repr_html_()


def test_after_takes_a_prediction_and_says_so_otherwise(capacity_result):
    with pytest.raises(TypeError, match="guess = predict"):
        verdicts(capacity_result, NAME, after=3)


# --- a table or a printout that states the answer ----------------------------------------------------

def test_a_table_that_states_the_answer_is_folded_until_the_learner_predicts():
    import pandas as pd

    guess = predict("How many fit?")
    table = pd.DataFrame({"scheme": ["paged blocks"], "sequences_fit": [37]})
    page = guess.fold(table)._repr_html_()
    assert '<details class="kvlab-reveal">' in page and "37" in page
    assert "37" not in shown_without_clicking(page)  # one click away, not on screen
    assert "37" in repr(guess.fold(table))  # the plain text stays whole: nbval still checks a deterministic table
    guess.box.value = 40.0  # counter-example: once predicted, nothing is folded
    assert "<details" not in guess.fold(table)._repr_html_() and "37" in shown_without_clicking(
        guess.fold(table)._repr_html_())


def test_a_folded_printout_keeps_its_lines_and_escapes_them():
    guess = predict("How many GiB?")
    f = guess.fold("a <b> 2.00 GiB\nnext line", what="this printout")
    assert repr(f) == "a <b> 2.00 GiB\nnext line"
    page = f._repr_html_()
    assert "this printout holds the answer" in page and "a &lt;b&gt; 2.00 GiB" in page
    assert "2.00" not in shown_without_clicking(page)


def test_a_figure_that_states_the_answer_folds_and_says_so_in_plain_text():
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().set_title("token 194 took 3.7× token 20")
    guess = predict("How many times as long?", unit="×")
    f = guess.fold(fig, what="this figure")
    page = f._repr_html_()
    assert 'class="kvlab-reveal"' in page and "data:image/png;base64," in page
    assert not re.search(r"\d", shown_without_clicking(page).replace("🎯", "")), shown_without_clicking(page)
    assert "3.7" not in repr(f) and getattr(fig, "kvlab_folded", False)
    guess.box.value = 4.0
    assert "<details" not in guess.fold(fig)._repr_html_()


def test_a_comparison_carries_where_its_question_and_its_result_came_from():
    """guess.against(result, measure): the cell that asked and the cell whose experiment produced the result go
    into the HTML the notebook tests read, counted back from the comparing cell, with the numbers the answer is
    computed from; a result produced before its question is flagged on the page itself."""
    from dataclasses import replace

    from kvlab.provenance import cell_of, experiment, produced

    guess = predict("How many times as many steps?", unit="×", value=1.5)
    guess.asked_in = 7  # as a kernel's cell 7 would record it
    later = produced({"static": 223, "continuous": 175}, cell=9)
    c = replace(guess.against(later, lambda r: (r["static"] / r["continuous"], {"static steps": r["static"]})),
                compared_in=10)
    assert (c.asked_in, c.produced_in, c.in_order) == (7, 9, True)
    page = c._repr_html_()
    assert 'data-asked-ago="3" data-produced-ago="1"' in page and "static steps" in page and "⚠" not in page
    earlier = produced([1, 2], cell=3)
    c = guess.against(earlier, lambda r: float(len(r)))
    assert c.in_order is False and "produced before the question was asked" in c._repr_html_()
    # a bare number: no provenance at all, which the notebook test refuses
    c = guess.against(4.19)
    assert c.produced_in is None and c.in_order is None and 'data-produced-ago=""' in c._repr_html_()
    # where the cells are unknown (outside a kernel), the order is not known either: no warning
    c = guess.against(produced([1, 2]), lambda r: float(len(r)))
    assert c.in_order is None and "⚠" not in c._repr_html_()

    @experiment
    def run(n):
        return [n]

    assert cell_of(run(3)) is None  # outside a kernel no cell is noted
    assert cell_of([3]) is None
