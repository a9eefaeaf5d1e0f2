"""The course's exercises: one checker per exercise, which explains a wrong answer and confirms a right one.

In a notebook a learner writes an answer and calls the checker as the last line of the cell::

    from kvlab.exercises import check_kv_bytes
    answer = None          # replace None with your answer
    check_kv_bytes(answer)

The checker returns a ``Feedback`` (shown as one line, ✅ or ❌, in the notebook; ``bool(feedback)``
says whether the answer is right). It never raises: no answer yet, an answer of the wrong type, or
a function answer that crashes all come back as a message.

Adding an exercise (notebook authors): write ``check_<what>(answer) -> Feedback`` below, under your
notebook's heading, and register it with ``@exercise(notebook, solution=..., wrong=...)``. The
solution and the wrong answer are what tests/test_course.py feeds every checker: the solution must be
confirmed, the wrong answer rejected with a message. Build the expected answer from kvlab's own
functions or a hand computation (an oracle), never from a pasted number. The helpers
``check_number``, ``check_choice`` and ``check_function`` cover most exercises and give the messages
a consistent voice: say what was expected, name the likely mistake, and never just print the answer.
"""
from __future__ import annotations

import contextlib
import functools
import html
import io
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .cache.base import kv_cache_bytes
from .experiments.memory import GIB, max_sequences, resolve_config
from .experiments.slowdown import tokens_processed

__all__ = ["EXERCISES", "Answer", "Exercise", "Feedback", "check_choice", "check_function", "check_number", "exercise",
           "exercises_for", "lazy", "right", "wrong"]


# --- the shared machinery -------------------------------------------------------------------------

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


@dataclass(frozen=True)
class Exercise:
    """A registered checker with an answer it must confirm and one it must reject (used by the tests)."""

    name: str  # the checker's name, as a notebook imports it
    notebook: str  # file name in notebooks/
    check: Callable[..., Feedback]
    solution: Any  # a value, an Answer(...), or lazy(...) of either
    wrong: Any

    def ask(self, answer: Any) -> Feedback:
        """Call the checker with ``answer`` (resolving lazy(...) and Answer(...))."""
        if isinstance(answer, lazy):
            answer = answer.make()
        if isinstance(answer, Answer):
            return self.check(*answer.args, **answer.kwargs)
        return self.check(answer)


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


def exercise(notebook: str, *, solution: Any, wrong: Any) -> Callable[[Callable[..., Any]], Callable[..., Feedback]]:
    """Register a checker for ``notebook``; the wrapped checker returns a Feedback and never raises.

    A ``None`` anywhere in the call means "not answered yet" and gets a prompt to answer; an
    exception while checking (a learner's function that crashes, an answer of an unexpected type)
    comes back as a message. A checker may return Feedback, or print its message and return a bool.
    """
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

        EXERCISES[fn.__name__] = Exercise(fn.__name__, notebook, checker, solution, wrong)
        return checker

    return register


def exercises_for(notebook: str) -> list[Exercise]:
    """The exercises registered for ``notebook``, in the order they were defined."""
    return [e for e in EXERCISES.values() if e.notebook == notebook]


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_number(answer: Any, expected: float, *, what: str, rel: float = 1e-3,
                 mistakes: Iterable[tuple[float, str]] = (), hint: str = "", confirm: str = "") -> Feedback:
    """Compare a numeric answer with ``expected`` (relative tolerance ``rel``).

    ``mistakes`` pairs the value a known mistake produces with its explanation; an answer equal to
    one of them gets that explanation. Otherwise the message says too high / too low and the ``hint``.
    """
    if not _is_number(answer):
        return wrong(f"{what} should be a number, got {type(answer).__name__} {answer!r}.")
    if math.isclose(answer, expected, rel_tol=rel):
        return right(confirm or f"{what} is {answer:,.6g}.")
    for value, explanation in mistakes:
        if math.isclose(answer, value, rel_tol=rel):
            return wrong(explanation)
    side = "too high" if answer > expected else "too low"
    return wrong(f"{answer:,.6g} is {side} for {what}. {hint}".strip())


def check_choice(answer: Any, correct: str, explanations: Mapping[str, str], *, confirm: str) -> Feedback:
    """A multiple-choice answer: one letter; every wrong option has its own explanation."""
    options = sorted({correct, *explanations})
    letter = str(answer).strip().lower().strip("()")
    if letter not in options:
        return wrong(f"answer with one of the letters {', '.join(repr(o) for o in options)}, got {answer!r}.")
    if letter == correct:
        return right(confirm)
    return wrong(explanations[letter])


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


def _say(correct: bool, message: str) -> Feedback:
    """The verdict of a hand-written checker (shown as one line when the checker ends a cell)."""
    return Feedback(bool(correct), message)


def _number(answer: Any, what: str) -> float | None:
    """``answer`` as a float, or None after printing why it is not a number (the checker then returns False)."""
    if _is_number(answer) or (isinstance(answer, np.generic) and np.issubdtype(type(answer), np.number)):
        return float(answer)
    print(wrong(f"{what} should be a number, got {answer!r}"))
    return None


