"""The exercise framework: a checker explains a wrong answer and confirms a right one, and knows its cells.

In a notebook a learner writes an answer and calls the checker as the last line of the cell::

    from kvlab.lessons.l02_kv_cache.exercises import check_kv_bytes
    answer = None          # replace None with your answer
    check_kv_bytes(answer)

The checker returns a ``Feedback`` (one line, ✅ or ❌; ``bool(feedback)`` says whether the answer is right). It never
raises: no answer yet, an answer of the wrong type, or a function answer that crashes all come back as a message.

Adding an exercise (notebook authors): write ``check_<what>(answer) -> Feedback`` in the lesson's
``kvlab/lessons/lNN_<notebook>/exercises.py`` and register it with ``@exercise(notebook, solution=..., wrong=...,
title=..., question=..., code=..., explanation=...)``. The notebook's source then holds one line,
``<!-- kvlab:exercise check_<what> -->``, which ``python -m kvlab notebooks`` expands into the question, the answer
cell and the folded solution (:func:`cells`). tests/test_course.py feeds every checker its solution (confirmed)
and its wrong answer (rejected with a message). Build the expected answer from kvlab's own functions or a hand
computation, never from a pasted number. ``check_number``, ``check_choice`` and ``check_function`` give the
messages one voice: say what was expected, name the likely mistake, never just print the answer. A checker
accepts what its own solution says ("about 1.63" is right at 1.6: ``check_number(..., digits=2)``), and a
multiple-choice key is not the hedged option by habit (tests/test_exercises_answers.py).
"""
from __future__ import annotations

import contextlib
import functools
import html
import io
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, cast

from kvlab.lessons.common.fold import folded_solution

__all__ = ["EXERCISES", "Answer", "Exercise", "Feedback", "cells", "check_choice", "method_source", "solution_code", "check_frame_function", "check_function", "check_number",
           "exercise", "exercises_for", "lazy", "multiple_choice", "right", "rounding_tolerance", "wrong"]


@dataclass(frozen=True)
class Feedback:
    """A checker's verdict: whether the answer is right, and one message that says why."""

    correct: bool
    message: str

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        return f"{'✅ Right' if self.correct else '❌ Not yet'}: {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#1b7f3b" if self.correct else "#b00020"
        return f'<div class="kvlab-feedback" style="color:{color}">{html.escape(str(self))}</div>'


def right(message: str) -> Feedback:
    return Feedback(True, message)


def wrong(message: str) -> Feedback:
    return Feedback(False, message)


class Answer:
    """What a checker is called with when it takes data beside the answer: ``Answer(my_ms, frame)``.

    For ``solution=`` / ``wrong=`` of ``@exercise``; a plain value means ``checker(value)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"Answer({', '.join(parts)})"


class lazy:
    """A solution or wrong answer computed only when a test asks for it (say, from a run of the engine)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def __repr__(self) -> str:
        return f"lazy({getattr(self.make, '__name__', 'answer')})"


ExerciseKind = Literal["choice", "number", "function", "build"]
# What one try takes, from reading the question to a checked answer: a letter; a number worked out by hand; a small
# function; a build-it (a class or a kernel of several steps, 10-15 minutes). The planned minutes of a notebook cover
# its exercises at these prices (tests/test_plans.py).
EXERCISE_MINUTES: dict[str, int] = {"choice": 2, "number": 3, "function": 6, "build": 12}


@dataclass(frozen=True)
class Exercise:
    """A registered checker with an answer it must confirm and one it must reject (used by the tests)."""

    name: str  # the checker's name, as a notebook imports it
    notebook: str  # file name in notebooks/
    check: Callable[..., Feedback]
    solution: Any  # a value, an Answer(...), or lazy(...) of either
    wrong: Any
    title: str = ""  # "### Exercise N: <title>" in the notebook
    question: str = ""  # markdown
    code: str = ""  # the answer cell, after the checker's import
    explanation: str = ""  # markdown inside the folded solution
    kind: ExerciseKind = "number"  # what it asks for, and so its minutes (EXERCISE_MINUTES)

    @property
    def minutes(self) -> int:
        """The minutes a try takes (EXERCISE_MINUTES by kind)."""
        return EXERCISE_MINUTES[self.kind]

    def ask(self, answer: Any) -> Feedback:
        """Call the checker with ``answer`` (resolving lazy(...) and Answer(...))."""
        if isinstance(answer, lazy):
            answer = answer.make()
        return self.check(*answer.args, **answer.kwargs) if isinstance(answer, Answer) else self.check(answer)


