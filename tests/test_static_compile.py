"""The fixed-shape static cache behind lesson 03's compiled decode step: exact, and tried within a budget."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.experiments.static_compile import FixedShapeStaticCache, _decode_greedy, try_compiled_decode


@torch.inference_mode()
def test_fixed_shape_decode_gives_the_dynamic_caches_tokens(model):
    prompt = list(range(5, 29))
    c = model.config
    cache = FixedShapeStaticCache(c.num_layers, c.num_kv_heads, c.head_dim, max_len=len(prompt) + 10)
    shapes = set()

    def step(token, positions):
        shapes.add(tuple(cache.keys[0].shape))
        return model(token, cache, positions=positions, last_only=True)

    tokens, seconds = _decode_greedy(model, prompt, 10, cache, step)
    reference = kvlab.generate(model, prompt, cache="none", max_new_tokens=10).tokens
    assert tokens == reference and len(seconds) == 9
    assert shapes == {(1, c.num_kv_heads, len(prompt) + 10, c.head_dim)}  # one shape for every step
    assert cache.seq_len == len(prompt) + 9 and int(cache.position) == cache.seq_len
    with pytest.raises(ValueError, match="max_len"):
        cache.advance()  # the last slot is filled: one more token does not fit
        cache.advance()


def test_a_compile_that_runs_out_of_budget_comes_back_as_a_message():
    result = try_compiled_decode(budget_s=0.5)
    assert result["status"] == "timeout" and "budget" in result["message"] and "skipped" in result["message"]
    with pytest.raises(ValueError, match="budget_s"):
        try_compiled_decode(budget_s=0)


def test_generate_compiles_the_static_step_once_and_says_how_long_it_took(model, capsys):
    """``generate(..., compile=True)``: same tokens as the dynamic cache; the first call per length reports its
    compile time (and prints it), a second call reuses the program (compile_s == 0). The "eager" backend
    traces without generating code, so this takes seconds."""
    prompt = list(range(5, 29))
    reference = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8).tokens
    first = kvlab.generate(model, prompt, cache="static", max_new_tokens=8, max_len=40, compile=True,
                           compile_backend="eager")
    again = kvlab.generate(model, prompt[:20], cache="static", max_new_tokens=8, max_len=40, compile=True,
                           compile_backend="eager")
    assert first.tokens == reference
    assert first.settings["compiled"] and first.settings["compile_s"] > 0 and again.settings["compile_s"] == 0.0
    assert again.tokens == kvlab.generate(model, prompt[:20], cache="dynamic", max_new_tokens=8).tokens
    assert "compiling the decode step for a 40-token static cache" in capsys.readouterr().err


def test_a_compiled_step_on_two_threads_keeps_the_split_product_and_the_tokens(model):
    """With two threads the compiled step's weight products are kvlab::split_matvec (kvlab/model/matvec.py):
    "aot_eager" traces it through its fake implementation and runs it, and the tokens stay the dynamic cache's."""
    from torch._dynamo.testing import CompileCounterWithBackend

    prompt, backend = list(range(5, 29)), CompileCounterWithBackend("aot_eager")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        reference = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8).tokens
        got = kvlab.generate(model, prompt, cache="static", max_new_tokens=8, max_len=41, compile=True,
                             compile_backend=backend)
    finally:
        torch.set_num_threads(before)
    assert got.settings["compiled"] and got.tokens == reference
    targets = [str(n.target) for g in backend.graphs for n in g.graph.nodes if n.op == "call_function"]
    products = 4 * model.config.num_layers + (model.lm_head is not None)
    assert sum("split_matvec" in t for t in targets) == products, targets


def test_a_compiler_that_fails_falls_back_to_the_plain_step_and_says_why(capsys):
    def broken_backend(graph, example_inputs):
        raise RuntimeError("no C++ compiler on this machine")

    model = kvlab.build_model(kvlab.tiny_llama(), seed=0)  # its own model: the compiled step is kept per model
    prompt = list(range(5, 29))
    result = kvlab.generate(model, prompt, cache="static", max_new_tokens=8, compile=True,
                            compile_backend=broken_backend)
    assert result.tokens == kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8).tokens
    assert result.settings["compiled"] is False and "no C++ compiler" in result.settings["compile_fallback"]
    assert "decode steps run uncompiled" in capsys.readouterr().err


def test_compile_needs_the_static_cache(model):
    with pytest.raises(ValueError, match="compile=True compiles the static cache's fixed-shape decode step; "
                                         "pass cache='static' \\(got cache='dynamic'\\)"):
        kvlab.generate(model, [1, 2, 3], cache="dynamic", compile=True)
