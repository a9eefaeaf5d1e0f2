"""The exercises where learners build the mechanism: each typical slip gets its own message.

Notebook 02, "write the cache": a KVCache with update() and seq_len filled in, checked by generating
with it and without any cache, token for token. Notebook 05, "write the admission rule": a function
that picks which waiting requests join the batch, run inside the engine and audited at every call.
The registered solution and one wrong answer are tested with every exercise in tests/test_course.py;
here every other slip is named. The build-it exercises of notebooks 07 (attention over a paged cache)
and 08 (a block table) are tested the same way in tests/test_exercises_paged.py.
"""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache import DynamicCache, StaticCache
from kvlab.lessons import EXERCISES
from kvlab.lessons.l05_batching.exercises import check_admission_rule
from kvlab.lessons.l02_kv_cache.exercises import check_my_cache
from kvlab.lessons.l02_kv_cache.exercises import MY_CACHE_PROMPT, MY_CACHE_TOKENS, SolutionCache, _cache_model
from kvlab.lessons.l05_batching.exercises import (ADMISSION_CASES, _hand_built_case_failure, skip_ahead_admission,
                                                  solution_admission)
from kvlab.experiments.admission import MAX_SEQS, admission_run, builtin_admission
from kvlab.serving.scheduler import WaitingRequest

LESSONS = ("02", "05")  # the lessons these tests belong to: `pytest -m lNN`


# --- notebook 02: write the cache ---------------------------------------------------------------------

class ConcatOnHeads(SolutionCache):
    """Slip: torch.cat along dimension 1 (the kv heads) instead of 2 (the tokens)."""

    def update(self, layer_idx, k, v):
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=1)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=1)
        return self.keys[layer_idx], self.values[layer_idx]


class ConcatOnHeadDim(SolutionCache):
    """Slip: torch.cat along the last dimension (head_dim)."""

    def update(self, layer_idx, k, v):
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=-1)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=-1)
        return self.keys[layer_idx], self.values[layer_idx]


class ReturnsOnlyNew(SolutionCache):
    """Slip: stores the new keys and values, but returns only them."""

    def update(self, layer_idx, k, v):
        super().update(layer_idx, k, v)
        return k, v


class OneStoreForAllLayers(SolutionCache):
    """Slip: one K and one V tensor shared by every layer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = self.v = None

    def update(self, layer_idx, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.keys[layer_idx] = self.k  # seq_len of the skeleton still reads keys[-1]
        return self.k, self.v


class NoPositionOffset(SolutionCache):
    """Slip: seq_len left at 0, so every new token is placed at position 0."""

    @property
    def seq_len(self):
        return 0


class CountsSteps(SolutionCache):
    """Slip: seq_len counts forward passes, not tokens."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes = 0

    def update(self, layer_idx, k, v):
        self.passes += layer_idx == self.num_layers - 1
        return super().update(layer_idx, k, v)

    @property
    def seq_len(self):
        return self.passes


class NewFirst(SolutionCache):
    """Slip: the new token put before the stored ones."""

    def update(self, layer_idx, k, v):
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:
            self.keys[layer_idx] = torch.cat([k, self.keys[layer_idx]], dim=2)
            self.values[layer_idx] = torch.cat([v, self.values[layer_idx]], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]


CACHE_SLIPS = {
    ConcatOnHeads: "concatenates along dimension 1",
    ConcatOnHeadDim: "concatenates along dimension 3",
    ReturnsOnlyNew: "returns only the new keys",
    OneStoreForAllLayers: "the layers share one store",
    NoPositionOffset: "you forgot the position offset",
    CountsSteps: "it counts steps, not tokens",
    NewFirst: "in the wrong order",
}


def skeleton(name: str) -> dict:
    """The answer cell of exercise ``name`` as the notebook shows it, run without its last line (the check)."""
    code = EXERCISES[name].code
    namespace: dict = {}
    exec(code.rsplit("\n", 1)[0], namespace)  # noqa: S102 - the course's own skeleton
    return namespace


def test_the_reference_cache_and_kvlabs_own_caches_pass():
    for cls in (SolutionCache, DynamicCache, StaticCache):
        feedback = check_my_cache(cls)
        assert feedback.correct, (cls.__name__, feedback)
        assert "same 16 tokens" in feedback.message


