"""Exercises of notebook 05 (batching): checkers, their questions and folded solutions."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence, cast

from kvlab.lessons.common.exercises import Feedback, exercise, check_number, right, wrong, _is_number

if TYPE_CHECKING:
    from kvlab.serving.scheduler import Policy


EX05_OUTPUTS = (8, 16, 32, 64)  # output tokens of the four requests in exercises 05.1 and 05.2
EX05_MAX_SEQS = 2


def _idle_slots() -> dict:
    from kvlab.experiments.batching import idle_slots
    return idle_slots(EX05_OUTPUTS, EX05_MAX_SEQS)


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
def admission_steps(policy: Policy, max_new_tokens: Sequence[int] = EX05_OUTPUTS, max_seqs: int = EX05_MAX_SEQS,
                    prompt_tokens: int = 16) -> dict:
    """The step at which each request of exercise 05.2 is first scheduled, from a run of the engine's scheduler."""
    from kvlab.experiments.serving_run import FixedStepCostExecutor, serve
    from kvlab.serving.config import EngineSpec
    from kvlab.model.config import tiny_llama
    from kvlab.serving.scheduler import SchedulerConfig
    from kvlab.workload import Request

    requests = [Request(i, prompt_tokens, o, 0.0, "exercise", prompt=[1] * prompt_tokens)
                for i, o in enumerate(max_new_tokens)]
    run = serve(tiny_llama(), requests, EngineSpec(scheduler=SchedulerConfig(policy=policy, max_seqs=max_seqs,
                                                                             max_batch_tokens=64)),
                clock="virtual", executor=FixedStepCostExecutor(0.01), threads=None)
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


# -- exercise: write the admission rule ---------------------------------------------------------------

def solution_admission(waiting, free_blocks, token_budget, free_slots):
    """The reference answer of 'write the admission rule': in order, stop at the first request that does not fit.

    It is the engine's own rule, written out in the explanation below; the checker compares any rule with it.
    """
    from kvlab.experiments.admission import builtin_admission

    return builtin_admission(waiting, free_blocks, token_budget, free_slots)


def skip_ahead_admission(waiting, free_blocks, token_budget, free_slots):
    """A slip (the registered wrong answer): skips a request that does not fit and admits later ones that do."""
    admitted = []
    for request in waiting:
        if free_slots == 0:
            break
        if request.blocks > free_blocks or request.tokens > token_budget:
            continue
        admitted.append(request)
        free_slots -= 1
        free_blocks -= request.blocks
        token_budget -= request.tokens
    return admitted


_LIMIT = {"blocks": ("free KV blocks", "request.blocks", "free_blocks"),
          "tokens": ("token budget", "request.tokens", "token_budget"),
          "slots": ("free slots", "one slot", "free_slots")}


def _violation_message(kind: str, message: str, alone_fits: bool) -> str:
    if kind in _LIMIT:
        limit, uses, name = _LIMIT[kind]
        if alone_fits and kind != "slots":
            return (f"{message}. Each of them fits on its own, but not together: after admitting a request, "
                    f"subtract what it takes ({uses}) from {name} before you look at the next one.")
        if kind == "blocks":
            return (f"{message}: your rule ignores the {limit}. A request that joins takes request.blocks blocks "
                    "for its KV; admitting more than are free over-allocates the pool, and some sequence's keys "
                    "and values would have nowhere to go.")
        if kind == "tokens":
            return (f"{message}: your rule ignores the {limit}. A step computes at most max_batch_tokens tokens, "
                    "decodes first; a request joins only if its prompt (request.tokens) fits what is left.")
        return (f"{message}: only free_slots more sequences fit in the running batch (max_seqs); stop when they "
                "are taken.")
    if kind == "idle":
        return (f"{message}. A rule that admits no one when a request fits leaves it waiting for ever: admit "
                "each request, oldest first, while it fits.")
    return message


def _admits_what_does_not_fit(rule, kind: str) -> bool:
    """Does ``rule`` admit a lone request needing more blocks (or tokens) than are free? Tells "ignores" from
    "forgets to subtract"."""
    from kvlab.serving.scheduler import WaitingRequest

    blocks, tokens = (5, 10) if kind == "blocks" else (1, 50)
    try:
        return len(list(rule([WaitingRequest(0, tokens, blocks, 0.0, False)], 4, 40, 4) or [])) > 0
    except Exception:
        return False


