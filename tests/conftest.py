"""What the tests share: one torch thread, tiny seeded models per architecture, teacher-forced logits, sequences.

Every model here is built on the CPU with seed 0, so a test sees the same weights on every
machine; GPU paths have their own tests, marked to skip without CUDA.
"""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.clocks import RequestRecord
from kvlab.serving import SamplingParams, Sequence
from kvlab.threads import torch_threads

ARCHITECTURES = {"llama": kvlab.tiny_llama, "gpt2": kvlab.tiny_gpt2}  # Llama (GQA, RoPE) and GPT-2 (MHA, learned)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Every test runs on one torch thread: tiny models are fastest so, and a shared 2-core machine does not thrash."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def model() -> kvlab.Decoder:
    """The tiny Llama (2 layers, grouped-query attention), seeded, on the CPU; one per test module."""
    return kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def each_model(request) -> kvlab.Decoder:
    """The tiny model of each architecture in turn (the test runs once per entry of ARCHITECTURES)."""
    return kvlab.build_model(ARCHITECTURES[request.param](), seed=0, device="cpu")


def _teacher_forced_logits(model, cache, prompt_len: int = 48, steps: int = 24, seed: int = 0) -> torch.Tensor:
    """Logits of a prefill and then ``steps`` decode steps on fixed random tokens: (prompt_len + steps, V)."""
    gen = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    ids = torch.randint(0, V, (1, prompt_len), generator=gen).to(model.device)  # (1, prompt_len)
    nxt = torch.randint(0, V, (1, steps), generator=gen).to(model.device)  # (1, steps): fed one at a time
    with torch.inference_mode():
        out = [model(ids, cache)[0]]  # (prompt_len, V)
        out += [model(nxt[:, t:t + 1], cache)[0] for t in range(steps)]  # steps x (1, V)
    return torch.cat(out).float().cpu()


@pytest.fixture(scope="session")
def teacher_forced_logits():
    """``teacher_forced_logits(model, cache, prompt_len=48, steps=24, seed=0)``: every logit a cache run gives."""
    return _teacher_forced_logits


def _sequence(rid: int, prompt, max_new_tokens: int = 8, arrival_s: float = 0.0, stop=()) -> Sequence:
    """A waiting Sequence as the engine makes one; ``prompt`` is token ids, or a length (ids below 50 from rid)."""
    tokens = [(rid * 7 + i) % 50 for i in range(prompt)] if isinstance(prompt, int) else list(prompt)
    record = RequestRecord(rid, len(tokens), max_new_tokens, scheduled_s=arrival_s)
    return Sequence(rid, tokens, max_new_tokens, SamplingParams(stop_token_ids=tuple(stop)), record, arrival_s)


@pytest.fixture(scope="session")
def make_sequence():
    """``make_sequence(rid, prompt, max_new_tokens=8, arrival_s=0.0, stop=())`` -> a waiting Sequence."""
    return _sequence