def _close(a: float, b: float, rel: float = 5e-3) -> bool:
    """Equal up to rounding (relative tolerance ``rel``)."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# --- 00 start here --------------------------------------------------------------------------------

@exercise("00_start_here.ipynb", solution=(32, 1), wrong=(1, 1))
def check_prefill_and_decode(answer: Any) -> Feedback:
    """With a 32-token prompt and a KV cache: tokens processed by the step of token 0, and of token 5."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_is_number(a) for a in answer)):
        return wrong(f"answer with two numbers, (token 0, token 5), got {answer!r}.")
    first, later = answer
    want_first, want_later = tokens_processed("dynamic", 32, 0), tokens_processed("dynamic", 32, 5)
    if (first, later) == (want_first, want_later):
        return right("token 0 comes out of the prefill, which reads the whole 32-token prompt in one step; "
                     "with a cache every later step processes only the newest token.")
    if first != want_first:
        return wrong("look at token 0 again: it is produced by the prefill, the step that reads the prompt. "
                     "How many tokens does the prompt have?")
    if later == tokens_processed("none", 32, 5):
        return wrong("that is what a step processes *without* a cache (prompt + tokens so far). "
                     "With a cache, the step of token 5 only has to process the one newest token.")
    return wrong("token 0 is right. For token 5: with a KV cache, what does a decode step feed through the model?")


@exercise("00_start_here.ipynb", solution="b", wrong="a")
def check_comparing_machines(answer: Any) -> Feedback:
    """Multiple choice: a neighbour's step times are half of yours for the same settings. What follows?"""
    return check_choice(answer, "b", {
        "a": "the model, the prompt and the seed are the same, so the work is the same. Time depends on the "
             "machine doing the work: its device, cores, threads and what else is running.",
        "c": "a bug would change the tokens, not only the time. Same settings, same tokens, different machine: "
             "different time is expected.",
    }, confirm="times belong to a machine. Compare the shapes of the curves (flat vs climbing, ratios "
               "between settings), and quote the setup report with any number you share.")


# --- 01 the slowdown ------------------------------------------------------------------------------

def _work_ratio(prompt: int, early: int, late: int, cache: str = "none") -> float:
    return tokens_processed(cache, prompt, late) / tokens_processed(cache, prompt, early)


@exercise("01_the_slowdown.ipynb", solution=450 / 276, wrong=194 / 20)
def check_work_ratio(answer: Any) -> Feedback:
    """Prompt 256, no cache: how many times more tokens does the step of token 194 process than token 20's?"""
    return check_number(
        answer, _work_ratio(256, 20, 194), what="the work ratio (token 194 vs token 20, no cache)", rel=5e-3,
        mistakes=[(194 / 20, "that ratio leaves out the prompt. Without a cache every step recomputes the "
                             "whole prompt too: the step of token i processes prompt + i tokens."),
                  (1.0, "1 is the ratio *with* a cache, where every decode step processes one token. "
                        "Without a cache each step reprocesses the prompt and every token so far."),
                  (276 / 450, "you divided the early step by the late one; the question asks how many "
                              "times *more* the late step does.")],
        hint="The step that writes token i processes prompt + i tokens; divide late by early.",
        confirm=f"(256 + 194) / (256 + 20) = {_work_ratio(256, 20, 194):.3f}. The measured ratio is usually "
                "a little lower, because part of every step's time does not grow with the text.")


def _total_processed(cache: str, prompt_tokens: int, new_tokens: int) -> int:
    return sum(tokens_processed(cache, prompt_tokens, i) for i in range(new_tokens))


def _forgets_the_prefill(cache: str, prompt_tokens: int, new_tokens: int) -> int:
    """A plausible wrong answer: every step of a cached run counted as one token, the prefill too."""
    if cache == "none":
        return sum(prompt_tokens + i for i in range(new_tokens))
    return new_tokens


def _explain_total(kwargs: dict, got: Any, expected: Any) -> str:
    cache, t, n = kwargs["cache"], kwargs["prompt_tokens"], kwargs["new_tokens"]
    steps = [tokens_processed(cache, t, i) for i in range(min(n, 3))]
    return (f"the right total is {expected:,}. Step by step it processes {', '.join(map(str, steps))}"
            f"{', ...' if n > 3 else ''} tokens: step 0 is the prefill of the whole prompt, then "
            + ("each step recomputes the prompt and every token so far." if cache == "none"
               else "each step processes only the newest token."))


@exercise("01_the_slowdown.ipynb",
          solution=lambda cache, prompt_tokens, new_tokens: (
              new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2 if cache == "none"
              else prompt_tokens + new_tokens - 1),
          wrong=_forgets_the_prefill)
def check_total_processed(answer: Any) -> Feedback:
    """A function total(cache, prompt_tokens, new_tokens): tokens pushed through the model for a whole generation."""
    cases = [(dict(cache=c, prompt_tokens=t, new_tokens=n), _total_processed(c, t, n))
             for c in ("none", "dynamic") for t, n in ((32, 1), (32, 10), (8, 200), (256, 400))]
    feedback = check_function(answer, cases, what="total tokens processed", explain=_explain_total)
    if feedback:
        return right(feedback.message + " Without a cache the total grows with the square of the length "
                     "(n·T + n(n−1)/2); with one it grows linearly (T + n − 1).")
    return feedback


# --- 02 the KV cache ------------------------------------------------------------------------------

def _kv_bytes(model: str, tokens: int, batch: int = 1, bytes_per_element: float = 2, kv_heads: int | None = None) -> int:
    cfg = resolve_config(model)
    heads = cfg.num_kv_heads if kv_heads is None else kv_heads
    return int(kv_cache_bytes(cfg.num_layers, heads, cfg.head_dim, tokens, batch, bytes_per_element))