EXERCISES: dict[str, Exercise] = {}
NOT_ANSWERED = "replace `None` with your answer, then run the cell again."


def _as_feedback(result: Any, printed: str) -> Feedback:
    """A checker's result as Feedback: hand-written checkers may print their message and return a bool."""
    if isinstance(result, Feedback):
        return result
    message = printed.strip()
    for mark in ("✅ Right:", "❌ Not yet:", "✅", "❌"):
        message = message.removeprefix(mark).strip()
    ok = bool(result)
    return Feedback(ok, message or ("that is right." if ok else "that is not right yet; read the question again."))


def exercise(notebook: str, *, solution: Any, wrong: Any, title: str = "", question: str = "", code: str = "",
             explanation: str = "", kind: ExerciseKind = "number") -> Callable[[Callable[..., Any]], Callable[..., Feedback]]:
    """Register a checker for ``notebook``; the wrapped checker returns a Feedback and never raises. ``kind`` says
    what it asks for (a "choice", a "number", a "function", a "build"), which prices it (EXERCISE_MINUTES).

    A ``None`` anywhere in the call means "not answered yet" and gets a prompt to answer; an
    exception while checking (a learner's function that crashes, an answer of an unexpected type)
    comes back as a message. A checker may return Feedback, or print its message and return a bool.
    """
    if kind not in EXERCISE_MINUTES:
        raise ValueError(f"kind={kind!r}: choose one of {', '.join(EXERCISE_MINUTES)}")

    def register(fn: Callable[..., Any]) -> Callable[..., Feedback]:
        if fn.__name__ in EXERCISES:
            raise ValueError(f"an exercise named {fn.__name__!r} is already registered "
                             f"(for {EXERCISES[fn.__name__].notebook}); give the checker another name")

        @functools.wraps(fn)
        def checker(*args: Any, **kwargs: Any) -> Feedback:
            if not (args or kwargs) or any(a is None for a in (*args, *kwargs.values())):
                return Feedback(False, NOT_ANSWERED)
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    result = fn(*args, **kwargs)
            except Exception as exc:  # an answer the checker cannot use: say so, no traceback
                return Feedback(False, f"checking your answer raised {type(exc).__name__}: {exc}. "
                                       "Check its type and shape against the question.")
            return _as_feedback(result, out.getvalue())

        EXERCISES[fn.__name__] = Exercise(fn.__name__, notebook, checker, solution, wrong, title, question, code,
                                          explanation, kind)
        return checker

    return register


def method_source(cls: type, *names: str) -> str:
    """The methods ``names`` of ``cls`` as the class writes them (decorators included), one blank line apart."""
    import inspect

    return "\n\n".join(inspect.getsource(getattr(m, "fget", m)).rstrip()
                        for m in (inspect.getattr_static(cls, n) for n in names))


def solution_code(cls: type, *names: str) -> str:
    """A solution's code block, taken from the reference answer the tests check (``cls``): its methods ``names``,
    or the whole class when none are named. One home: the solution shown is the one that passes the checker
    (and a skeleton's given methods come from it with ``method_source``)."""
    import inspect

    return "```python\n" + (method_source(cls, *names) if names else inspect.getsource(cls).rstrip()) + "\n```"


def exercises_for(notebook: str) -> list[Exercise]:
    """The exercises registered for ``notebook``, in the order they were defined."""
    return [e for e in EXERCISES.values() if e.notebook == notebook]


