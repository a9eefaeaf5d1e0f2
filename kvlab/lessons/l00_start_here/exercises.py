"""Exercises of notebook 00 (start here): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from ..l01_the_slowdown.slowdown import tokens_processed
from ..common.exercises import Feedback, _is_number, exercise, multiple_choice, right, wrong


@exercise("00_start_here.ipynb", solution=(32, 1), wrong=(1, 1),
          title='prefill and decode',
          question="""The panel above used a 32-token prompt and a KV cache. How many tokens did the model process in
the step that wrote token 0, and in the step that wrote token 5? Reason it out, or read the
`tokens_processed` column of `result.frame`. Answer with a pair, `(token 0, token 5)`.""",
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
        "a": ("one of you has a bug in the lab;",
              "a bug would change the tokens, not only the time. Same settings, same tokens, different machine: "
              "different time is expected."),
        "b": ("the same work done faster: same model, prompt and seed give the same tokens, and the seconds "
              "belong to the machine;", None),
        "c": ("their machine must have a GPU;",
              "a GPU is one way to be faster, not the only one: faster cores, more threads, or fewer other "
              "programs competing for the CPU halve a step too. The setup report says which."),
        "d": ("their model, prompt or seed must differ from yours, since the same settings on the same code always "
              "take the same time.",
              "the model, the prompt and the seed are the same, so the work is the same. Time depends on the "
              "machine doing the work: its device, cores, threads and what else is running."),
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
