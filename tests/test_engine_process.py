"""kvlab serve with its engine in a process of its own (`kvlab.http.engine_process`): the same tokens and records as
in a thread, the same accounting, and faults that still stay in their requests — a failing step, an engine process
that dies or hangs, one that cannot even build its engine.

Each server spawns a child that imports torch and builds the tiny model (a few seconds, more beside a load), so the
servers here start with a generous bound; nothing waits on the machine's speed beyond it.
"""
from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

import httpx
import pytest

import kvlab
from faults import tiny_engine
from kvlab.http.engine_loop import AsyncEngine
from kvlab.http.local import ServerThread
from kvlab.http.server import create_app, exit_when_engine_stops
from kvlab.serving import ENGINE_ERROR
from test_faults import BOUND_S, MODEL, assert_counts_add_up, burst, metrics, wait_idle

START_S = 180.0  # a spawned child imports torch and builds its model before the server says it started


def serve_in_process(factory, **options) -> ServerThread:
    front = factory()  # the front end's copy: tokenizer, lengths, the pool's size, the clock
    app = create_app(front, MODEL, engine_factory=factory, **options)
    server = ServerThread(app, timeout_graceful_shutdown=2)
    exit_when_engine_stops(app, server.server)
    server.app = app
    return server


def engine_loop(server) -> AsyncEngine:
    return server.app.state.kvlab.engine


def test_tokens_records_and_counts_as_in_a_thread_and_the_child_ends_with_the_server(model):
    server = serve_in_process(tiny_engine).start(START_S)
    try:
        loop = engine_loop(server)
        assert loop.in_own_process and loop._process.info["pid"] != os.getpid()
        prompt = "The cache"
        before = server.app.state.kvlab.engine.engine.now()
        answer = httpx.post(server.url + "/v1/completions", timeout=BOUND_S, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}).json()
        # Oracle: single-sequence greedy generation on the same weights, in this process.
        expected = kvlab.generate(model, prompt, max_new_tokens=12).tokens
        assert answer["choices"][0]["text"] == model.tokenizer.decode(expected)
        m = wait_idle(server.url)
        assert m["generation_tokens_total"] == 12 and m["requests_completed_total"] == 1 and m["kv_blocks_used"] == 0
        assert_counts_add_up(m)
        (record,) = httpx.get(server.url + "/kvlab/requests").json()  # kept by the front end, stamped by the child
        after = server.app.state.kvlab.engine.engine.now()
        # One clock: the child's stamps fall between the front end's readings before and after the request.
        assert before <= record["scheduled_s"] <= record["first_token_s"] <= record["finished_s"] <= after
        assert len(record["token_s"]) == 12
        child = loop._process.process
    finally:
        server.stop()
    child.join(10)
    assert not child.is_alive()  # stopped with the server, not left behind


def test_a_failing_step_in_the_child_fails_only_its_requests_and_the_server_serves_on():
    server = serve_in_process(functools.partial(tiny_engine, "raise_once", 2)).start(START_S)
    try:
        outcomes, took = burst(server.url, 8)
        failed, refused = outcomes.count(ENGINE_ERROR), outcomes.count("http_503")
        assert outcomes.count("completed") + failed + refused == 8 and 1 <= failed <= 4, outcomes
        m = wait_idle(server.url)
        assert m["engine_up"] == 1 and m["requests_failed_total"] == failed and m["engine_failed_steps_total"] == 1
        assert_counts_add_up(m)
        assert burst(server.url, 2)[0] == ["completed", "completed"]
    finally:
        server.stop()


def test_an_engine_process_that_dies_is_declared_stopped_and_the_server_exits():
    server = serve_in_process(tiny_engine).start(START_S)
    try:
        os.kill(engine_loop(server)._process.info["pid"], signal.SIGKILL)
        server.thread.join(BOUND_S)  # the watchdog sees the child gone: every request answered, the server exits
        assert not server.thread.is_alive()
        assert engine_loop(server).state == "stopped" and "process ended" in str(engine_loop(server).error)
    finally:
        server.stop()


def test_a_hung_step_in_the_child_is_ended_by_the_watchdog():
    server = serve_in_process(functools.partial(tiny_engine, "hang", 1, hang_s=120.0), step_timeout_s=1.0)
    server.start(START_S)
    try:
        outcomes, took = burst(server.url, 2)
        assert set(outcomes) <= {ENGINE_ERROR, "http_503"} and ENGINE_ERROR in outcomes, outcomes
        assert took < 60  # far before the hung step would have returned
        server.thread.join(BOUND_S)
        assert not server.thread.is_alive()
        child = engine_loop(server)._process.process
        child.join(10)
        assert not child.is_alive()  # a process can be ended, unlike a thread: its core is freed
    finally:
        server.stop()


def no_engine():
    raise FileNotFoundError("no checkpoint at /nowhere: pass --model a checkpoint folder")


def test_a_child_that_cannot_build_its_engine_stops_the_start_with_its_error():
    async def start():
        loop = AsyncEngine.in_process(no_engine, tiny_engine())
        loop.start()
        try:
            await loop.ready(START_S)
        finally:
            await loop.stop()

    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="could not build its engine(.|\n)*no checkpoint at /nowhere"):
        asyncio.run(start())
    assert time.perf_counter() - t < START_S


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal where CUDA is missing")
def test_serve_refuses_a_device_that_is_not_here_before_starting_anything():
    from kvlab.http import server as serve_cli

    with pytest.raises(ValueError, match="CUDA is not available"):
        serve_cli.main(["--model", "tiny-llama", "--device", "cuda", "--port", "9"])


@pytest.mark.full
def test_the_serve_command_runs_its_engine_in_its_own_process_and_stops_it_on_ctrl_c(tmp_path):
    import subprocess
    import sys

    from kvlab.http.local import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvlab", "serve", "--model", "tiny-llama", "--threads", "1",
                             "--port", str(port), "--log-level", "info"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.perf_counter() + START_S
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.perf_counter() < deadline, "kvlab serve did not become healthy"
            time.sleep(0.2)
        answer = httpx.post(url + "/v1/completions", timeout=BOUND_S, json={
            "model": "tiny-llama", "prompt": "The cache", "max_tokens": 4, "ignore_eos": True}).json()
        assert answer["usage"]["completion_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "the engine in its own process" in err
    assert "kvlab-engine" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
