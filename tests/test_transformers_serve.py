"""A second real engine: `transformers serve --continuous-batching` on a tiny checkpoint, measured by kvlab's load client.

One server start for the module (a tiny random Llama with a real BPE tokenizer, written offline);
few requests. The last test kills that server mid-run, so it runs last.
"""
from __future__ import annotations

import importlib.util
import threading
import time

import pytest
import torch

from kvlab.cache.none import NoCache
from kvlab.http.loadgen import http_workload, run_loadtest
from kvlab.http.peer import PEER_SPEC, kvlab_server, transformers_serve_available, transformers_server
from kvlab.http.shared_checkpoint import SAMPLE, byte_tokenizer, check_same_tokens, save_shared_checkpoint
from kvlab.model.tokenizer import ByteTokenizer

LESSONS = ("09",)  # the lessons these tests belong to: `pytest -m lNN` (the second engine of 09)
OK, WHY = transformers_serve_available()
needs_serve = pytest.mark.skipif(not OK, reason=WHY)
# The tests that start the real server belong to the full tier (pytest -m full); notebook 09 starts it by default.
full = pytest.mark.full
TRANSPORT = {"transport_error", "incomplete_stream", "connect_error", "stream_error", "bad_chunk"}


def workload(n: int, max_new_tokens: int, rate: float = 20.0):
    requests = http_workload("short_short", n, arrival="constant", rate=rate, seed=0)
    for r in requests:
        r.max_new_tokens = max_new_tokens
    return requests


def accounted(result) -> None:
    s = result.summary()
    assert s.sent == len(result.records) == s.completed + s.failed and s.waiting == 0 and s.running == 0


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from kvlab.model.tiny_checkpoint import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-llama", "llama")


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = transformers_server(tiny_folder, PEER_SPEC.replace(max_batch_tokens=256), num_blocks=64).start()
    yield s
    s.stop()


# -- the shared checkpoint: same weights, same tokens ------------------------------------------------
def test_the_byte_tokenizer_cuts_text_as_kvlabs_byte_tokenizer_does():
    tok = byte_tokenizer()
    for text in (SAMPLE, "é ünïcode\n\ttabs", ""):
        assert tok(text)["input_ids"] == ByteTokenizer().encode(text)
        assert tok.decode(ByteTokenizer().encode(text)) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)


def test_the_lesson_model_saved_as_one_folder_has_the_same_weights_and_tokens(tmp_path):
    import transformers

    from kvlab.model.loading import from_pretrained
    from kvlab.experiments.recall import load_recall_model

    lesson = load_recall_model()
    folder = save_shared_checkpoint(lesson, tmp_path / "recall-hf")
    assert check_same_tokens(folder) == ByteTokenizer().encode(SAMPLE)
    ids = torch.tensor([ByteTokenizer().encode("k3=v7;k5=v2;?k3:")])  # (1, T)
    reloaded = from_pretrained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    cfg = lesson.config
    with torch.no_grad():
        ours = lesson(ids, NoCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim))  # (1, T, vocab)
        again = reloaded(ids, NoCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim))  # (1, T, vocab)
        theirs = hf(ids).logits  # (1, T, vocab)
    assert torch.equal(ours, again)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


def test_a_tokenizer_of_another_kind_is_refused(tmp_path):
    from kvlab.experiments.recall import load_recall_model

    model = load_recall_model()
    model.tokenizer = object()
    with pytest.raises(ValueError, match="only ByteTokenizer or a transformers tokenizer"):
        save_shared_checkpoint(model, tmp_path / "x")


def test_a_folder_without_config_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        kvlab_server(tmp_path)
    with pytest.raises(ValueError, match="num_blocks=0"):
        kvlab_server(tmp_path, num_blocks=0)


# -- availability -----------------------------------------------------------------------------------
def test_unavailable_says_why_in_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    ok, why = transformers_serve_available()
    assert not ok and "accelerate" in why and "\n" not in why
    with pytest.raises(RuntimeError, match="needs accelerate"):
        transformers_server(".")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers.cli.serving.completion" else real(name, *a))
    ok, why = transformers_serve_available()
    assert not ok and "has no `transformers serve --continuous-batching`" in why and "upgrade" in why


# -- the server ---------------------------------------------------------------------------------------
@full
@needs_serve
def test_it_starts_offline_and_answers_to_the_folders_path(server, tiny_folder):
    assert server.alive() and server.model == str(tiny_folder.resolve())
    assert "--continuous-batching" in server.cmd and "--cb-num-blocks" in server.cmd


@full
@needs_serve
def test_the_load_client_completes_every_request_with_the_tokens_asked(server):
    result = run_loadtest(server.url, workload(6, max_new_tokens=5), server.model, prompt_format="text",
                          extra_body=server.extra_body, timeout_s=30, progress=False)
    accounted(result)
    assert result.summary().completed == 6, {r.fail_reason for r in result.records}
    assert result.output_tokens_from == "usage"
    assert all(r.output_tokens == 5 for r in result.records)  # eos_token_id -1: every answer runs to max_tokens
    assert result.summary().latency["ttft"]["n"] == 6


@full
@needs_serve
def test_a_bad_request_is_counted_as_failed_with_its_reason(server):
    # kvlab's ignore_eos is not in transformers' schema: 422, and the server's message is kept
    result = run_loadtest(server.url, workload(3, max_new_tokens=4), server.model, prompt_format="text",
                          extra_body={"ignore_eos": True}, timeout_s=30, progress=False)
    accounted(result)
    assert [r.fail_reason for r in result.records] == ["http_422"] * 3
    assert "ignore_eos" in result.records[0].extra["error"]
    tokens = run_loadtest(server.url, workload(2, max_new_tokens=4), server.model, prompt_format="tokens",
                          extra_body=server.extra_body, timeout_s=30, progress=False)
    assert [r.fail_reason for r in tokens.records] == ["http_400"] * 2  # token-id prompts: "prompt must be a string"


@full
@needs_serve
def test_a_server_killed_mid_run_leaves_every_request_failed_with_a_reason(server):
    requests = workload(6, max_new_tokens=400, rate=30.0)
    out = {}
    runner = threading.Thread(target=lambda: out.update(r=run_loadtest(
        server.url, requests, server.model, prompt_format="text", extra_body=server.extra_body, timeout_s=30,
        progress=False)))
    runner.start()
    time.sleep(0.4)  # the first requests are streaming
    server.process.process.kill()
    runner.join(60)
    assert not runner.is_alive()
    result = out["r"]
    accounted(result)
    failed = [r for r in result.records if r.status == "failed"]
    assert failed and {r.fail_reason for r in failed} <= TRANSPORT, {r.fail_reason for r in failed}
