"""Predict, then run: the learner's number beside the measurement, never an exception."""
from __future__ import annotations

from kvlab.widgets import predict


def test_an_empty_box_asks_for_a_number_and_still_shows_the_measurement():
    guess = predict("How many times as long?", unit="×")
    assert guess.value is None
    text = str(guess.against(2.5))
    assert text.startswith("no prediction yet") and "2.5×" in text


def test_a_typed_prediction_is_shown_beside_the_measurement_with_their_ratio():
    guess = predict("How many times as long?", unit="×")
    guess.box.value = 4.0  # what typing in the box does
    c = guess.against(2.0)
    assert c.predicted == 4.0 and str(c) == "you predicted 4×; your run measured 2× (0.5 times your prediction)"


def test_a_prediction_set_in_code_and_a_zero_prediction_do_not_raise():
    assert "bytes" in str(predict("How many bytes?", unit="bytes", value=1024).against(2048))
    assert "inf" in str(predict("How many?", value=0).against(3))
