"""Bad input gets a clear error that names the value and the fix, raised before any work, changing nothing.

"Before any work" is checked with a forward pre-hook on the model that counts calls; "changing
nothing" by handing in a static cache and checking it is still empty (seq_len 0, buffers still zero).
"""
from __future__ import annotations

import pytest
import torch
import transformers

import kvlab

CFG = kvlab.tiny_llama()  # vocab 320, context 1024, head_dim 16


@pytest.fixture
def forward_calls(model):
    """A list that grows by one each time the model's forward runs."""
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    yield calls
    handle.remove()


def untouched(cache: kvlab.KVCache) -> bool:
    return cache.seq_len == 0 and all(not t.any() for t in cache.keys + cache.values)


# (what is wrong, generate's keyword arguments, the message expected: the value and the fix)
BAD_ARGUMENTS = [
    ("unknown cache name", dict(cache="pagedd"), r"unknown cache 'pagedd'; choose one of none, dynamic, static"),
    ("unknown cache option", dict(cache="dynamic", max_len=64),
     r"cache 'dynamic' does not take option\(s\) \['max_len'\]; it takes no options"),
    ("option of another cache", dict(cache="static", bits=4),
     r"cache 'static' does not take option\(s\) \['bits'\]; it takes max_len"),
    ("static capacity exceeded", dict(cache="static", max_len=10, max_new_tokens=8),
     r"static cache holds 10 tokens but prompt \(5\) \+ max_new_tokens \(8\) = 13; raise max_len or lower"),
    ("max_new_tokens = 0", dict(max_new_tokens=0), r"max_new_tokens must be a positive integer, got 0"),
    ("max_new_tokens < 0", dict(max_new_tokens=-3), r"max_new_tokens must be a positive integer, got -3"),
    ("max_new_tokens not an integer", dict(max_new_tokens=2.5), r"max_new_tokens must be a positive integer, got 2.5"),
    ("beyond the context", dict(max_new_tokens=1020),
     r"prompt \(5\) \+ max_new_tokens \(1020\) = 1025 exceeds the model's context of 1024 tokens; "
     r"shorten the prompt or lower max_new_tokens"),
    ("negative temperature", dict(temperature=-0.5), r"temperature must be >= 0 \(0 = greedy\), got -0.5"),
    ("top_k = 0", dict(temperature=1.0, top_k=0), r"top_k must be >= 1 or None, got 0"),
    ("top_p = 0", dict(temperature=1.0, top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    ("top_p > 1", dict(temperature=1.0, top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
]


@pytest.mark.parametrize("what, kwargs, message", BAD_ARGUMENTS, ids=[b[0] for b in BAD_ARGUMENTS])
def test_bad_generation_arguments_fail_before_any_work(model, forward_calls, what, kwargs, message):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        kvlab.generate(model, "hello", **kwargs)
    with pytest.raises(ValueError, match=message):
        kvlab.stream(model, "hello", **kwargs)  # streaming refuses at the call, not at the first token
    assert forward_calls == []


BAD_PROMPTS = [
    ("empty text", "", r"prompt is empty: give at least one token"),
    ("empty id list", [], r"prompt is empty: give at least one token"),
    ("id above the vocabulary", [5, 999, 7], r"token id 999 is outside the vocabulary \[0, 320\).*"
                                              r"encode the prompt with this model's tokenizer"),
    ("negative id", [-1], r"token id -1 is outside the vocabulary \[0, 320\)"),
    ("float id", [1.5], r"token id 1.5 is not an integer; pass text or a list of integer token ids"),
]


@pytest.mark.parametrize("what, prompt, message", BAD_PROMPTS, ids=[b[0] for b in BAD_PROMPTS])
def test_bad_prompt_leaves_the_cache_passed_in_empty(model, forward_calls, what, prompt, message):
    cache = kvlab.make_cache("static", CFG, max_len=32)
    with pytest.raises(ValueError, match=message):
        kvlab.generate(model, prompt, cache=cache, max_new_tokens=4)
    assert untouched(cache) and forward_calls == []


def test_integer_ids_of_any_kind_are_accepted(model):
    import numpy as np

    plain = kvlab.generate(model, [3, 4, 5], max_new_tokens=3).tokens
    assert kvlab.generate(model, np.array([3, 4, 5]), max_new_tokens=3).tokens == plain
    assert kvlab.generate(model, torch.tensor([[3, 4, 5]]), max_new_tokens=3).tokens == plain


def test_static_capacity_exceeded_is_refused_before_any_work(model, forward_calls):
    cache = kvlab.make_cache("static", CFG, max_len=10)
    with pytest.raises(ValueError, match=r"static cache holds 10 tokens but prompt \(5\) \+ max_new_tokens \(6\) "
                                         r"= 11; raise max_len or lower max_new_tokens"):
        kvlab.generate(model, "hello", cache=cache, max_new_tokens=6)
    assert untouched(cache) and forward_calls == []
    assert len(kvlab.generate(model, "hello", cache=cache, max_new_tokens=5).tokens) == 5  # exactly full is fine


@pytest.mark.parametrize("what, kwargs, message", BAD_ARGUMENTS[4:], ids=[b[0] for b in BAD_ARGUMENTS[4:]])
def test_bad_arguments_leave_the_cache_passed_in_empty(model, forward_calls, what, kwargs, message):
    cache = kvlab.make_cache("static", CFG, max_len=2000)
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        kvlab.generate(model, "hello", cache=cache, **kwargs)
    assert untouched(cache) and forward_calls == []


def test_a_cache_already_holding_tokens_is_refused(model):
    cache = kvlab.generate(model, "hello", cache="static", max_new_tokens=3, max_len=32).cache
    held = cache.seq_len
    with pytest.raises(ValueError, match=rf"already holds {held} tokens; call cache.reset\(\) first"):
        kvlab.generate(model, "again", cache=cache, max_new_tokens=3)
    assert cache.seq_len == held


@pytest.mark.parametrize("other", [kvlab.tiny_llama(num_layers=3), kvlab.tiny_llama(num_kv_heads=4)],
                         ids=["layers", "kv_heads"])
def test_a_cache_built_for_another_model_is_refused(model, forward_calls, other):
    cache = kvlab.make_cache("static", other, max_len=32)
    with pytest.raises(ValueError, match=r"the cache passed in has \(layers, kv_heads, head_dim, batch\) = .* "
                                         r"but this model needs \(2, 2, 16, 1\); build it with make_cache"):
        kvlab.generate(model, "hello", cache=cache, max_new_tokens=3)
    assert untouched(cache) and forward_calls == []


def test_a_cache_of_another_dtype_is_refused(model, forward_calls):
    cache = kvlab.make_cache("static", CFG, max_len=32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"stores torch.bfloat16 but the model computes in torch.float32"):
        kvlab.generate(model, "hello", cache=cache, max_new_tokens=3)
    assert untouched(cache) and forward_calls == []


def test_unknown_cache_name_in_make_cache():
    with pytest.raises(ValueError, match=r"unknown cache 'paged2'; choose one of none, dynamic, static, quantized"):
        kvlab.make_cache("paged2", CFG)


@pytest.mark.parametrize("bits", [1, 3, 16, True])
def test_bits_outside_2_4_8_are_refused(model, forward_calls, bits):
    with pytest.raises(ValueError, match=rf"bits {bits!r} is not supported; use 2, 4 or 8"):
        kvlab.generate(model, "hello", cache="quantized", bits=bits, max_new_tokens=3)
    with pytest.raises(ValueError, match=rf"bits {bits!r} is not supported"):
        kvlab.make_cache("quantized", CFG, bits=bits)
    assert forward_calls == []


@pytest.mark.parametrize("group_size", [5, 32])
def test_group_size_must_divide_head_dim(model, forward_calls, group_size):
    with pytest.raises(ValueError, match=rf"group_size {group_size} does not divide head_dim 16; use one of "
                                         r"\[1, 2, 4, 8, 16\]"):
        kvlab.generate(model, "hello", cache="quantized", bits=4, group_size=group_size, max_new_tokens=3)
    assert forward_calls == []


def test_static_max_len_must_be_positive():
    with pytest.raises(ValueError, match=r"static cache max_len must be >= 1, got 0"):
        kvlab.make_cache("static", CFG, max_len=0)


def test_unsupported_architecture_in_a_config():
    with pytest.raises(ValueError, match=r"arch 'mamba' is not supported; use one of \('llama', 'gpt2'\)"):
        kvlab.ModelConfig(arch="mamba")


def test_unsupported_transformers_model_is_named_with_the_supported_ones():
    bert = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64)
    with pytest.raises(ValueError, match=r"architecture 'bert'.*not supported by kvlab; supported model types: "
                                         r"gpt2, llama, mistral, qwen2"):
        kvlab.from_transformers(transformers.BertForMaskedLM(bert))


def test_shape_errors_in_a_config_name_both_numbers():
    with pytest.raises(ValueError, match=r"hidden_size \(100\) must be divisible by num_heads \(8\)"):
        kvlab.tiny_llama(hidden_size=100, num_heads=8)
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        kvlab.tiny_llama(num_kv_heads=3)


def test_cuda_requested_where_there_is_none_is_a_clear_error(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    monkeypatch.setenv("KVLAB_DEVICE", "cuda")
    with pytest.raises(ValueError, match=r"device 'cuda' requested but CUDA is not available here; unset KVLAB_DEVICE"):
        kvlab.build_model(CFG)
