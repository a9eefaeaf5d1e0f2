"""Exercises of notebook 01 (the slowdown): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from kvlab.experiments.slowdown import tokens_processed
from kvlab.lessons.common.exercises import Feedback, check_function, check_number, exercise, right


def _work_ratio(prompt: int, early: int, late: int) -> float:
    return tokens_processed("none", prompt, late) / tokens_processed("none", prompt, early)


@exercise("01_the_slowdown.ipynb", solution=450 / 276, wrong=194 / 20,
          title='predict the work ratio',
          question="""Before measuring: with a 256-token prompt and **no** cache, how many times more tokens does the
step that writes token 194 process than the step that writes token 20? (You can then check your
prediction against the `work_ratio` column of `slowdown_summary(panel.run(prompt_tokens=256).frame)`,
about a minute of measuring.)""",
          code="""answer = None   # a number: late step's tokens / early step's tokens
check_work_ratio(answer)""",
          explanation="""```python
answer = (256 + 194) / (256 + 20)   # about 1.63
```
The step that writes token *i* processes the prompt plus the *i* tokens before it. The measured ratio
usually comes out lower: a pass over more tokens costs less per token (`per_token_costs` shows it on
your run).""")
def check_work_ratio(answer: Any) -> Feedback:
    """Prompt 256, no cache: how many times more tokens does the step of token 194 process than token 20's?"""
    return check_number(
        answer, _work_ratio(256, 20, 194), what="the work ratio (token 194 vs token 20, no cache)", rel=5e-3,
        digits=2,  # "about 1.63": 1.6 and 1.63 are both right
        mistakes=[(194 / 20, "that ratio leaves out the prompt. Without a cache every step recomputes the "
                             "whole prompt too: the step of token i processes prompt + i tokens."),
                  (1.0, "1 is the ratio *with* a cache, where every decode step processes one token. "
                        "Without a cache each step reprocesses the prompt and every token so far."),
                  (276 / 450, "you divided the early step by the late one; the question asks how many "
                              "times *more* the late step does.")],
        hint="The step that writes token i processes prompt + i tokens; divide late by early.",
        confirm=f"(256 + 194) / (256 + 20) = {_work_ratio(256, 20, 194):.3f}. The measured ratio usually comes "
                "out lower, because a pass over more tokens costs less per token; compare the two in "
                "slowdown_summary on your own run.")


def _forgets_the_prefill(cache: str, prompt_tokens: int, new_tokens: int) -> int:
    """A plausible wrong answer: every step of a cached run counted as one token, the prefill too."""
    return sum(prompt_tokens + i for i in range(new_tokens)) if cache == "none" else new_tokens


def _explain_total(kwargs: dict, got: Any, expected: Any) -> str:
    cache, t, n = kwargs["cache"], kwargs["prompt_tokens"], kwargs["new_tokens"]
    steps = [tokens_processed(cache, t, i) for i in range(min(n, 3))]
    return (f"the right total is {expected:,}. Step by step it processes {', '.join(map(str, steps))}"
            f"{', ...' if n > 3 else ''} tokens: step 0 is the prefill of the whole prompt, then "
            + ("each step recomputes the prompt and every token so far." if cache == "none"
               else "each step processes only the newest token."))


@exercise("01_the_slowdown.ipynb", kind="function",
          solution=lambda cache, prompt_tokens, new_tokens: (
              new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2 if cache == "none"
              else prompt_tokens + new_tokens - 1),
          wrong=_forgets_the_prefill,
          title='count the whole generation',
          question="""Write a function `total_processed(cache, prompt_tokens, new_tokens)` that returns how many tokens
the model processes, over all steps, to generate `new_tokens` tokens after a prompt of
`prompt_tokens`, for `cache="none"` and `cache="dynamic"`. Pass the function itself as the answer.""",
          code="""answer = None   # your function total_processed, not a call of it
check_total_processed(answer)""",
          explanation="""```python
def total_processed(cache, prompt_tokens, new_tokens):
    if cache == "none":   # the step of token i processes the prompt and the i tokens before it
        return sum(prompt_tokens + i for i in range(new_tokens))
    return prompt_tokens + (new_tokens - 1)   # the prefill, then one token per step

answer = total_processed
```
Without a cache the total is *n·T + n(n−1)/2*: it grows with the square of the answer's length.
With a cache it is *T + n − 1*: linear.""")
def check_total_processed(answer: Any) -> Feedback:
    """A function total(cache, prompt_tokens, new_tokens): tokens pushed through the model for a whole generation."""
    cases = [(dict(cache=c, prompt_tokens=t, new_tokens=n), sum(tokens_processed(c, t, i) for i in range(n)))
             for c in ("none", "dynamic") for t, n in ((32, 1), (32, 10), (8, 200), (256, 400))]
    feedback = check_function(answer, cases, what="total tokens processed", explain=_explain_total)
    if feedback:
        return right(feedback.message + " Without a cache the total grows with the square of the length "
                     "(n·T + n(n−1)/2); with one it grows linearly (T + n − 1).")
    return feedback