@exercise("02_kv_cache.ipynb", solution=2 * 32 * 8 * 128 * 8192 * 2, wrong=2 * 32 * 32 * 128 * 8192 * 2)
def check_kv_bytes(answer: Any) -> Feedback:
    """Bytes of KV cache for Llama-3-8B (GQA) holding one sequence of 8,192 tokens in fp16."""
    model, tokens = "Llama-3-8B (GQA)", 8192
    expected = _kv_bytes(model, tokens)
    cfg = resolve_config(model)
    return check_number(
        answer, expected, what="the KV cache of Llama-3-8B at 8,192 tokens (fp16, batch 1)",
        mistakes=[(expected / GIB, "that looks like GiB; the question asks for bytes (1 GiB = 2**30 bytes)."),
                  (_kv_bytes(model, tokens, kv_heads=cfg.num_heads),
                   f"you used the {cfg.num_heads} query heads. With grouped-query attention only the "
                   f"{cfg.num_kv_heads} key/value heads are stored: that is the whole point of GQA."),
                  (expected / 2, "half the right value: did you count the K and the V (the factor 2)?"),
                  (_kv_bytes(model, tokens, bytes_per_element=4),
                   "that is fp32 (4 bytes per element); fp16 takes 2 bytes."),
                  (_kv_bytes(model, tokens, bytes_per_element=1),
                   "that is 1 byte per element (int8); fp16 takes 2 bytes.")],
        hint="bytes = 2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element; read the "
             "numbers from kvlab.PUBLISHED_CONFIGS['Llama-3-8B (GQA)'].",
        confirm=f"2 × {cfg.num_layers} × {cfg.num_kv_heads} × {cfg.head_dim} × {tokens:,} × 1 × 2 = "
                f"{expected:,} bytes, exactly {expected / GIB:g} GiB for one conversation.")


@exercise("02_kv_cache.ipynb", solution=max_sequences("Llama-3-8B (GQA)", 32768, 80), wrong=20)
def check_sequences_that_fit(answer: Any) -> Feedback:
    """How many 32K-token sequences of Llama-3-8B (fp16 weights and cache) fit in an 80 GiB GPU?"""
    model, context, gpu = "Llama-3-8B (GQA)", 32768, 80
    expected = max_sequences(model, context, gpu)
    per_seq = _kv_bytes(model, context)
    cfg = resolve_config(model)
    if _is_number(answer) and not float(answer).is_integer():
        return wrong("a number of whole sequences: round down, since a sequence that does not fit "
                     "completely cannot be served.")
    return check_number(
        answer, expected, what="sequences of 32,768 tokens that fit", rel=0,
        mistakes=[(math.floor(gpu * GIB / per_seq), "that leaves no room for the weights: the fp16 weights "
                   "of an 8B model take about 15 GiB of the 80 before any cache is stored."),
                  (math.ceil((gpu * GIB - cfg.num_parameters() * 2) / per_seq),
                   "rounded up: the last sequence would not fit completely. Round down.")],
        hint="memory left for the cache = 80 GiB − parameters × 2 bytes; divide by one sequence's KV bytes "
             "and round down (kvlab.experiments.max_sequences does exactly this).",
        confirm=f"{expected} sequences: each holds {per_seq / GIB:g} GiB of cache. At 32K tokens the cache, "
                "not the weights, decides how many conversations one GPU can hold.")


@exercise("02_kv_cache.ipynb", solution="b", wrong="a")
def check_what_the_cache_keeps(answer: Any) -> Feedback:
    """Multiple choice: two users send the same prompt one after the other; what does the first one's KV cache do?"""
    return check_choice(answer, "b", {
        "a": "a KV cache is not a cache of answers: it holds the keys and values of one ongoing generation "
             "and is freed when that generation ends. Nothing returns a stored answer.",
        "c": "the cache holds keys and values, not the sampled tokens; with sampling the second answer can "
             "differ, and it is generated token by token either way.",
    }, confirm="the KV cache is the working memory of one generation. A server with prefix caching "
               "(notebook 07) can reuse the keys and values of a shared prompt prefix and skip part of the "
               "prefill, but every token of the answer is still generated.")


# --- 03 cache strategies --------------------------------------------------------------------------

@exercise("03_cache_strategies.ipynb", solution=4 / 32 + 2 / 32, wrong=4 / 32)
def check_quantized_memory_ratio(answer: Any) -> Feedback:
    """4-bit codes, groups of 32 values, fp32 scale and zero-point, residual 0: bytes as a fraction of fp32's."""
    from .experiments.strategies import ideal_memory_ratio

    setting = {"cache": "quantized", "bits": 4, "group_size": 32, "residual": 0}
    expected = ideal_memory_ratio(setting, head_dim=32, tokens=1000, element_bytes=4)
    return check_number(
        answer, expected, what="the 4-bit cache's size as a fraction of the fp32 cache's", rel=1e-3,
        mistakes=[(4 / 32, "that counts only the 4-bit codes. Each group of 32 values also stores a scale and a "
                           "zero-point in fp32 (4 bytes each) to turn the codes back into numbers."),
                  (4 / 32 + 1 / 32, "you counted the scale but not the zero-point: asymmetric quantization stores "
                                    "both for every group."),
                  (100 * expected, "that is a percentage; answer with a fraction (0.5 means half)."),
                  (1 / expected, "that is how many times smaller it is; the question asks for the fraction.")],
        hint="per value: bits / 32 for the code, plus (2 × 32 bits) / (group_size × 32 bits) for the scale and "
             "zero-point shared by its group.",
        confirm=f"4/32 + 2/32 = {expected:g}: the scales and zero-points cost half as much as the codes "
                "themselves. Compare with the ideal and measured ratios in the panel's table.")


