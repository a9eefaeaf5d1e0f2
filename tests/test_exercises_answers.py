"""What an answer has to look like: multiple-choice keys that are not guessable, numbers rounded as the solution says.

A multiple-choice question whose right option is always the hedged one ("it depends", "measure first")
or always in the same place teaches test-taking, not serving; and a checker that rejects the value
its own solution states ("about 1.63") teaches distrust. Both are checked over the whole course.
"""
from __future__ import annotations

import math
import re

import pytest

import kvlab.lessons  # registers every lesson's exercises
import kvlab.lessons.common.exercises as exercises
from kvlab.lessons import EXERCISES
from kvlab.lessons.common.exercises import Answer, lazy, rounding_tolerance

OPTION = re.compile(r"^- \*\*(\w)\*\* (.*?)(?=^- \*\*|\Z)", re.S | re.M)
HEDGE = re.compile(r"\b(it depends|depends|measure first|measur\w*|both|neither|all of the above|none of the above|"
                   r"only if|may|might|usually|trades?|trade-offs?|balance)\b", re.I)


def choices() -> dict[str, tuple[str, dict[str, str]]]:
    """Every multiple-choice exercise: name -> (right letter, {letter: option text})."""
    out = {}
    for ex in EXERCISES.values():
        options = dict((letter, " ".join(text.split())) for letter, text in OPTION.findall(ex.question))
        if options and (ex.check.__doc__ or "").startswith("Multiple choice"):
            out[ex.name] = (ex.solution, options)
    return out


def test_the_course_has_multiple_choice_questions_to_check():
    assert len(choices()) >= 4, sorted(choices())


def test_the_right_option_is_not_predictably_the_hedged_one():
    found = choices()
    hedged = {name: options[right] for name, (right, options) in found.items() if HEDGE.search(options[right])}
    assert len(hedged) <= len(found) / 3, (f"{len(hedged)} of {len(found)} right answers are the hedged option "
                                           f"(a learner who always picks 'it depends' passes): {hedged}")


def test_the_right_options_position_varies():
    letters = [right for right, _ in choices().values()]
    most = max(letters.count(x) for x in letters)
    assert len(set(letters)) >= 3 and most <= len(letters) / 2, f"the right letters are {letters}"


def test_the_right_option_is_not_predictably_the_longest():
    longest = [name for name, (right, options) in choices().items()
               if len(options[right]) == max(len(t) for t in options.values())]
    assert len(longest) <= len(choices()) / 2, f"the right option is the longest one in {longest}"


# --- numbers: the solution's own words are accepted ------------------------------------------------------

# Each numeric exercise's answer as its solution text states it, with the words that state it.
STATED = {
    "check_work_ratio": [(1.63, "about 1.63"), (1.6, "about 1.63")],
    "check_quantized_memory_ratio": [(0.3125, "0.3125"), (0.31, "0.3125")],
    "check_step_cost_clocks": [((1.61, 2.07), "1.61"), ((1.610, 2.070), "2.07")],
    "check_prefill_and_decode": [((32, 1), "answer = (32, 1)")],
    "check_kv_bytes": [(1_073_741_824, "1,073,741,824"), (2 ** 30, "1 GiB")],
    "check_offloaded_bytes": [(274_432, "274,432")],
    "check_idle_slots": [(40, "**40**")],
    "check_admission_step": [((8, 16), "**step 8**")],
    "check_sequences_fit": [((5, 1), "**5**")],
    "check_in_block_waste": [(12, "**12**")],
    "check_recomputed_tokens": [(64, "**64**")],
    "check_prefix_hit": [(240, "**240**")],
}


def text_of(ex) -> str:
    return f"{ex.question}\n{ex.explanation}"


@pytest.mark.parametrize("name", sorted(STATED))
def test_the_value_the_solution_states_is_accepted(name):
    ex = EXERCISES[name]
    for answer, words in STATED[name]:
        assert words in text_of(ex), (f"{name}: its text no longer says {words!r}; update STATED in "
                                      "tests/test_exercises_answers.py with what it says now")
        feedback = ex.ask(answer)
        assert feedback.correct, f"{name} rejects {answer!r}, which its solution states as {words!r}: {feedback}"


def resolved(value):
    value = value.make() if isinstance(value, lazy) else value
    return value.args[0] if isinstance(value, Answer) and len(value.args) == 1 else value


def numeric_solutions() -> dict[str, tuple[float, ...]]:
    """Exercises whose solution is a number or a tuple of numbers with a fractional part: name -> the numbers."""
    out = {}
    for ex in EXERCISES.values():
        value = resolved(ex.solution)
        parts = value if isinstance(value, tuple) else (value,)
        if all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts) \
                and any(not float(p).is_integer() for p in parts):
            out[ex.name] = tuple(float(p) for p in parts)
    return out


def test_every_numeric_exercise_with_a_fraction_is_listed_in_stated():
    unlisted = sorted(set(numeric_solutions()) - set(STATED))
    assert not unlisted, f"say in STATED how the solution text of {unlisted} states its answer"


@pytest.mark.parametrize("name", sorted(numeric_solutions()))
def test_every_rounding_the_solution_text_gives_is_accepted(name):
    """Any decimal in the question or solution within 5% of a right number is that number rounded: it must pass."""
    ex, right = EXERCISES[name], numeric_solutions()[name]
    stated = [float(x.replace(",", "")) for x in re.findall(r"(?<![\w.])(\d[\d,]*\.\d+)", text_of(ex))]
    tried = 0
    for i, exact in enumerate(right):
        for value in stated:
            if value != exact and math.isclose(value, exact, rel_tol=0.05):
                answer = tuple(value if j == i else x for j, x in enumerate(right))
                feedback = ex.ask(answer if len(answer) > 1 else answer[0])
                assert feedback.correct, f"{name}: its text says {value}, a rounding of {exact}, and the checker says {feedback}"
                tried += 1
    for i, exact in enumerate(right):  # three significant digits, as a learner copies a printed value
        answer = tuple(float(f"{exact:.3g}") if j == i else x for j, x in enumerate(right))
        assert ex.ask(answer if len(answer) > 1 else answer[0]).correct, (name, answer)


def test_rounding_tolerance_is_half_a_unit_of_the_last_digit_kept():
    assert math.isclose(rounding_tolerance(450 / 276, 2), 0.05, rel_tol=1e-6)
    assert math.isclose(rounding_tolerance(0.1875, 2), 0.005, rel_tol=1e-6)
    assert rounding_tolerance(0.0, 2) == 0.0
    assert abs(1.6 - 450 / 276) <= rounding_tolerance(450 / 276, 2) < abs(1.7 - 450 / 276)


def test_a_mistake_inside_the_tolerance_is_caught_when_the_exercise_is_written():
    with pytest.raises(ValueError, match="within the tolerance"):
        exercises.check_number(1.0, 1.0, what="x", digits=2, mistakes=[(1.01, "close")])


def test_a_rounded_mistake_still_gets_its_own_explanation():
    feedback = EXERCISES["check_quantized_memory_ratio"].check(0.19)  # 2/32 + 1/8 = 0.1875: the zero-point forgotten
    assert not feedback.correct and "zero-point" in feedback.message
