"""The serving engine's prompt-chunk steps compiled for any token count: the eager engine's tokens, chunks included."""
from __future__ import annotations

import pytest
import torch

from kvlab.serving import Engine
from kvlab.serving.compiled_step import CompiledStep, packed_attention
from kvlab.serving.config import SERVE_SPEC
from kvlab.serving.executor import ModelExecutor
from kvlab.workload import make_workload

from engine_tokens import tokens_of


def greedy_tokens(model, backend: str | None = None) -> tuple[dict, CompiledStep | None]:
    """Every token of 6 requests sent at once, prompts of 256-512 tokens cut into chunks of a 96-token budget (so a
    chunk attends over the blocks its earlier chunks stored) beside decodes; with ``backend``, those steps compiled."""
    executor = ModelExecutor(model)
    engine = Engine(model, SERVE_SPEC.replace(max_seqs=4, max_batch_tokens=96), executor=executor)
    if backend:  # as ModelExecutor(model, compile_mixed=True) does, with a backend of the test's choice
        executor.compiled_step = CompiledStep(model, executor._paged_cache(), backend=backend)
        executor.compiled_step.compile_all()
        assert all(not pool.any() for pool in executor._paged_cache().key_cache)  # the compile's writes undone
    tokens = tokens_of(engine, make_workload("long_short", 6, arrival="all_at_once", seed=4,
                                             vocab_size=model.config.vocab_size))
    return tokens, executor.compiled_step


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.full)])
def test_compiled_prompt_steps_give_the_eager_engines_tokens(model, backend):
    expected, _ = greedy_tokens(model)
    got, compiled = greedy_tokens(model, backend)
    assert got == expected and sum(map(len, got.values())) > 40
    print(f"{compiled.num_steps} steps compiled, {compiled.num_eager_steps} eager, compile {compiled.compile_s:.1f} s")
    assert compiled.fallback is None and compiled.num_steps >= 6 * 256 // 96  # every prompt's chunks, at least


def test_the_attention_operator_says_where_it_runs_when_called_outside_a_step():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="runs inside forward_context"):
        packed_attention(q, q, q, 0)


def test_a_one_token_step_runs_eagerly_and_is_counted(model):
    """Dynamic sizes start at 2: a step of one token has no program and returns None (the executor runs it eagerly)."""
    executor = ModelExecutor(model)
    Engine(model, SERVE_SPEC, executor=executor)
    step = CompiledStep(model, executor._paged_cache(), backend="eager")
    assert step(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1)) is None
    assert (step.num_steps, step.num_eager_steps) == (0, 1)