@exercise("03_cache_strategies.ipynb", solution=(133 + 1) * 2 * 4 * 2 * 32 * 4, wrong=133 * 2 * 4 * 2 * 32 * 4)
def check_offloaded_bytes(answer: Any) -> Feedback:
    """Recall model (4 layers, 2 kv heads, head_dim 32, fp32): bytes an offloaded cache moves in a decode step with 133 tokens stored."""
    per_token = kv_cache_bytes(4, 2, 32, 1, 1, 4)
    stored = 133
    expected = (stored + 1) * per_token
    return check_number(
        answer, expected, what="bytes moved in one decode step", rel=0,
        mistakes=[(stored * per_token, "that counts only the history read back in. The step also writes the new "
                                       "token's K and V out to the slower tier."),
                  (per_token, "that is one token (both directions would be more): every step reads the whole "
                              "stored history of every layer back in."),
                  (expected / 4, "that is one layer; the cache moves every layer's history each step."),
                  (expected / 2, "half: did you count the keys and the values (the factor 2)?")],
        hint="Every decode step reads each layer's stored tokens in and writes the new token out; one token "
             "of all layers, K and V, is 2 × 4 × 2 × 32 × 4 bytes.",
        confirm=f"(133 read + 1 written) × {per_token:,} bytes = {expected:,} bytes, and the count grows with "
                "every token: offloading turns context length into traffic on every step.")


@exercise("03_cache_strategies.ipynb", solution="b", wrong="a")
def check_dominant_constraint(answer: Any) -> Feedback:
    """Multiple choice: long contracts, memory full, compute idle, exact quotes, steady streaming: what first?"""
    return check_choice(answer, "b", {
        "a": "2 bits saves the most memory, but on the recall task it lost most answers (look at the accuracy "
             "by bits). Quoting clause numbers is exactly this kind of recall: check before trading it away.",
        "c": "a static cache reserves the full maximum length for every conversation: it adds reserved bytes, it "
             "does not remove any. What fixed shapes buy (compiled steps) helps compute, and compute is idle.",
        "d": "offloading frees GPU memory, but every decode step then moves each layer's whole history over the "
             "host link: time between tokens grows with the 30,000-token context, and steady streaming is a "
             "requirement here.",
    }, confirm="memory is the constraint, so shrink the bytes per token, but quality is a requirement too: "
               "start with 8 or 4 bits and a residual window, and measure task accuracy at the real context length "
               "against the exact cache before adopting it.")


# --- 04 the four clocks ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def _journey_clocks_at(step_s: float) -> tuple[float, float]:
    """(TTFT, E2E) of lesson 04's watched request when every engine step costs ``step_s`` (virtual clock)."""
    from .experiments.four_clocks import journey_workload
    from .experiments.serving_run import FixedStepCostExecutor, serve
    from .experiments.slowdown import slowdown_config

    config = slowdown_config()
    requests = journey_workload(config.vocab_size)
    run = serve(config, requests, clock="virtual", executor=FixedStepCostExecutor(step_s), threads=None,
                scheduler=_journey_scheduler())
    c = run.record(requests[-1].request_id).clocks()
    return c["ttft_s"], c["e2e_s"]


def _journey_scheduler():
    from .serving.scheduler import SchedulerConfig
    return SchedulerConfig(max_seqs=2, max_batch_tokens=256)  # run_journey's defaults


