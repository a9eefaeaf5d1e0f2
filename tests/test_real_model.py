"""The real-model section: offline it says so at once and the lesson goes on; given a checkpoint it measures.

No test reaches the network: the hub is made unreachable (an offline variable, a refused port, a
DNS lookup that hangs), and the demonstration runs on a tiny checkpoint saved here
(``kvlab.model.tiny_checkpoint``), loaded by path exactly as a downloaded one would be.
"""
from __future__ import annotations

import socket
import time

import pytest

import kvlab
from kvlab.experiments import real_model
from kvlab.experiments.real_model import hub_reachable, real_model_demo, try_real_model
from kvlab.model.tiny_checkpoint import save_tiny_checkpoint
from kvlab.model.tokenizer import HFTokenizer

LESSONS = ("02",)  # the lessons these tests belong to: `pytest -m lNN`

NOT_CACHED = "kvlab-tests/not-a-model"  # a hub name no cache holds


@pytest.fixture
def online_env(monkeypatch):
    """No offline variable set, and a hub endpoint that refuses at once (port 9 on loopback)."""
    for name in real_model.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.mark.parametrize("variable", real_model.OFFLINE_VARIABLES)
def test_offline_variable_means_no_model_and_a_one_line_note(monkeypatch, variable):
    for name in real_model.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(real_model, "hub_reachable", lambda *a, **k: pytest.fail("probed the network while offline"))
    t0 = time.perf_counter()
    model, note = try_real_model(NOT_CACHED)
    assert model is None
    assert time.perf_counter() - t0 < 10  # only the local cache is looked at
    assert "\n" not in note and f"{variable}=1" in note and "continues on the shipped model" in note


def test_an_unreachable_hub_means_no_model_and_a_note(online_env):
    t0 = time.perf_counter()
    model, note = try_real_model(NOT_CACHED, timeout_s=2)
    assert model is None
    assert time.perf_counter() - t0 < 10
    assert "did not answer within 2 s" in note and "continues on the shipped model" in note and "\n" not in note


def test_a_hanging_dns_lookup_does_not_hold_the_notebook(online_env, monkeypatch):
    """getaddrinfo has no timeout of its own: the probe gives up after timeout_s all the same."""
    real = socket.getaddrinfo

    def hang(host, *args, **kwargs):
        if host == "kvlab-hangs.invalid":
            time.sleep(30)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hang)
    t0 = time.perf_counter()
    assert hub_reachable(timeout_s=0.5, endpoint="http://kvlab-hangs.invalid") is False
    assert time.perf_counter() - t0 < 10  # the probe's 0.5 s, and a busy machine's lag: not the lookup's 30 s


def test_a_refused_connection_is_unreachable_and_quick(online_env):
    t0 = time.perf_counter()
    assert hub_reachable(timeout_s=20) is False
    assert time.perf_counter() - t0 < 10  # refused at once: well within the probe's 20 s time-out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("smol-like"), "llama", seed=0)


def test_a_checkpoint_directory_loads_without_the_network(checkpoint, online_env, monkeypatch, device):
    monkeypatch.setattr(real_model, "hub_reachable", lambda *a, **k: pytest.fail("probed the network for a folder"))
    model, note = try_real_model(checkpoint, device=device)
    assert isinstance(model, kvlab.Decoder) and isinstance(model.tokenizer, HFTokenizer)
    assert note.startswith(f"loaded the checkpoint at {checkpoint}") and "KV heads" in note and "\n" not in note


def test_the_demonstration_returns_text_speed_and_memory_tables(checkpoint, device):
    model, _ = try_real_model(checkpoint, device=device)
    demo = real_model_demo(model, prompt="The cache keeps", new_tokens=12, slowdown_prompt_tokens=16,
                           slowdown_tokens=16, threads=1)
    assert set(demo.tables()) == {"text", "speed", "memory", "scale"}

    text = demo.text.iloc[0]
    assert text["prompt"] == "The cache keeps" and 1 <= text["new_tokens"] <= 12
    assert text["continuation"] == kvlab.generate(model, "The cache keeps", max_new_tokens=12,
                                                  stop_tokens=[model.tokenizer.eos_token_id]).text

    speed = demo.speed.set_index("cache")
    assert list(speed.index) == ["none", "dynamic"]
    assert speed.at["dynamic", "work_ratio"] == 1.0 and speed.at["none", "work_ratio"] > 1.0
    assert speed.at["dynamic", "x_dynamic"] == 1.0 and (speed["decode_ms_p50"] > 0).all()
    assert speed.attrs["prompt_tokens"] == 16 and speed.attrs["max_new_tokens"] == 16

    memory = demo.memory.set_index("cache")
    cfg = model.config
    tokens = int(text["prompt_tokens"]) + 12 - 1  # the last token is not fed back
    assert memory.at["dynamic", "tokens"] == tokens
    assert memory.at["dynamic", "allocated_bytes"] == memory.at["dynamic", "formula_bytes"] == \
        kvlab.kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, tokens, 1, 4)
    assert memory.at["static", "used_bytes"] == memory.at["static", "formula_bytes"]
    assert memory.at["static", "allocated_over_formula"] > 1.0  # room reserved for the token not fed back

    scale = demo.scale
    assert set(scale["context"]) == {2048, cfg.max_position_embeddings} and set(scale["batch"]) == {1, 32}
    assert (scale["bytes_per_element"] == 2).all()


def test_the_demonstration_refuses_too_few_tokens_for_a_slowdown_summary(checkpoint, device):
    model, _ = try_real_model(checkpoint, device=device)
    with pytest.raises(ValueError, match="slowdown_tokens must be an integer >= 16"):
        real_model_demo(model, slowdown_tokens=8)


def test_a_hub_name_that_looks_like_a_file_is_still_a_hub_name(online_env, monkeypatch):
    """'Qwen/Qwen2.5-0.5B' has a dot: it is a hub name, not a missing file."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="could not get 'Qwen/Qwen2.5-0.5B'.*local cache") as info:
        kvlab.from_pretrained("Qwen/Qwen2.5-0.5B", local_files_only=True)
    assert "no checkpoint directory" not in str(info.value)
