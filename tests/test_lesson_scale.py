"""Lesson sizes per device: on CPU exactly the sizes the lessons always had; on a GPU a bigger model and longer contexts.

No GPU is needed: a "cuda-like" machine is one where ``torch.cuda.is_available()`` says True, so
``pick_device()`` answers cuda. Nothing here builds the GPU-sized model or touches CUDA.
"""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.device import pick_device
from kvlab.model.lessons import LESSON_SCALES, lesson_scale
from kvlab.experiments.slowdown import slowdown_config

LESSONS = ("01",)  # the lessons these tests belong to: `pytest -m lNN`


@pytest.fixture
def cuda_like(monkeypatch):
    monkeypatch.delenv("KVLAB_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device().type == "cuda"


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setenv("KVLAB_DEVICE", "cpu")


def test_on_cpu_the_lessons_keep_their_sizes(cpu):
    scale = lesson_scale()
    assert scale is LESSON_SCALES["cpu"]
    assert (scale.prompt_tokens, scale.max_new_tokens) == (32, 200)
    assert slowdown_config() == kvlab.tiny_llama(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                                                 intermediate_size=688, name="llama-3m")


def test_a_gpu_gets_a_bigger_model_and_longer_contexts(cuda_like):
    scale = lesson_scale()
    assert scale is LESSON_SCALES["cuda"]
    cpu_scale = LESSON_SCALES["cpu"]
    cfg = slowdown_config()
    assert cfg.name == scale.model["name"] and cfg.num_parameters() > 20 * kvlab.tiny_llama(**cpu_scale.model) \
        .num_parameters()
    assert cfg.num_kv_heads < cfg.num_heads  # still grouped-query
    assert scale.prompt_tokens > cpu_scale.prompt_tokens and scale.max_new_tokens > cpu_scale.max_new_tokens
    assert scale.prompt_tokens + scale.max_new_tokens <= cfg.max_position_embeddings
    assert "pinned host memory" in scale.offload_tier


def test_an_explicit_setting_wins_over_the_device_sizes(cuda_like):
    assert slowdown_config(hidden_size=128, name="mine").hidden_size == 128
    assert lesson_scale("cpu") is LESSON_SCALES["cpu"]  # an explicit device, whatever the machine has


def test_kvlab_device_cpu_on_a_gpu_machine_gives_the_cpu_sizes(cuda_like, monkeypatch):
    monkeypatch.setenv("KVLAB_DEVICE", "cpu")
    assert lesson_scale() is LESSON_SCALES["cpu"]
    assert slowdown_config().name == "llama-3m"


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_slowdown_panel_starts_at_the_device_sizes(request, kind):
    request.getfixturevalue("cuda_like" if kind == "cuda" else "cpu")
    from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel

    panel = slowdown_panel()  # no model is built until Run
    scale = LESSON_SCALES[kind]
    values = {name: w.value for name, w in panel.controls.items()}
    assert values["prompt_tokens"] == scale.prompt_tokens and values["max_new_tokens"] == scale.max_new_tokens


def test_run_slowdown_defaults_follow_the_model_device(cpu):
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")
    from kvlab.experiments.slowdown import run_slowdown

    frame = run_slowdown(model, caches=("dynamic",), warmup=False)
    assert (frame.attrs["prompt_tokens"], frame.attrs["max_new_tokens"]) == (32, 200)


def test_the_setup_report_states_the_gpu_sizes(cuda_like, monkeypatch):
    import kvlab.env
    from kvlab.course import setup_report

    # a machine that only says it has CUDA cannot pass the start-up check (kvlab.course.checked_device), which
    # would switch the report (and KVLAB_DEVICE) to the CPU: the sizes are what is tested here, not the check
    monkeypatch.setenv("KVLAB_DEVICE_CHECK", "0")
    monkeypatch.setattr(kvlab.env, "environment", lambda: {
        "versions": {"kvlab": kvlab.__version__, "torch": torch.__version__, "transformers": "x"},
        "python": "3", "device": "NVIDIA H200", "torch_threads": 2, "cpu_count": 16})
    report = setup_report()
    assert "device: cuda (NVIDIA H200)" in report
    scale = LESSON_SCALES["cuda"]
    assert scale.model["name"] in report and f"prompt {scale.prompt_tokens} + {scale.max_new_tokens}" in report
    assert "pinned host memory" in report and "KVLAB_DEVICE=cpu" in report
