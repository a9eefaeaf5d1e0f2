"""The fixed-shape static cache behind lesson 03's compiled decode step: exact, and tried within a budget."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.experiments.static_compile import FixedShapeStaticCache, _decode_greedy, try_compiled_decode

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`


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


# -- the compile budget and the child process, per device ------------------------------------------------

def test_the_compile_budget_suits_the_device(monkeypatch):
    """A cold CUDA context plus Triton compiling its kernels gets 120 s; the CPU's timeout line names its C++ build."""
    from kvlab.experiments.static_compile import default_budget_s, timeout_message

    monkeypatch.delenv("KVLAB_DEVICE", raising=False)
    for device in ("cpu", "cuda"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cuda")  # a "cuda-like" machine, no GPU
        message = timeout_message(60.0)
        assert "within the 60 s budget" in message and "skipped" in message and "\n" not in message
        assert ("Triton" in message) == (device == "cuda") and ("C++" in message) == (device == "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_budget_s() == 120.0


def test_on_cpu_nothing_is_compiled_unless_a_budget_is_given(monkeypatch):
    """Run All on CPU starts no compiling child (its first compile outlasts the notebook) and says how to ask."""
    import subprocess

    from kvlab.experiments import static_compile

    monkeypatch.delenv("KVLAB_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_child(*args, **kwargs):
        raise AssertionError("a compiling child was started without a budget on CPU")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    assert static_compile.default_budget_s() is None
    result = static_compile.try_compiled_decode()
    assert result["status"] == "not started" and "budget_s=" in result["message"] and "\n" not in result["message"]
    with pytest.raises(AssertionError, match="compiling child"):
        static_compile.try_compiled_decode(budget_s=5)  # asked for: it starts


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_child_pins_compile_threads_only_on_cpu(monkeypatch, device):
    """On CPU one compile thread leaves no pool of workers behind; on CUDA Triton's kernels compile in parallel."""
    from kvlab.experiments.static_compile import child_env

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.delenv("KVLAB_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cuda")  # a "cuda-like" machine, no GPU
    env = child_env(threads=2)
    assert env["OMP_NUM_THREADS"] == "2"
    assert env.get("TORCHINDUCTOR_COMPILE_THREADS") == ("1" if device == "cpu" else None)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "7")  # the learner's own setting
    assert child_env(threads=2)["TORCHINDUCTOR_COMPILE_THREADS"] == ("1" if device == "cpu" else "7")


def test_a_compile_out_of_budget_is_stopped_without_posix_only_calls(monkeypatch):
    """Windows has no os.killpg and no SIGKILL: the time-out still stops the child (Popen.terminate there) and
    comes back as the one-line message."""
    import os
    import signal
    import subprocess

    monkeypatch.delattr(os, "killpg", raising=False)
    monkeypatch.delattr(signal, "SIGKILL", raising=False)
    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    result = try_compiled_decode(budget_s=0.5)
    assert result["status"] == "timeout" and "skipped" in result["message"] and "\n" not in result["message"]
    assert len(started) == 1 and started[0].poll() is not None  # the child really was stopped


# -- CUDA graphs: the cache's tensors are static inputs, and the result says whether a graph was captured --

def test_the_fixed_shape_cache_marks_its_tensors_as_static_inputs():
    """K/V, slots and position are written in place by the compiled step: unmarked, CUDA graph trees would skip
    the graph silently (pytorch #103985); marked, their addresses are static inputs of the graph."""
    cache = FixedShapeStaticCache(2, 2, 8, max_len=16)
    tensors = [*cache.keys, *cache.values, cache.slots, cache.position]
    assert all(getattr(t, "_dynamo_static_input_type", None) == "unguarded" for t in tensors)
    cache.reset()  # rewinds position only: the same tensors, still marked
    assert all(getattr(t, "_dynamo_static_input_type", None) == "unguarded"
               for t in [*cache.keys, *cache.values, cache.slots, cache.position])


def test_the_compiled_step_says_why_no_cuda_graph_was_captured_on_cpu(model):
    from kvlab.experiments.static_compile import compiled_decode, cuda_graph_reason

    result = compiled_decode(model, list(range(5, 29)), new_tokens=4, backend="eager", rounds=1)
    assert result["cuda_graph"] == "cpu: CUDA graphs are CUDA only"
    assert cuda_graph_reason("cpu", "reduce-overhead", "inductor") == "cpu: CUDA graphs are CUDA only"
    assert cuda_graph_reason("cuda", None, "inductor") == "not requested: mode=None"
    assert cuda_graph_reason("cuda", "default", "inductor") == "not requested: mode=default"
    assert cuda_graph_reason("cuda", "reduce-overhead", "eager") == "not requested: backend=eager"
    assert cuda_graph_reason("cuda", "reduce-overhead", "inductor") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_reduce_overhead_captures_a_cuda_graph_of_the_fixed_shape_step():
    from kvlab.experiments.static_compile import compiled_decode

    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cuda")
    result = compiled_decode(model, list(range(5, 29)), new_tokens=8, mode="reduce-overhead", rounds=1)
    assert result["cuda_graph"] == "captured", result["cuda_graph"]
    assert result["same_tokens"]