@pytest.mark.parametrize("slip", list(CACHE_SLIPS), ids=lambda c: c.__name__)
def test_each_cache_slip_gets_its_own_message(slip):
    feedback = check_my_cache(slip)
    assert not feedback.correct
    assert CACHE_SLIPS[slip] in feedback.message, feedback.message
    others = [m for s, m in CACHE_SLIPS.items() if s is not slip]
    assert not any(m in feedback.message for m in others), feedback.message


@pytest.mark.parametrize("slip", [s for s in CACHE_SLIPS if s is not NewFirst], ids=lambda c: c.__name__)
def test_each_cache_slip_changes_the_generated_tokens(slip):
    """The checker's model is sharp enough that every slip shows in the tokens (the order alone cannot:
    a single new token attends to the stored ones in any order)."""
    model = _cache_model()
    cfg = model.config
    reference = kvlab.generate(model, MY_CACHE_PROMPT, cache="none", max_new_tokens=MY_CACHE_TOKENS).tokens
    try:
        cache = slip(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        tokens = kvlab.generate(model, MY_CACHE_PROMPT, cache=cache, max_new_tokens=MY_CACHE_TOKENS).tokens
    except RuntimeError:
        return  # the wrong dimension cannot even run
    assert tokens != reference
    assert "generated token" in check_my_cache(slip).message


def test_the_skeleton_as_shown_is_answered_without_an_error():
    """The untouched skeleton stores nothing: the checker says what the learner's cache holds (none of the tokens),
    not what its own probe handed over."""
    my_cache = skeleton("check_my_cache")["MyCache"]
    feedback = check_my_cache(my_cache)
    assert not feedback.correct and "your cache holds none of them" in feedback.message, feedback.message
    assert "tokens stored" not in feedback.message, feedback.message


class StoresNothingCountsRight(SolutionCache):
    """Slip: seq_len counts the tokens handed over, but update keeps none of them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = 0

    def update(self, layer_idx, k, v):
        self.seen += k.size(2) if layer_idx == 0 else 0
        return k, v

    @property
    def seq_len(self):
        return self.seen


def test_a_cache_that_keeps_nothing_is_told_so_whatever_its_seq_len_says():
    message = check_my_cache(StoresNothingCountsRight).message
    assert "your cache holds none of them" in message and "fill in update" in message, message


def test_a_cache_that_is_not_a_class_or_not_a_kvcache_is_explained():
    assert "class itself" in check_my_cache(SolutionCache(2, 2, 16)).message
    assert "subclass kvlab.cache.KVCache" in check_my_cache(int).message


# --- notebook 05: write the admission rule ------------------------------------------------------------

def ignores_the_budget(waiting, free_blocks, token_budget, free_slots):
    return builtin_admission(waiting, free_blocks, float("inf"), free_slots)


def ignores_free_blocks(waiting, free_blocks, token_budget, free_slots):
    return builtin_admission(waiting, float("inf"), token_budget, free_slots)


def forgets_to_subtract(waiting, free_blocks, token_budget, free_slots):
    admitted = []
    for r in waiting[:free_slots]:
        if r.blocks > free_blocks or r.tokens > token_budget:
            break
        admitted.append(r)
    return admitted


def ignores_free_slots(waiting, free_blocks, token_budget, free_slots):
    return builtin_admission(waiting, free_blocks, token_budget, free_slots=len(waiting))


def shortest_prompt_first(waiting, free_blocks, token_budget, free_slots):
    return builtin_admission(sorted(waiting, key=lambda r: r.tokens), free_blocks, token_budget, free_slots)


def admits_nobody(waiting, free_blocks, token_budget, free_slots):
    return []


def crashes(waiting, free_blocks, token_budget, free_slots):
    return waiting[0].prompt  # no such attribute


def admits_one_per_step(waiting, free_blocks, token_budget, free_slots):
    """Under-admits: never more than one request a step, however many fit."""
    return builtin_admission(waiting, free_blocks, token_budget, min(free_slots, 1))


def admits_only_into_an_empty_batch(waiting, free_blocks, token_budget, free_slots):
    """Under-admits: nobody joins while any sequence runs (static batching, in spirit)."""
    return builtin_admission(waiting, free_blocks, token_budget, free_slots) if free_slots == MAX_SEQS else []


def keeps_a_spare_block(waiting, free_blocks, token_budget, free_slots):
    """Under-admits: one free block held back (vLLM's watermark, in spirit), so a request that fits exactly waits."""
    return builtin_admission(waiting, free_blocks - 1, token_budget, free_slots)


def admits_one_when_crowded(waiting, free_blocks, token_budget, free_slots):
    """Under-admits only with more than five waiting: right on the small hand-built queues, not in the run."""
    return builtin_admission(waiting, free_blocks, token_budget, min(free_slots, 1) if len(waiting) > 5 else free_slots)


ADMISSION_SLIPS = {
    ignores_the_budget: "ignores the token budget",
    ignores_free_blocks: "ignores the free KV blocks",
    forgets_to_subtract: "subtract what it takes",
    ignores_free_slots: "only free_slots more sequences fit",
    skip_ahead_admission: "passed over",
    shortest_prompt_first: "passed over",
    admits_nobody: "admitted nobody",
    crashes: "your rule raised AttributeError",
    admits_one_per_step: "Too few",
    admits_only_into_an_empty_batch: "Too few",
    keeps_a_spare_block: "Too few",
}


def test_the_reference_rule_and_the_engines_own_pass_with_the_same_clocks():
    for rule in (solution_admission, builtin_admission):
        feedback = check_admission_rule(rule)
        assert feedback.correct, feedback
        assert "exactly those of the engine's own rule" in feedback.message


def picks(rule, case: str) -> list:
    """The request ids ``rule`` admits on the hand-built queue named ``case``."""
    shapes, free_blocks, token_budget, free_slots = next(c[1:] for c in ADMISSION_CASES if c[0] == case)
    waiting = [WaitingRequest(i, t, b, 0.0, False) for i, (t, b) in enumerate(shapes)]
    return [getattr(w, "request_id", w) for w in rule(waiting, free_blocks, token_budget, free_slots)]


@pytest.mark.parametrize("rule, case", [
    (admits_one_per_step, "three free slots, four short requests"),
    (admits_only_into_an_empty_batch, "three free slots, four short requests"),
    (keeps_a_spare_block, "the free blocks run out exactly"),
], ids=lambda x: getattr(x, "__name__", "case"))
def test_rules_that_admit_too_few_are_refused_on_a_hand_built_queue(rule, case):
    """They over-allocate nothing and starve nobody in the run, so only the hand-built queues catch them."""
    run, audit = admission_run(rule)
    assert run is not None and audit.violation is None and audit.starved() is None
    feedback = check_admission_rule(rule)
    assert not feedback.correct
    expected, got = picks(solution_admission, case), picks(rule, case)
    assert len(got) < len(expected)
    assert f'in the case "{case}"' in feedback.message, feedback.message
    assert f"expected requests {expected} to join, your rule admitted {got}" in feedback.message


def test_the_reference_answers_every_hand_built_queue_and_each_queue_catches_a_slip():
    assert _hand_built_case_failure(solution_admission) is None
    slips = (admits_one_per_step, admits_only_into_an_empty_batch, keeps_a_spare_block, skip_ahead_admission)
    for case, *_ in ADMISSION_CASES:
        assert picks(builtin_admission, case) == picks(solution_admission, case)
        assert any(picks(slip, case) != picks(solution_admission, case) for slip in slips), case


def test_a_rule_right_on_the_hand_built_queues_but_not_in_the_run_is_refused_at_its_call():
    assert _hand_built_case_failure(admits_one_when_crowded) is None
    feedback = check_admission_rule(admits_one_when_crowded)
    assert not feedback.correct and "of the run" in feedback.message and "Too few" in feedback.message


@pytest.mark.parametrize("slip", list(ADMISSION_SLIPS), ids=lambda f: f.__name__)
def test_each_admission_slip_gets_its_own_message(slip):
    feedback = check_admission_rule(slip)
    assert not feedback.correct
    assert ADMISSION_SLIPS[slip] in feedback.message, feedback.message
    others = {m for s, m in ADMISSION_SLIPS.items() if m != ADMISSION_SLIPS[slip]}
    assert not any(m in feedback.message for m in others), feedback.message


def test_the_admission_skeleton_as_shown_is_answered_without_an_error():
    feedback = check_admission_rule(skeleton("check_admission_rule")["my_admission"])
    assert not feedback.correct and "admitted nobody" in feedback.message