# Situations built by hand where a rule that admits too few (one a step, only into an empty batch, one
# block kept spare) picks otherwise than the engine's rule: (name, waiting as (tokens, blocks) oldest
# first, free_blocks, token_budget, free_slots). The expected picks come from builtin_admission.
ADMISSION_CASES = (
    ("three free slots, four short requests", ((10, 1), (10, 1), (10, 1), (10, 1)), 8, 64, 3),  # the slots bind
    ("an empty batch, three requests that all fit", ((20, 2), (20, 2), (20, 2)), 8, 64, 4),  # everyone joins
    ("the token budget binds", ((30, 2), (30, 2), (10, 1)), 8, 64, 3),  # 30 + 30 fit, the third does not
    ("the free blocks run out exactly", ((10, 2), (10, 2), (10, 1)), 4, 64, 3),  # 2 + 2 take all 4 blocks
    ("the oldest does not fit", ((60, 4), (10, 1), (10, 1)), 3, 64, 2),  # it waits, and so do those behind it
)


def _situation(waiting, free_blocks: int, token_budget: int, free_slots: int, shown: int = 6) -> str:
    """One line for what a rule saw: the queue, oldest first, and what is left of the step."""
    queue = ", ".join(f"request {w.request_id} ({w.tokens} tokens, {w.blocks} block{'s' * (w.blocks != 1)})"
                      for w in list(waiting)[:shown])
    more = f" and {len(waiting) - shown} more" if len(waiting) > shown else ""
    return (f"waiting, oldest first: {queue}{more}; free_blocks={free_blocks}, token_budget={token_budget}, "
            f"free_slots={free_slots}")


def _picked_otherwise(where: str, waiting, free_blocks: int, token_budget: int, free_slots: int,
                      expected: list, got: list) -> str:
    """The message for a pick that is not the engine's rule's: the situation, expected against got, and why."""
    line = f"{where} ({_situation(waiting, free_blocks, token_budget, free_slots)}): expected requests {expected} " \
           f"to join, your rule admitted {got}."
    if len(got) < len(expected) and got == expected[:len(got)]:
        by_id = {w.request_id: w for w in waiting}
        taken = [by_id[i] for i in got]
        nxt = by_id[expected[len(got)]]
        blocks, tokens = free_blocks - sum(w.blocks for w in taken), token_budget - sum(w.tokens for w in taken)
        after = f" what was left after requests {got}" if got else ""
        return (f"{line} Too few: request {nxt.request_id} still fit{after}: it needs {nxt.blocks} "
                f"of {blocks} free blocks and {nxt.tokens} of {tokens} tokens, and {free_slots - len(got)} "
                f"slot{'s' * (free_slots - len(got) != 1)} stayed free. Admit every request that "
                "fits, oldest first, whether or not the batch is empty, and stop only at the first that does not "
                "fit or when the slots are taken.")
    return (f"{line} Keep the queue's order: admit the oldest while it fits what is left, and stop at the first "
            "that does not fit; nobody behind it joins.")


def _hand_built_case_failure(rule) -> str | None:
    """Run ``rule`` on ADMISSION_CASES; the message for the first case it answers otherwise than the engine's rule."""
    from kvlab.serving.scheduler import WaitingRequest
    from kvlab.experiments.admission import builtin_admission

    for name, shapes, free_blocks, token_budget, free_slots in ADMISSION_CASES:
        waiting = [WaitingRequest(i, tokens, blocks, 0.0, False) for i, (tokens, blocks) in enumerate(shapes)]
        expected = [w.request_id for w in builtin_admission(list(waiting), free_blocks, token_budget, free_slots)]
        where = f'in the case "{name}"'
        try:
            picked = rule(list(waiting), free_blocks, token_budget, free_slots)
        except Exception as exc:
            return f"{where} ({_situation(waiting, free_blocks, token_budget, free_slots)}) your rule raised " \
                   f"{type(exc).__name__}: {exc}."
        picked = [] if picked is None else picked
        if isinstance(picked, (WaitingRequest, str, int)) or not hasattr(picked, "__iter__"):
            return f"{where} your rule returned {picked!r}; return a list of waiting requests."
        got = [getattr(p, "request_id", p) for p in picked]
        if got != expected:
            return _picked_otherwise(where, waiting, free_blocks, token_budget, free_slots, expected, got)
    return None