def lesson_exercises(notebook: str) -> str:
    """The module that holds ``notebook``'s checkers: ``kvlab.lessons.lNN_<name>.exercises``."""
    return f"kvlab.lessons.l{notebook.removesuffix('.ipynb')}.exercises"


def cells(name: str, notebook: str, number: int) -> list:
    """The notebook cells of exercise ``name``: its question, an answer cell calling the checker, the folded solution."""
    from nbformat.v4 import new_code_cell, new_markdown_cell

    ex = EXERCISES.get(name)
    if ex is None:
        raise ValueError(f"{notebook} asks for exercise {name!r}, which is not registered; define it in "
                         f"kvlab/lessons/l{notebook.removesuffix('.ipynb')}/exercises.py with @exercise(...)")
    if ex.notebook != notebook:
        raise ValueError(f"exercise {name!r} belongs to {ex.notebook}, not {notebook}")
    return [new_markdown_cell(f"### Exercise {number}: {ex.title}\n\n{ex.question}"),
            new_code_cell(f"from {lesson_exercises(notebook)} import {name}\n\n{ex.code}"),
            new_markdown_cell(folded_solution(ex.explanation))]


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def rounding_tolerance(expected: float, digits: int) -> float:
    """Half a unit of the ``digits``-th significant digit of ``expected``: 0.05 for 1.63 at 2 digits.

    An answer within it of ``expected`` is ``expected`` rounded to ``digits`` significant digits or
    more, as a learner writes it ("about 1.63" -> 1.6 or 1.63; 0.1875 -> 0.19).
    """
    if expected == 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(abs(expected))) - digits + 1)
    return 0.5 * unit * (1 + 1e-9)  # the factor keeps an exact half-unit rounding inside despite float error


def check_number(answer: Any, expected: float, *, what: str, rel: float = 1e-3, digits: int | None = None,
                 mistakes: Iterable[tuple[float, str]] = (), hint: str = "", confirm: str = "") -> Feedback:
    """Compare a numeric answer with ``expected`` (relative tolerance ``rel``).

    ``digits`` also accepts ``expected`` rounded to that many significant digits (see
    :func:`rounding_tolerance`): give it where the answer is a ratio a learner rounds, never where it
    is a count. ``mistakes`` pairs the value a known mistake produces with its explanation; an answer
    equal to one of them gets that explanation. Otherwise the message says too high / too low and the ``hint``.
    A mistake inside the accepted band is a bug of the exercise: it raises ValueError.
    """
    if not _is_number(answer):
        return wrong(f"{what} should be a number, got {type(answer).__name__} {answer!r}.")
    mistakes = list(mistakes)
    band = max(rel * abs(expected), rounding_tolerance(expected, digits) if digits else 0.0)
    inside = [value for value, _ in mistakes if abs(value - expected) <= band]
    if inside:
        raise ValueError(f"check_number for {what}: the mistakes {inside} lie within the tolerance of {expected}; "
                         "tighten digits/rel or drop them")
    if math.isclose(answer, expected, rel_tol=rel) or abs(answer - expected) <= band:
        return right(confirm or f"{what} is {answer:,.6g}.")
    for value, explanation in mistakes:  # a mistake's value is recognised rounded as the right one would be
        if math.isclose(answer, value, rel_tol=rel) or (
                digits and abs(answer - value) <= rounding_tolerance(value, digits)):
            return wrong(explanation)
    return wrong(f"{answer:,.6g} is {'too high' if answer > expected else 'too low'} for {what}. {hint}".strip())


def check_choice(answer: Any, correct: str, explanations: Mapping[str, str], *, confirm: str) -> Feedback:
    """A multiple-choice answer: one letter; every wrong option has its own explanation."""
    options = sorted({correct, *explanations})
    letter = str(answer).strip().lower().strip("()")
    if letter not in options:
        return wrong(f"answer with one of the letters {', '.join(repr(o) for o in options)}, got {answer!r}.")
    return right(confirm) if letter == correct else wrong(explanations[letter])


