"""Exercises of notebook 00 (start here): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from kvlab.experiments.slowdown import tokens_processed
from kvlab.lessons.common.exercises import Feedback, _is_number, exercise, multiple_choice, right, wrong


@exercise("00_start_here.ipynb", solution=(32, 1), wrong=(1, 1),
          title='prefill and decode',
          question="""With the 32-token prompt and the KV cache above, how many tokens did the step that wrote token 0
process, and the step that wrote token 5? Reason it out, or read `result.frame`. Answer `(token 0, token 5)`.""",
          code="""answer = None   # (tokens processed for token 0, for token 5)
check_prefill_and_decode(answer)""",
          explanation="""```python
answer = (32, 1)
result.frame.query("token in (0, 5)")[["token", "phase", "tokens_processed"]]
```
Token 0 comes out of the **prefill**, which reads the whole prompt in one step. With a cache, every
later step (**decode**) processes only the newest token and reads the stored keys and values.""")
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


check_comparing_machines = multiple_choice(
    "00_start_here.ipynb", "check_comparing_machines",
    title='comparing with a neighbour',
    stem="""Your neighbour runs the same panel with the same settings, and every step takes half as long as
yours. What explains it?""",
    options={
        "a": ("yours still included warming up: a first generation is slow, and that slowness then ends up in "
              "each step;",
              "the panel warms the model up before it times anything, and each step keeps its fastest of three "
              "runs. Warming up would show in a few early steps, not make every step take twice as long."),
        "b": ("the same work done faster: the same settings give the same tokens, and the seconds belong to "
              "the machine;", None),
        "c": ("noise: timed runs vary from one run to the next, and another pair of runs could well turn the order "
              "around;",
              "noise moves single steps up and down; it does not halve every step of three runs that each keep "
              "their fastest time. A steady factor of two, with the same tokens, is two machines."),
        "d": ("their times come from a virtual clock, which prices each step instead of timing it.",
              "this panel times the real model on each machine's wall clock. A virtual clock (the serving "
              "notebooks) would give both of you the same times, not times half as long."),
    },
    correct="b", wrong_example="d",
    confirm="the same work, a different machine: the tokens are the same, the seconds are not. Compare the "
            "shapes of the curves (flat vs climbing, ratios between settings), and quote the setup report "
            "with any number you share.",
    explanation="""```python
answer = "b"
```
Same settings means the same model, prompt and tokens: the same work. How long that work takes
depends on the device, the cores, the threads and whatever else runs on the machine, so a time is
quoted with the setup report that produced it, and two machines are compared by the shapes of
their curves rather than by their seconds.""")