@exercise("04_four_clocks.ipynb", solution=_journey_clocks_at(0.020), wrong=_journey_clocks_at(0.010))
def check_step_cost_clocks(answer: Any) -> Feedback:
    """(TTFT, E2E) in seconds of the watched request of lesson 04's exact run if every step cost 20 ms."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_is_number(a) for a in answer)):
        return wrong(f"answer with two numbers in seconds, (ttft, e2e), got {answer!r}.")
    ttft, e2e = _journey_clocks_at(0.020)
    at10 = _journey_clocks_at(0.010)
    arrival = 0.010
    a_ttft, a_e2e = (float(a) for a in answer)
    steps_to_first = round((ttft + arrival) / 0.020)
    tokens = round((e2e - ttft) / 0.020) + 1
    if math.isclose(a_ttft, ttft, rel_tol=1e-3) and math.isclose(a_e2e, e2e, rel_tol=1e-3):
        return right(f"TTFT = {steps_to_first} steps × 20 ms − 10 ms = {ttft:.3f} s and E2E = TTFT + {tokens - 1} × "
                     f"20 ms = {e2e:.3f} s; the engine agrees. Twice the step cost doubles the time spent "
                     "computing, and here the queue too, since the queue is made of other requests' steps.")
    if math.isclose(a_ttft, at10[0], rel_tol=1e-3):
        return wrong("those are the 10 ms values printed above; every step now costs 20 ms.")
    if math.isclose(a_ttft, ttft + arrival, rel_tol=1e-3):
        return wrong("the clock starts at the request's arrival (10 ms), not at 0: subtract it.")
    if math.isclose(a_ttft, ttft, rel_tol=1e-3) and math.isclose(a_e2e, e2e + 0.020, rel_tol=1e-3):
        return wrong(f"after the first token come {tokens - 1} more tokens, one per step, not {tokens}.")
    if math.isclose(a_ttft, ttft, rel_tol=1e-3):
        return wrong("TTFT is right; E2E = TTFT + (n − 1) steps, with n the number of output tokens.")
    return wrong(f"count the steps up to its first token (it comes from step {steps_to_first - 1}, counting from "
                 "0), multiply by 20 ms and subtract its arrival (10 ms); then one more step per further token.")


def _share_above_mean_wrong(values):
    """A plausible slip for the tests: the share above the median."""
    v = sorted(values)
    return sum(x > v[len(v) // 2] for x in v) / len(v)


def _share_above_mean(values):
    """The solution, for the tests."""
    mean = sum(values) / len(values)
    return sum(v > mean for v in values) / len(values)


@exercise("04_four_clocks.ipynb", solution=_share_above_mean, wrong=_share_above_mean_wrong)
def check_share_above_mean(answer: Any) -> Feedback:
    """A function share_above_mean(values) -> the fraction of values strictly above their mean."""
    cases = [({"values": [10, 11, 12, 13, 400]}, 0.2), ({"values": [1, 2, 3, 4]}, 0.5),
             ({"values": [5, 5, 5, 5]}, 0.0), ({"values": [12, 15, 14, 13, 16, 11, 14, 250, 13, 15]}, 0.1)]

    def explain(kwargs, got, expected):
        values = kwargs["values"]
        median_share = _share_above_mean_wrong(values)
        if (isinstance(got, (int, float)) and math.isclose(got, median_share)
                and not math.isclose(expected, median_share)):
            return f"expected {expected}: that is the share above the median; compare with the mean."
        if isinstance(got, (int, float)) and 1 < got <= 100:
            return f"expected {expected}: give a fraction between 0 and 1, not a percentage or a count."
        return f"expected {expected} (values strictly above mean = {sum(values) / len(values):g}, over {len(values)})."

    return check_function(answer, [(k, v) for k, v in cases], what="share_above_mean", explain=explain)


# --- 05 batching -----------------------------------------------------------------------------------
EX05_OUTPUTS = (8, 16, 32, 64)  # output tokens of the four requests in exercises 05.1 and 05.2
EX05_MAX_SEQS = 2


def _idle_slots(max_new_tokens: Sequence[int] = EX05_OUTPUTS, max_seqs: int = EX05_MAX_SEQS) -> dict:
    from .experiments.batching import idle_slots
    return idle_slots(max_new_tokens, max_seqs)


@exercise("05_batching.ipynb", solution=_idle_slots()["idle"], wrong=_idle_slots()["used"])
def check_idle_slots(answer: Any) -> Feedback:
    """Decode slots left idle by static batching of EX05_OUTPUTS, EX05_MAX_SEQS at a time (slot = sequence x step)."""
    s = _idle_slots()
    return check_number(
        answer, s["idle"], what="idle slots", rel=0,
        mistakes=[(s["used"], "that is the number of slots that did produce a token; count the empty ones."),
                  (s["slots"], "that is every slot of every batch; subtract those that produced a token.")],
        hint=f"batch the requests {EX05_MAX_SEQS} at a time, in order; each batch lasts as long as its longest "
             "member, and a finished member's slot stays empty until the batch ends.",
        confirm=f"{s['slots']} slots ran and {s['used']} produced a token: {s['idle']} idle ({s['idle_share']:.0%}). "
                "Continuous batching hands a freed slot to the next request.")


@functools.lru_cache(maxsize=8)
def admission_steps(policy: str, max_new_tokens: Sequence[int] = EX05_OUTPUTS, max_seqs: int = EX05_MAX_SEQS,
                    prompt_tokens: int = 16) -> dict:
    """The step at which each request of exercise 05.2 is first scheduled, from a run of the engine's scheduler."""
    from .experiments.serving_run import FixedStepCostExecutor, serve
    from .model.config import tiny_llama
    from .serving.scheduler import SchedulerConfig
    from .workload import Request

    requests = [Request(i, prompt_tokens, o, 0.0, "exercise", prompt=[1] * prompt_tokens)
                for i, o in enumerate(max_new_tokens)]
    run = serve(tiny_llama(), requests, clock="virtual", executor=FixedStepCostExecutor(0.01), threads=None,
                scheduler=SchedulerConfig(policy=policy, max_seqs=max_seqs, max_batch_tokens=64))
    return {int(k): int(v) for k, v in run.steps.groupby("request_id")["step"].min().items()}


@exercise("05_batching.ipynb", solution=(admission_steps("continuous")[2], admission_steps("static")[2]),
          wrong=(admission_steps("continuous")[2], admission_steps("continuous")[2]))