def multiple_choice(notebook: str, name: str, *, title: str, stem: str,
                    options: Mapping[str, tuple[str, str | None]], correct: str, confirm: str, explanation: str,
                    wrong_example: str | None = None, code: str | None = None) -> Callable[..., Feedback]:
    """Register a multiple-choice exercise ``name`` for ``notebook`` and return its checker.

    ``options`` maps each letter to (option text, explanation shown when it is chosen wrongly; None for ``correct``).
    The question is ``stem``, a blank line and one ``- **a** text`` line per option; the answer cell is
    ``answer = None   # a letter: ...`` and a call of the checker, unless ``code`` says otherwise. ``wrong_example`` is
    the wrong answer the tests feed the checker (default: the first wrong letter).
    """
    if correct not in options or options[correct][1] is not None:
        raise ValueError(f"{name}: the correct letter {correct!r} must be an option with no wrong-answer explanation")
    explanations = {letter: why for letter, (_, why) in options.items() if letter != correct}
    if any(why is None for why in explanations.values()):
        raise ValueError(f"{name}: every wrong option needs an explanation")
    letters = [f'"{letter}"' for letter in options]
    question = stem + "\n\n" + "\n".join(f"- **{letter}** {text}" for letter, (text, _) in options.items())
    if code is None:
        code = f"answer = None   # a letter: {', '.join(letters[:-1])} or {letters[-1]}\n{name}(answer)"

    def check(answer: Any) -> Feedback:
        return check_choice(answer, correct, cast(dict[str, str], explanations), confirm=confirm)  # None raised above

    check.__name__ = check.__qualname__ = name
    check.__doc__ = f"Multiple choice: {title}."
    return exercise(notebook, solution=correct, wrong=wrong_example or next(iter(explanations)), title=title,
                    question=question, code=code, explanation=explanation, kind="choice")(check)


def check_function(fn: Any, cases: Sequence[tuple[dict, Any]], *, what: str,
                   explain: Callable[[dict, Any, Any], str] | None = None) -> Feedback:
    """Call a learner's function on each case ``(kwargs, expected)``; report the first mismatch.

    ``explain(kwargs, got, expected)`` turns a mismatch into a helpful sentence (default: both values).
    """
    if not callable(fn):
        return wrong(f"the answer should be a function ({what}), got {type(fn).__name__}.")
    for kwargs, expected in cases:
        call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        try:
            got = fn(**kwargs)
        except Exception as exc:
            return wrong(f"your function raised {type(exc).__name__}: {exc} when called with {call}.")
        if got != expected:
            detail = explain(kwargs, got, expected) if explain else f"expected {expected!r}"
            return wrong(f"with {call} your function returned {got!r}; {detail}")
    return right(f"{what}: your function gives the right result on all {len(cases)} cases tried.")


def check_frame_function(fn: Any, frames: Iterable[Any], reference: Callable[[Any], float],
                         slips: Callable[[Any], Iterable[tuple[float, str]]], *, what: str, unit: str,
                         mismatch: str, confirm: str) -> Feedback:
    """A learner's function ``fn(frame) -> number`` against ``reference`` on each test frame.

    ``slips(frame)`` pairs the value a known mistake produces with its explanation; ``mismatch`` says
    how the right value is computed; ``confirm`` is the message for a right answer.
    """
    if not callable(fn):
        return wrong(f"the answer should be a function {what}(frame), got {type(fn).__name__}.")
    for frame in frames:
        try:
            got = fn(frame)
        except Exception as exc:
            return wrong(f"your function raised {type(exc).__name__}: {exc} on a frame with the columns "
                         f"{list(frame.columns)}.")
        expected = reference(frame)
        if not _is_number(got):
            return wrong(f"your function should return {unit}, got {type(got).__name__} {got!r}.")
        if math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            continue
        for value, why in slips(frame):
            if math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9):
                return wrong(why)
        return wrong(f"on a test frame your function gave {got:.4g} where {expected:.4g} was expected: {mismatch}")
    return right(confirm)
