"""kvlab serve over a real socket: the official openai client, overload, faults, cancellations, shutdown.

One server (tiny random Llama, small batch, small queue) on 127.0.0.1 and a
free port, uvicorn in a thread so the test can look at the engine's blocks.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import openai
import pytest

import kvlab
from kvlab.http.compare import compare_clocks, fetch_engine_records
from kvlab.http.loadgen import http_workload, run_loadtest
from kvlab.http.local import ServerThread
from kvlab.http.protocol import chat_template_text
from kvlab.http.server import create_app
from kvlab.serving import Engine, SchedulerConfig
from kvlab.serving.config import EngineSpec

MODEL = "tiny-llama"
MAX_WAITING, MAX_SEQS = 4, 2


@pytest.fixture(scope="module")
def server(model):
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=MAX_SEQS, max_batch_tokens=128, max_waiting=MAX_WAITING)))
    app = create_app(engine, MODEL)
    with ServerThread(app, timeout_graceful_shutdown=2) as s:
        s.app = app
        yield s


def state(server):
    return server.app.state.kvlab


def wait_idle(server, timeout_s: float = 60.0) -> dict:
    """Wait until the engine holds no request and no handler holds a stream; return the gauges."""
    st = state(server)
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        g = st.engine.gauges
        if g["num_requests_running"] == 0 and g["num_requests_waiting"] == 0 and not st.engine.streams:
            return g
        time.sleep(0.02)
    raise AssertionError(f"server not idle after {timeout_s} s: {st.engine.gauges}, streams {list(st.engine.streams)}")


def assert_nothing_leaked(server) -> None:
    wait_idle(server)
    engine = state(server).engine.engine
    assert engine.block_manager.stats().used == 0, engine.block_manager
    assert not engine.sequences and not engine.records  # every ended request retired from the engine
    assert state(server).engine.alive


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# -- the official client ------------------------------------------------------------------------
def test_openai_client_streams_completions_with_usage_and_the_greedy_tokens(server, model):
    prompt = "The cache"
    stream = client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                               stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert chunks[-1].usage.prompt_tokens == len(prompt.encode())
    assert chunks[-1].usage.completion_tokens == 12 == len(texts)
    # Oracle: single-sequence greedy generation on the same weights, one chunk per token.
    expected = kvlab.generate(model, prompt, max_new_tokens=12).tokens
    assert texts == [model.tokenizer.decode([t]) for t in expected]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert_nothing_leaked(server)


def test_openai_client_streams_chat_completions_with_usage(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why cache K and V?"}]
    stream = client(server).chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                    stream=True, stream_options={"include_usage": True},
                                                    extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert len(contents) == 6 and all(contents)
    assert chunks[-1].usage.prompt_tokens == len(chat_template_text(messages).encode())
    assert chunks[-1].usage.completion_tokens == 6


def test_a_non_streamed_answer_equals_the_streamed_one(server):
    c = client(server)
    kw = dict(model=MODEL, prompt=[72, 105, 33], max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = c.completions.create(**kw)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices)
    assert whole.choices[0].text == streamed and whole.usage.completion_tokens == 8
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.usage.completion_tokens <= 3 and chat.choices[0].finish_reason in ("length", "stop")


def test_models_health_and_metrics(server):
    assert [m.id for m in client(server).models.list()] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.url + "/metrics").text
    for name in ("kvlab_num_requests_waiting", "kvlab_num_requests_running", "kvlab_kv_blocks_used",
                 "kvlab_kv_blocks_free", "kvlab_generation_tokens_total", 'kvlab_requests_total{outcome="completed"}'):
        assert f"\n{name} " in "\n" + text, name


# -- overload -------------------------------------------------------------------------------------
def metric(server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def test_overload_every_request_is_completed_or_rejected_with_its_reason(server):
    before = {k: metric(server, f'kvlab_requests_total{{outcome="{k}"}}') for k in ("completed", "rejected_queue_full")}
    requests = http_workload("short_short", 240, arrival="all_at_once", seed=1)
    for r in requests:
        r.max_new_tokens = 16  # capacity: 2 running + 4 waiting, each ~16 steps
    result = run_loadtest(server.url, requests, MODEL, extra_body={"ignore_eos": True}, progress=False)
    s = result.summary()
    assert s.sent == 240 and s.completed + s.failed == 240 and s.waiting == s.running == 0
    assert set(s.failed_by_reason) == {"http_429:queue_full"} and s.completed >= MAX_SEQS
    rejected = [r for r in result.records if r.status == "failed"]
    assert all(r.extra["retry_after_s"] == "1" for r in rejected)
    assert all(r.output_tokens == 16 for r in result.records if r.status == "completed")
    # The server counted the same: nothing lost between the two sides.
    after = {k: metric(server, f'kvlab_requests_total{{outcome="{k}"}}') for k in before}
    assert after["completed"] - before["completed"] == s.completed
    assert after["rejected_queue_full"] - before["rejected_queue_full"] == s.failed
    assert_nothing_leaked(server)
    assert client(server).completions.create(model=MODEL, prompt="still here?", max_tokens=2).usage.completion_tokens


# -- faults -----------------------------------------------------------------------------------------
CONTEXT = kvlab.tiny_llama().max_position_embeddings


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (json.dumps({"prompt": "x"}).encode(), 400, "missing_field"),
    (json.dumps({"model": MODEL}).encode(), 400, "missing_field"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 0}).encode(), 400, "invalid_max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": -3}).encode(), 400, "invalid_max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "8"}).encode(), 400, "invalid_max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": CONTEXT}).encode(), 400, "context_length_exceeded"),
    (json.dumps({"model": MODEL, "prompt": [65] * 1000, "max_tokens": 100}).encode(), 400, "context_length_exceeded"),
    (json.dumps({"model": MODEL, "prompt": [65] * (CONTEXT + 5), "max_tokens": 1}).encode(), 400, "prompt_too_long"),
    (json.dumps({"model": MODEL, "prompt": [65, 10_000]}).encode(), 400, "invalid_prompt"),
    (json.dumps({"model": MODEL, "prompt": ""}).encode(), 400, "invalid_prompt"),
    (json.dumps({"model": MODEL, "prompt": "x", "n": 2}).encode(), 400, "unsupported_parameter"),
    (json.dumps({"model": "gpt-4o", "prompt": "x"}).encode(), 404, "model_not_found"),
], ids=["malformed", "not-object", "no-model", "no-prompt", "max0", "max-neg", "max-str", "max-context",
        "sum-context", "prompt-context", "bad-id", "empty", "n2", "unknown-model"])
def test_bad_input_gets_a_clear_openai_style_error(server, body, status, code):
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == code and err["type"] and len(err["message"]) > 10 and "param" in err


def test_bad_chat_messages_get_a_clear_error(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "robot"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_message"
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_a_client_leaving_mid_stream_cancels_its_request_and_frees_its_blocks(server):
    before = metric(server, 'kvlab_requests_total{outcome="cancelled"}')
    body = {"model": MODEL, "prompt": "a" * 100, "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert len(got) >= 2
        assert metric(server, "kvlab_kv_blocks_used") > 0  # it holds blocks while streaming
    assert_nothing_leaked(server)
    assert metric(server, 'kvlab_requests_total{outcome="cancelled"}') == before + 1
    record = next(r for r in reversed(state(server).engine.records) if r.fail_reason == "cancelled")
    assert record.status == "failed" and 2 <= len(record.token_s) < 900


def test_a_client_leaving_a_non_streamed_request_cancels_it(server):
    body = {"model": MODEL, "prompt": "b" * 50, "max_tokens": 950, "ignore_eos": True}  # far longer than 0.3 s
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.3))
    assert_nothing_leaked(server)
    assert state(server).engine.records[-1].fail_reason == "cancelled"


@pytest.fixture(scope="module")
def roomy_server(model):
    """Room in the queue for everyone, so every request is accepted and then abandoned."""
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=MAX_SEQS, max_batch_tokens=128, max_waiting=64)))
    app = create_app(engine, MODEL)
    with ServerThread(app) as s:
        s.app = app
        yield s


def test_many_concurrent_cancellations_leave_nothing_behind(roomy_server):
    server = roomy_server

    async def leave_early(c: httpx.AsyncClient, i: int) -> str:
        body = {"model": MODEL, "prompt": f"request {i} " * 5, "max_tokens": 400, "stream": True, "ignore_eos": True}
        async with c.stream("POST", server.url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return f"http_{resp.status_code}"
            if i % 2:
                return "left_waiting"  # leave right after the headers: most are still queued
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    return "left_running"  # leave after the first token
        return "ended"

    async def many() -> list[str]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=40)) as c:
            return await asyncio.gather(*(leave_early(c, i) for i in range(40)))

    outcomes = asyncio.run(many())
    assert sorted(set(outcomes)) == ["left_running", "left_waiting"]
    assert_nothing_leaked(server)
    assert metric(server, 'kvlab_requests_total{outcome="cancelled"}') == 40
    assert metric(server, 'kvlab_requests_total{outcome="completed"}') == 0
    records = state(server).engine.records
    assert len(records) == 40 and all(r.fail_reason == "cancelled" for r in records)
    assert sum(r.first_token_s is None for r in records) >= 10  # cancelled while still waiting


# -- clocks on both sides ---------------------------------------------------------------------------
def test_client_and_engine_clocks_join_and_the_client_never_sees_a_token_first(server):
    requests = http_workload("short_short", 6, arrival="constant", rate=20, seed=2)
    for r in requests:
        r.max_new_tokens = 4
    result = run_loadtest(server.url, requests, MODEL, extra_body={"ignore_eos": True})
    frame = compare_clocks(result, fetch_engine_records(server.url))
    assert len(frame) == 6 and (frame.engine_output_tokens == frame.output_tokens).all()
    # Causality: the client sends before the server receives and reads after the engine sampled.
    assert (frame.ttft_overhead_s >= 0).all() and (frame.e2e_overhead_s >= 0).all()
    assert (frame.engine_ttft_s > 0).all()


# -- shutdown -----------------------------------------------------------------------------------------
def test_shutdown_cancels_open_streams_and_frees_every_block(model):
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=64)))
    app = create_app(engine, MODEL)
    server = ServerThread(app, timeout_graceful_shutdown=1).start()
    body = {"model": MODEL, "prompt": "long", "max_tokens": 1000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
        next(resp.iter_lines())
        t = time.perf_counter()
        server.stop()  # uvicorn drains for 1 s, then cancels the stream
        assert time.perf_counter() - t < 30  # 1 s, and whatever a busy machine adds; not the 1000 tokens' time
    assert not server.thread.is_alive() and not app.state.kvlab.engine.alive
    assert engine.block_manager.stats().used == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert math.isfinite(app.state.kvlab.engine.records[-1].finished_s)
