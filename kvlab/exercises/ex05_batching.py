"""Exercises of notebook 05 (batching): checkers, their questions and folded solutions."""
from __future__ import annotations

import functools
from typing import Any, Sequence

from .framework import Feedback, exercise, check_number, right, wrong, _is_number


EX05_OUTPUTS = (8, 16, 32, 64)  # output tokens of the four requests in exercises 05.1 and 05.2
EX05_MAX_SEQS = 2


def _idle_slots(max_new_tokens: Sequence[int] = EX05_OUTPUTS, max_seqs: int = EX05_MAX_SEQS) -> dict:
    from ..experiments.batching import idle_slots
    return idle_slots(max_new_tokens, max_seqs)


@exercise("05_batching.ipynb", solution=_idle_slots()["idle"], wrong=_idle_slots()["used"],
          title='empty slots',
          question="""Four requests want 8, 16, 32 and 64 output tokens; static batching with `max_seqs = 2` runs them
as two batches, in order. Counting one *slot* as one sequence for one step, and ignoring
prefill, how many slots sit idle because a member finished before its batch did?""",
          code="""my_idle_slots = None   # a whole number
check_idle_slots(my_idle_slots)""",
          explanation="""Batch 1 = (8, 16): it lasts 16 steps with 2 slots = 32 slots, of which 8 + 16 = 24 produce a token:
8 idle. Batch 2 = (32, 64): `2 × 64 = 128` slots, 96 used: 32 idle. In all **40** idle slots, a quarter
of what ran. `kvlab.experiments.batching.idle_slots` does the same count.""")
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
    from ..experiments.serving_run import FixedStepCostExecutor, serve
    from ..model.config import tiny_llama
    from ..serving.scheduler import SchedulerConfig
    from ..workload import Request

    requests = [Request(i, prompt_tokens, o, 0.0, "exercise", prompt=[1] * prompt_tokens)
                for i, o in enumerate(max_new_tokens)]
    run = serve(tiny_llama(), requests, clock="virtual", executor=FixedStepCostExecutor(0.01), threads=None,
                scheduler=SchedulerConfig(policy=policy, max_seqs=max_seqs, max_batch_tokens=64))
    return {int(k): int(v) for k, v in run.steps.groupby("request_id")["step"].min().items()}


@exercise("05_batching.ipynb", solution=(admission_steps("continuous")[2], admission_steps("static")[2]),
          wrong=(admission_steps("continuous")[2], admission_steps("continuous")[2]),
          title='when does the third request start?',
          question="""Same four requests (prompts of 16 tokens), `max_seqs = 2`, all arriving at once. At which step
(counting from 0) is request 2, the third one, admitted under continuous batching, and under
static batching? (A request's prefill step also produces its first token.)""",
          code="""my_continuous, my_static = None, None   # replace None with step numbers
check_admission_step(None if my_continuous is None else (my_continuous, my_static))""",
          explanation="""Request 0 produces its 8 tokens in steps 0 to 7, so with continuous batching its slot goes to
request 2 at **step 8**. With static batching the batch (0, 1) lasts until request 1's 16th token
(step 15), so request 2 starts at **step 16**. The checker runs the engine's scheduler to get these.""")
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