@exercise("05_batching.ipynb", kind="build", solution=solution_admission, wrong=skip_ahead_admission,
          title="write the admission rule",
          question="""At the start of every step the scheduler decides which waiting requests **join** the running
batch. Write that decision. Your function gets the queue, oldest first (each request has `.tokens`,
the prompt tokens it computes when it joins, and `.blocks`, the free KV blocks it takes), and what is
left of this step: `free_blocks`, `token_budget` (tokens the step can still compute after the running
sequences' decodes) and `free_slots` (room under `max_seqs`). It returns the requests that join, in
the order they join. Three demands: never promise more blocks, tokens or slots than are left; never
leave a slot idle that a waiting request could use; and never let a later request overtake an earlier
one, or a long request could be passed over for ever while short ones keep coming. The checker serves
a small workload with your rule and compares every pick, and the four clocks, with the engine's own
rule.""",
          code='''def my_admission(waiting, free_blocks, token_budget, free_slots):
    """Which waiting requests join the running batch this step, in the order they join."""
    admitted = []
    for request in waiting:          # oldest first; request.tokens, request.blocks
        # TODO: does this request join? What does that leave for the next one?
        pass
    return admitted


check_admission_rule(my_admission)''',
          explanation="""```python
def my_admission(waiting, free_blocks, token_budget, free_slots):
    admitted = []
    for request in waiting:
        if free_slots == 0 or request.blocks > free_blocks or request.tokens > token_budget:
            break                    # the oldest that does not fit waits, and everyone behind it
        admitted.append(request)
        free_slots -= 1
        free_blocks -= request.blocks
        token_budget -= request.tokens
    return admitted
```
This is the rule the engine uses (`Scheduler._admit` in `kvlab/serving/scheduler.py`), so the clocks
come out exactly the same. The `break` is the heart of it: `continue` instead (skip the long request,
admit the short ones behind it) looks better on average, but while short requests keep coming the
long one never finds enough free blocks at once, and waits for ever. The other slips the checker
names: ignoring the token budget or the free blocks, checking each request against them without
subtracting what the requests admitted before it took, and admitting too few (one request a step,
or only into an empty batch), which leaves slots idle that a waiting request could use.

How the checker works: it runs the engine with your rule (`SchedulerConfig(admission=my_admission)`)
on a small workload with exact step costs (the virtual clock), checks at every step that no block,
token or slot is over-allocated and that no request is passed over for ever, tries your rule on a
few queues built by hand where admitting too few shows, and compares every pick and the four clocks
with those of the engine's own rule.""")
def check_admission_rule(rule: Any) -> Feedback:
    """Run the engine with the learner's admission rule; check blocks, budget, slots, starvation, admitting too
    few (ADMISSION_CASES) and every pick of the run against the engine's own rule."""
    from kvlab.experiments.admission import admission_run, admission_workload, clocks_table

    if not callable(rule) or isinstance(rule, type):
        return wrong(f"pass your function itself, check_admission_rule(my_admission), not "
                     f"{type(rule).__name__} {str(rule)[:40]!r}.")
    run, audit = admission_run(rule)
    assert audit is not None  # a rule given: it is audited
    if audit.violation is not None:
        v = audit.violation
        alone_fits = v.alone_fits and not _admits_what_does_not_fit(rule, v.kind)
        return wrong(_violation_message(v.kind, v.message, alone_fits))
    starved = audit.starved()
    if starved is not None:
        rid, n = starved
        builtin, _ = admission_run(None)
        assert run is not None and builtin is not None  # no violation: both runs finished
        req = next(r for r in admission_workload() if r.request_id == rid)
        mine, theirs = (cast(float, r.first_token_s) - r.scheduled_s  # both served it: it has a first token
                        for r in (run.record(rid), builtin.record(rid)))
        return wrong(f"your rule lets later requests overtake: request {rid} ({req.prompt_tokens} prompt tokens) was "
                     f"passed over {n} times while it waited, and got its first token after {mine * 1e3:.0f} ms "
                     f"instead of {theirs * 1e3:.0f} ms. Here the short requests stop coming; while they keep "
                     "coming it would never find its blocks free at once and wait for ever. Stop at the first "
                     "request that does not fit: it goes first once enough blocks are free.")
    failed = _hand_built_case_failure(rule)
    if failed is not None:
        return wrong(failed)
    d = audit.difference
    if d is not None:  # right on the hand-built queues, otherwise somewhere in the run
        return wrong(_picked_otherwise(f"in call {d.call} of the run", d.waiting, d.free_blocks, d.token_budget,
                                       d.free_slots, d.expected, d.got))
    builtin, _ = admission_run(None)
    assert run is not None and builtin is not None  # no violation: both runs finished
    table = clocks_table([run, builtin]).set_index("run")
    cols = [c for c in table.columns if c not in ("n", "steps")]
    same = bool((table.iloc[0][cols] == table.iloc[1][cols]).all())  # the same picks give the same clocks
    clocks = ", ".join(f"{c} {table.iloc[0][c]:g}" + ("" if same else f" (built-in {table.iloc[1][c]:g})")
                       for c in cols)
    verdict = ("the four clocks are exactly those of the engine's own rule" if same else
               "yet your clocks differ from the engine's own rule")
    return right(f"no block, token or slot over-allocated in {audit.calls} calls, nobody passed over, every pick "
                 f"the engine's own on the {len(ADMISSION_CASES)} hand-built queues and in the run; {verdict}: "
                 f"{clocks}.")
