"""Timed generation: greedy and seeded sampling, stop tokens, streaming, the timeline, tokenizer and device."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.device import pick_device
from kvlab.sampling import sample

PROMPT = "The KV cache"


@pytest.fixture(scope="module")
def model(device):
    """The tiny Llama with larger weights (std 0.2), so greedy and sampled tokens differ; on the test device."""
    return kvlab.build_model(kvlab.tiny_llama(), seed=0, device=device).init_weights(seed=0, std=0.2)


@pytest.fixture(scope="module")
def greedy(model):
    return kvlab.generate(model, PROMPT, max_new_tokens=16)


def test_seeded_sampling_is_reproducible_and_depends_on_the_seed(model):
    runs = {seed: kvlab.generate(model, PROMPT, max_new_tokens=16, temperature=1.0, seed=seed).tokens
            for seed in (0, 1)}
    assert kvlab.generate(model, PROMPT, max_new_tokens=16, temperature=1.0, seed=0).tokens == runs[0]
    assert runs[0] != runs[1]


def test_sampling_is_not_greedy(model, greedy):
    hot = kvlab.generate(model, PROMPT, max_new_tokens=16, temperature=2.0, seed=0)
    assert hot.tokens != greedy.tokens


def test_top_k_1_is_greedy(model, greedy):
    assert kvlab.generate(model, PROMPT, max_new_tokens=16, temperature=1.0, top_k=1, seed=3).tokens == greedy.tokens


def test_tiny_top_p_is_greedy(model, greedy):
    assert kvlab.generate(model, PROMPT, max_new_tokens=16, temperature=1.0, top_p=1e-6, seed=3).tokens == greedy.tokens


def test_top_k_and_top_p_keep_the_expected_tokens_by_hand():
    # p = 0.5, 0.3, 0.15, 0.05: top_k=2 keeps {0, 1}; top_p keeps the smallest set whose mass reaches it:
    # 0.6 -> {0, 1}, 0.85 -> {0, 1, 2}
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()  # (1, V)
    gen = torch.Generator().manual_seed(0)
    for kwargs in (dict(top_k=2), dict(top_p=0.6), dict(top_p=0.85)):
        drawn = {int(sample(logits, 1.0, generator=gen, **kwargs)) for _ in range(300)}
        expected = {0, 1, 2} if kwargs.get("top_p") == 0.85 else {0, 1}
        assert drawn == expected, kwargs
    assert {int(sample(logits, 1.0, generator=gen)) for _ in range(300)} == {0, 1, 2, 3}
    assert int(sample(logits)) == 0  # temperature 0: argmax


def test_a_stop_token_ends_generation_and_is_kept(model, greedy):
    stop = greedy.tokens[5]
    first = greedy.tokens.index(stop)
    result = kvlab.generate(model, PROMPT, max_new_tokens=16, stop_tokens=[stop])
    assert result.tokens == greedy.tokens[:first + 1]
    assert result.stop_reason == "stop_token"
    assert greedy.stop_reason == "max_new_tokens" and len(greedy.tokens) == 16
    assert len(result.timeline.step_s) == len(result.tokens)


@pytest.mark.parametrize("cache", ["none", "dynamic", "static"])
def test_streaming_yields_the_tokens_of_generate_and_returns_the_result(model, greedy, cache):
    events, it = [], kvlab.stream(model, PROMPT, cache=cache, max_new_tokens=16)
    while True:
        try:
            events.append(next(it))
        except StopIteration as done:
            result = done.value
            break
    assert [e.token_id for e in events] == greedy.tokens == result.tokens
    assert [e.index for e in events] == list(range(16))
    assert [e.seq_len for e in events] == [len(PROMPT) + i + 1 for i in range(16)]
    assert [e.time_s for e in events] == result.timeline.token_time_s
    assert "".join(e.text for e in events) == result.text == model.tokenizer.decode(result.tokens)
    assert isinstance(result, kvlab.GenerationResult) and result.settings["cache"] == cache


@pytest.mark.parametrize("cache", ["none", "dynamic", "static"])
def test_timeline_has_one_entry_per_token_and_adds_up(model, cache):
    result = kvlab.generate(model, PROMPT, cache=cache, max_new_tokens=12)
    tl = result.timeline
    n = len(result.tokens)
    assert n == 12 == len(tl.token_time_s) == len(tl.step_s) == len(tl.cache_bytes) == len(tl.bytes_moved)
    assert tl.prompt_tokens == len(PROMPT)
    assert tl.prefill_s == tl.step_s[0] == tl.token_time_s[0] > 0
    assert all(b > a for a, b in zip(tl.token_time_s, tl.token_time_s[1:]))  # time moves forward
    assert math.isclose(sum(tl.step_s), tl.token_time_s[-1], rel_tol=1e-9)
    assert math.isclose(result.tokens_per_s, n / tl.token_time_s[-1])
    assert math.isclose(tl.decode_ms_per_token, 1e3 * sum(tl.step_s[1:]) / (n - 1))
    frame = tl.to_frame()
    assert len(frame) == n and list(frame["position"]) == list(range(len(PROMPT), len(PROMPT) + n))
    assert list(frame["phase"]) == ["prefill"] + ["decode"] * (n - 1)
    assert tl.bytes_moved == [0] * n  # only the offloaded cache moves bytes between tiers


def test_settings_record_what_produced_the_result(model, device):
    result = kvlab.generate(model, PROMPT, cache="static", max_new_tokens=4, temperature=0.7, top_k=5, seed=9)
    s = result.settings
    assert (s["cache"], s["max_new_tokens"], s["temperature"], s["top_k"], s["seed"]) == ("static", 4, 0.7, 5, 9)
    assert s["max_len"] == len(PROMPT) + 4 and s["model"] == "tiny-llama"
    assert s["device"] == str(model.device) and torch.device(s["device"]).type == device.type


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
    tok = kvlab.ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode(text, add_bos=True) == [tok.bos_token_id, *ids]


def test_byte_tokenizer_shows_special_tokens():
    tok = kvlab.ByteTokenizer()
    assert tok.decode([tok.bos_token_id, *b"hi", tok.eos_token_id]) == "<256>hi<257>"
    assert tok.vocab_size == 259 <= kvlab.tiny_llama().vocab_size


def test_device_follows_kvlab_device(monkeypatch):
    monkeypatch.setenv("KVLAB_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")
    assert kvlab.build_model(kvlab.tiny_llama()).device == torch.device("cpu")
    monkeypatch.delenv("KVLAB_DEVICE")
    assert pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu") == torch.device("cpu")  # an explicit argument wins over the environment


def test_device_cuda_without_cuda_is_a_clear_error(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    monkeypatch.setenv("KVLAB_DEVICE", "cuda")
    with pytest.raises(ValueError, match=r"device 'cuda' requested but CUDA is not available here; "
                                         r"unset KVLAB_DEVICE or use 'cpu'"):
        pick_device()
    with pytest.raises(ValueError, match=r"device 'cuda:0' requested"):
        pick_device("cuda:0")