def check_admission_step(answer: Any) -> Feedback:
    """(continuous, static): the step, from 0, at which request 2 (the third) of exercise 05.2 is admitted."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_is_number(a) for a in answer)):
        return wrong(f"answer with two step numbers, (continuous, static), got {answer!r}.")
    c, s = answer
    truth_c, truth_s = admission_steps("continuous")[2], admission_steps("static")[2]
    if (c, s) == (truth_c, truth_s):
        return right(f"continuous: step {truth_c} (request 0's slot frees after its {EX05_OUTPUTS[0]} tokens); "
                     f"static: step {truth_s} (the batch waits for request 1's {EX05_OUTPUTS[1]} tokens).")
    hints = []
    if c != truth_c:
        hints.append("continuous: a slot is handed on in the step after its request's last token, and request "
                     "0's prefill step already produced its first token")
    if s != truth_s:
        hints.append("static: nobody joins until every member of the batch is done")
    return wrong("; ".join(hints) + ".")


# --- 07 memory is capacity -------------------------------------------------------------------------
EX07_LENGTHS = (100, 40, 300, 17, 250, 50)  # tokens each sequence reaches, in arrival order
EX07_BLOCKS, EX07_BLOCK_SIZE, EX07_RESERVE = 48, 16, 512


def _fit_07() -> tuple[int, int]:
    from .experiments.capacity import block_manager_fit
    return block_manager_fit(EX07_LENGTHS, EX07_BLOCKS, EX07_BLOCK_SIZE), EX07_BLOCKS * EX07_BLOCK_SIZE // EX07_RESERVE


def _fit_07_by_tokens() -> int:
    from .experiments.capacity import fit_in_order
    return fit_in_order(EX07_LENGTHS, EX07_BLOCKS * EX07_BLOCK_SIZE)


@exercise("07_memory_is_capacity.ipynb", solution=_fit_07(), wrong=(_fit_07_by_tokens(), _fit_07()[1]))
def check_sequences_fit(answer: Any) -> Feedback:
    """(paged, reserved): sequences of EX07_LENGTHS that fit in EX07_BLOCKS blocks, or reserving EX07_RESERVE each."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_is_number(a) for a in answer)):
        return wrong(f"answer with two whole numbers, (paged, reserved), got {answer!r}.")
    p, r = answer
    truth_p, truth_r = _fit_07()
    if (p, r) == (truth_p, truth_r):
        blocks = [-(-n // EX07_BLOCK_SIZE) for n in EX07_LENGTHS]
        return right(f"paged: {truth_p} (blocks {blocks} pass {EX07_BLOCKS} at the next one); reserved: "
                     f"{EX07_BLOCKS * EX07_BLOCK_SIZE} // {EX07_RESERVE} = {truth_r}.")
    hints = []
    if p != truth_p and p == _fit_07_by_tokens():
        hints.append("paged: you added tokens; each sequence takes whole blocks, ceil(n / 16) of them")
    elif p != truth_p:
        hints.append(f"paged: add ceil(n / 16) blocks per sequence, in order, until the next would pass {EX07_BLOCKS}")
    if r != truth_r:
        hints.append(f"reserved: every sequence sets aside {EX07_RESERVE} tokens whatever its length")
    return wrong("; ".join(hints) + ".")


@exercise("07_memory_is_capacity.ipynb", solution=-(-100 // 16) * 16 - 100, wrong=100 % 16)
def check_in_block_waste(answer: Any) -> Feedback:
    """Empty slots in the last block of a 100-token sequence with blocks of 16."""
    tokens, block_size = 100, 16
    blocks = -(-tokens // block_size)
    return check_number(
        answer, blocks * block_size - tokens, what="wasted slots", rel=0,
        mistakes=[(tokens % block_size, "that is how many tokens sit in the last block; count the empty slots "
                                        "next to them.")],
        hint="round the tokens up to whole blocks, then subtract the tokens.",
        confirm=f"{blocks} blocks hold {blocks * block_size} slots for {tokens} tokens: "
                f"{blocks * block_size - tokens} empty.")


def prefix_hit_tokens(system_tokens: int = 250, prompt_tokens: int = 300, block_size: int = 16) -> int:
    """Prompt tokens of a second request found in the prefix cache after a first with the same system prompt."""
    from .serving.block_manager import BlockManager
    from .serving.sequence import SamplingParams, Sequence as EngineSequence

    system = list(range(system_tokens))
    own = prompt_tokens - system_tokens
    first = EngineSequence(0, system + [1000 + i for i in range(own)], 1, SamplingParams(), None, 0.0)
    second = EngineSequence(1, system + [2000 + i for i in range(own)], 1, SamplingParams(), None, 0.0)
    bm = BlockManager(2 * -(-prompt_tokens // block_size) + 1, block_size)
    bm.allocate(first)
    first.num_computed_tokens = first.num_tokens  # its prompt was computed: its full blocks become cacheable
    bm.cache_full_blocks(first)
    return len(bm.match_prefix(second)) * block_size


@exercise("07_memory_is_capacity.ipynb", solution=prefix_hit_tokens(), wrong=250)
def check_prefix_hit(answer: Any) -> Feedback:
    """Prompt tokens of a 300-token request (250-token system prompt + its own) reused from the prefix cache."""
    system_tokens, block_size = 250, 16
    truth = prefix_hit_tokens(system_tokens, 300, block_size)
    return check_number(
        answer, truth, what="tokens reused", rel=0,
        mistakes=[(system_tokens, "only whole blocks are shared; the block that mixes system prompt and the "
                                  "user's tokens is not."),
                  (-(-system_tokens // block_size) * block_size, "that rounds up; the last system-prompt block also "
                                                                 "holds the user's tokens, so its hash differs.")],
        hint=f"count the blocks of {block_size} tokens that hold nothing but the system prompt.",
        confirm=f"{system_tokens} // {block_size} = {truth // block_size} full blocks hold only system prompt: "
                f"{truth} tokens reused. The next block mixes system prompt and the user's words, so its hash differs.")



# --- 08 measure a real server ----------------------------------------------------------------------

def _overhead_ms(frame) -> float:
    """The reference answer of exercise 08.1: median over requests of client TTFT (from sending) − engine TTFT, ms."""
    return float(((frame["client_ttft_from_sent_s"] - frame["engine_ttft_s"]) * 1e3).median())


def _overhead_cases() -> list:
    """Hand-made side-by-side frames (seconds) on which each common slip gives its own number."""
    import pandas as pd

    return [
        # differences 1, 18, 3 ms -> median 3; difference of medians 18 - 12 = 6; mean 7.33; from scheduled 5
        pd.DataFrame({"client_ttft_s": [0.012, 0.032, 0.020], "client_ttft_from_sent_s": [0.011, 0.030, 0.018],
                      "engine_ttft_s": [0.010, 0.012, 0.015]}),
        # differences 0.5, 2, 4, 4 ms -> median 3 (mean of the middle two); difference of medians 2; mean 2.625
        pd.DataFrame({"client_ttft_s": [0.0050, 0.0090, 0.0300, 0.0065],
                      "client_ttft_from_sent_s": [0.0045, 0.0080, 0.0250, 0.0060],
                      "engine_ttft_s": [0.0040, 0.0060, 0.0210, 0.0020]}),
    ]


def _overhead_slips(frame) -> list[tuple[float, str]]:
    sent, scheduled, engine = (frame[c] * 1e3 for c in ("client_ttft_from_sent_s", "client_ttft_s", "engine_ttft_s"))
    return [(_overhead_ms(frame) / 1e3, "that looks like seconds; return milliseconds."),
            (float((scheduled - engine).median()), "client_ttft_s starts at the scheduled arrival, so it also holds "
             "the client's own send delay; start the client's clock when the request was sent "
             "(client_ttft_from_sent_s)."),
            (float(sent.median() - engine.median()), "a difference of medians is not the median of the "
             "differences: subtract per request first, then take the median."),
            (float((sent - engine).mean()), "that is the mean of the differences; one slow request pulls it "
             "around. Take the median.")]


@exercise("08_measure_a_real_server.ipynb", solution=_overhead_ms,
          wrong=lambda frame: float(frame["client_ttft_from_sent_s"].median() - frame["engine_ttft_s"].median()) * 1e3)
def check_http_overhead(answer: Any) -> Feedback:
    """A function overhead_ms(frame): median over requests of client TTFT (from sending) − engine TTFT, in ms."""
    if not callable(answer):
        return wrong(f"the answer should be a function overhead_ms(frame), got {type(answer).__name__}.")
    for frame in _overhead_cases():
        try:
            got = answer(frame)
        except Exception as exc:
            return wrong(f"your function raised {type(exc).__name__}: {exc} on a frame with the columns "
                         f"{list(frame.columns)}.")
        expected = _overhead_ms(frame)
        if not _is_number(got):
            return wrong(f"your function should return a number of milliseconds, got {type(got).__name__} {got!r}.")
        if math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            continue
        for value, why in _overhead_slips(frame):
            if math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9):
                return wrong(why)
        return wrong(f"on a test frame your function gave {got:.4g} ms where {expected:.4g} ms was expected. Per "
                     "request: client_ttft_from_sent_s − engine_ttft_s, times 1000; then the median.")
    return right("the median of the per-request differences, in ms, on every test frame. It is always >= 0: "
                 "the client sends before the server receives, and reads the token after the engine wrote it.")


def _output_tokens_per_s(frame) -> float:
    """The reference answer of exercise 08.2: output tokens of completed requests / (last event − first arrival)."""
    done = frame[frame["status"] == "completed"]
    return float(done["output_tokens"].sum() / (frame["finished_s"].max() - frame["scheduled_s"].min()))


def _throughput_cases() -> list:
    """Hand-made requests frames (seconds): overlapping requests, a failure, a run that does not start at 0."""
    import pandas as pd

    nan = float("nan")
    return [
        # 30 tokens completed over 0.5 -> 2.0 s = 20 tok/s; the failed request's 3 tokens do not count
        pd.DataFrame({"status": ["completed", "completed", "failed"], "scheduled_s": [0.5, 0.7, 1.0],
                      "finished_s": [1.5, 2.0, 1.2], "output_tokens": [10, 20, 3], "e2e_s": [1.0, 1.3, nan]}),
        # the run lasts until its last event, a timeout at 2.0 s: 24 tokens / 2.0 s = 12 tok/s
        pd.DataFrame({"status": ["completed", "completed", "failed"], "scheduled_s": [0.0, 0.2, 0.4],
                      "finished_s": [1.0, 0.8, 2.0], "output_tokens": [16, 8, 0], "e2e_s": [1.0, 0.6, nan]}),
    ]


def _throughput_slips(frame) -> list[tuple[float, str]]:
    done = frame[frame["status"] == "completed"]
    tokens, span = done["output_tokens"].sum(), frame["finished_s"].max() - frame["scheduled_s"].min()
    return [(frame["output_tokens"].sum() / span, "only completed requests count: a failed request delivered "
             "no answer, whatever it streamed before failing."),
            (tokens / done["e2e_s"].sum(), "the requests overlap in time: divide by the run's duration, not by "
             "the sum of their E2E times."),
            (tokens / frame["finished_s"].max(), "the run's clock starts at the first scheduled arrival, not at 0; "
             "subtract it."),
            ((done["output_tokens"] / done["e2e_s"]).mean(), "that averages each request's own pace; throughput "
             "is the service's total over the run's duration."),
            (tokens / (done["finished_s"].max() - frame["scheduled_s"].min()), "the run lasts until its last "
             "event, a failure included: take the last finished_s of every request.")]


@exercise("08_measure_a_real_server.ipynb", solution=_output_tokens_per_s,
          wrong=lambda frame: float(frame.loc[frame["status"] == "completed", "output_tokens"].sum()
                                    / frame.loc[frame["status"] == "completed", "e2e_s"].sum()))
def check_output_tokens_per_s(answer: Any) -> Feedback:
    """A function throughput(frame): output tokens per second of a run from its requests frame, as vLLM counts it."""
    if not callable(answer):
        return wrong(f"the answer should be a function throughput(frame), got {type(answer).__name__}.")
    for frame in _throughput_cases():
        try:
            got = answer(frame)
        except Exception as exc:
            return wrong(f"your function raised {type(exc).__name__}: {exc} on a frame with the columns "
                         f"{list(frame.columns)}.")
        expected = _output_tokens_per_s(frame)
        if not _is_number(got):
            return wrong(f"your function should return tokens per second, got {type(got).__name__} {got!r}.")
        if math.isclose(got, expected, rel_tol=1e-6):
            continue
        for value, why in _throughput_slips(frame):
            if math.isclose(got, value, rel_tol=1e-6):
                return wrong(why)
        return wrong(f"on a test frame your function gave {got:.4g} where {expected:.4g} tokens/s was expected: "
                     "output tokens of completed requests / (last finished_s − first scheduled_s).")
    return right("completed output tokens over the run's duration, on every test frame: what the service "
                 "delivered. What one person saw is another clock (TTFT, TPOT, E2E).")


@exercise("08_measure_a_real_server.ipynb", solution="b", wrong="a")
def check_rejections_and_quantiles(answer: Any) -> Feedback:
    """Multiple choice: a good TTFT p90 is reported at a rate where many requests got 429. What follows?"""
    return check_choice(answer, "b", {
        "a": "the server answered only part of that load; the rest got 429 and no answer at all. The quantiles "
             "describe only the requests that completed.",
        "c": "the load generator keeps a record of every request it was asked to send, rejected ones included "
             "(fail_reason http_429): that is how you could count them.",
    }, confirm="latency quantiles are computed over completed requests only. A rejected user got no answer at "
               "all, so the counts (completed, rejected, failed) belong next to every quantile, and goodput "
               "(requests/s that met a target) is the number to compare across loads.")


# --- 06 under load ---------------------------------------------------------------------------------
EX06_CURVES = (  # (offered req/s, achieved / offered, p95 TTFT s, TTFT SLO s): synthetic service curves
    dict(offered=[1, 2, 3, 4, 5], throughput_ratio=[1.0, 0.99, 0.97, 0.8, 0.6], ttft_p95=[0.1, 0.2, 0.9, 5, 9],
         slo_ttft_s=2.0),
    dict(offered=[1, 2, 3, 4, 5], throughput_ratio=[1.0, 0.99, 0.97, 0.8, 0.6], ttft_p95=[0.1, 0.2, 0.9, 5, 9],
         slo_ttft_s=0.5),
    dict(offered=[0.5, 1, 2], throughput_ratio=[0.95, 0.94, 0.93], ttft_p95=[3.0, 4.0, 5.0], slo_ttft_s=1.0),
    dict(offered=[0.5, 1, 2], throughput_ratio=[1.0, 1.0, 0.99], ttft_p95=[0.1, 0.1, 0.2], slo_ttft_s=1.0),
    dict(offered=[1, 2, 3, 4], throughput_ratio=[1.0, 0.85, 0.95, 0.95], ttft_p95=[0.1, 0.2, 0.2, 0.2],
         slo_ttft_s=1.0),
)


def _knee_06(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    from .serving.sweep import find_knee

    keeps = [r >= 0.9 and t <= slo_ttft_s for r, t in zip(throughput_ratio, ttft_p95)]
    i = find_knee(offered, keeps)
    return None if i is None else offered[i]


def _knee_06_last_ok(offered, throughput_ratio, ttft_p95, slo_ttft_s):  # a wrong answer: the last level that keeps up
    ok = [x for x, r, t in zip(offered, throughput_ratio, ttft_p95) if r >= 0.9 and t <= slo_ttft_s]
    return ok[-1] if ok else None


@exercise("06_under_load.ipynb", solution=_knee_06, wrong=_knee_06_last_ok)
def check_knee(answer: Any) -> Feedback:
    """A function knee(offered, throughput_ratio, ttft_p95, slo_ttft_s) -> the knee's offered load, or None."""
    cases = [(c, _knee_06(**c)) for c in EX06_CURVES]

    def explain(kwargs: dict, got: Any, expected: Any) -> str:
        if expected is None and got is not None:
            return ("expected None: either the lowest load already fails (no load is safe) or no level fails "
                    "(the knee lies beyond the loads tried).")
        if got == _knee_06_last_ok(**kwargs):
            return ("that is the last level that keeps up, but the curve broke earlier: the knee is the level "
                    f"just before the FIRST one that fails ({expected}).")
        return (f"expected {expected}: walk up the loads; a level keeps up when achieved/offered >= 0.9 and p95 "
                "TTFT <= the SLO; the knee is the level just before the first that does not.")

    return check_function(answer, cases, what="knee", explain=explain)


@exercise("06_under_load.ipynb", solution="b", wrong="a")
def check_ab_reading(answer: Any) -> Feedback:
    """Multiple choice: what the A/B example (B completes more, but its p95 TTFT is higher) says."""
    return check_choice(answer, "b", {
        "a": "completing more requests in the window is higher throughput, a property of the service; the person "
             "waiting for the first word of an answer sees the TTFT, and B's p95 is the worse one.",
        "c": "A's first tokens come sooner, yet it completes fewer: its prompt-only steps pause every running answer, "
             "so answers finish later. Early first tokens do not imply more completions.",
        "d": "the run is in virtual time on a cost model: the same arguments give the same numbers every time "
             "(a test checks it). The difference comes from the two scheduling rules.",
    }, confirm="throughput and time to first token are different clocks. B finishes more answers per minute; A "
               "starts each answer sooner. Which is better depends on the target (the SLO) you set for each.")
