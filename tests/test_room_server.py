"""A server a teacher can run for a room: an API key, JSON only, a body limit, read time-outs, and bad input as 4xx JSON.

One server with a key and a 4 KiB body limit, on loopback, uvicorn in a thread with kvlab's header
time-out protocol (as `python -m kvlab serve` runs it). Its read time-out is generous (a busy machine
must not cut off a well-behaved request); the two tests of the time-outs themselves get a server of
their own with half-second ones, and only ever send it half a request.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from kvlab.http.compare import fetch_engine_records
from kvlab.http.guard import header_timeout_protocol, is_loopback
from kvlab.http.loadgen import http_workload, run_loadtest
from kvlab.http.local import ServerThread
from kvlab.http.server import create_app
from kvlab.serving import Engine, SchedulerConfig
from kvlab.serving.config import EngineSpec

MODEL, KEY = "tiny-llama", "open-sesame"
TIMEOUT_S = 0.5  # the read time-outs under test
GENEROUS_S = 60.0  # the read time-outs of the server every other test uses
AUTH = {"Authorization": f"Bearer {KEY}"}


def keyed_server(model, read_timeout_s: float) -> ServerThread:
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=128, max_waiting=8)))
    app = create_app(engine, MODEL, api_key=KEY, max_body_bytes=4096, read_timeout_s=read_timeout_s)
    server = ServerThread(app, timeout_graceful_shutdown=1, http=header_timeout_protocol(read_timeout_s))
    server.app = app
    return server  # started by `with`


@pytest.fixture(scope="module")
def server(model):
    with keyed_server(model, GENEROUS_S) as s:
        yield s


@pytest.fixture(scope="module")
def impatient_server(model):
    with keyed_server(model, TIMEOUT_S) as s:
        yield s


def post(server, body, headers=None, path="/v1/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, timeout=GENEROUS_S,
                      headers={"content-type": "application/json", **AUTH, **(headers or {})})


# -- the key -------------------------------------------------------------------------------------------
def test_the_key_guards_every_v1_route_metrics_and_records_but_not_health(server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(server.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    for path in ("/v1/models", "/metrics", "/kvlab/requests"):
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers=AUTH).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200
    assert post(server, body).json()["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize("method, path", [("GET", "/v1/nothing-here"), ("POST", "/v1/embeddings"), ("GET", "/v1"),
                                          ("DELETE", "/v1/models"), ("GET", "/v1/completions"),
                                          ("GET", "/kvlab/unknown")])
def test_an_unknown_v1_path_asks_for_the_key_before_saying_it_is_unknown(server, method, path):
    r = httpx.request(method, server.url + path)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.request(method, server.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    known = httpx.request(method, server.url + path, headers=AUTH)  # with the key: what the path really is
    assert known.status_code in (404, 405) and known.json()["error"]["code"] in ("not_found", "method_not_allowed")
    assert httpx.get(server.url + "/nowhere").status_code == 404  # outside /v1 and /kvlab no key is asked


def test_the_openai_client_and_kvlabs_load_client_send_the_key(server, monkeypatch):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert c.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens <= 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).completions.create(
            model=MODEL, prompt="hi", max_tokens=2)
    requests = http_workload("short_short", 3, arrival="constant", rate=50, seed=3)
    for r in requests:
        r.max_new_tokens = 3
    assert run_loadtest(server.url, requests, api_key=KEY, progress=False).summary().completed == 3
    denied = run_loadtest(server.url, requests, MODEL, progress=False).summary()
    assert denied.failed_by_reason == {"http_401:invalid_api_key": 3}
    monkeypatch.setenv("KVLAB_API_KEY", KEY)  # a learner sets it once, for every kvlab client
    assert run_loadtest(server.url, requests, progress=False).summary().completed == 3
    assert len(fetch_engine_records(server.url)) >= 6
    assert "api_key" not in json.dumps(run_loadtest(server.url, requests, progress=False).settings)


# -- what a request must be --------------------------------------------------------------------------------
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_body_that_is_not_declared_json_is_refused_with_415(server, content_type):
    body = json.dumps({"model": MODEL, "prompt": "x"}).encode()
    headers = {**AUTH, **({"content-type": content_type} if content_type else {})}
    r = httpx.post(server.url + "/v1/completions", content=body, headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert post(server, body, {"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_a_body_over_the_limit_is_refused_with_413(server):
    r = post(server, {"model": MODEL, "prompt": "x" * 5000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no content-length: the limit holds while reading
        for _ in range(10):
            yield b" " * 1000
    r = httpx.post(server.url + "/v1/completions", content=chunks(),
                   headers={"content-type": "application/json", **AUTH})
    assert r.status_code == 413


BAD = [
    ("lone surrogate in a prompt", b'{"model": "tiny-llama", "prompt": "ab\\ud800c"}', "invalid_unicode"),
    ("lone surrogate in a message", b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "\\udfff"}]}',
     "invalid_unicode"),
    ("lone surrogate in a text part", b'{"model": "tiny-llama", "messages": [{"role": "user", "content": '
                                      b'[{"type": "text", "text": "\\ud800"}]}]}', "invalid_unicode"),
    ("lone surrogate as the model", b'{"model": "\\ud800", "prompt": "x"}', "model_not_found"),
    ("JSON nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
    ("a prompt nested 100,000 deep", b'{"model": "tiny-llama", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "invalid_json"),
]


@pytest.mark.parametrize("what, body, code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_json_error(model, what, body, code):
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=128)))
    app = create_app(engine, MODEL, max_body_bytes=1 << 20)
    with ServerThread(app, timeout_graceful_shutdown=1) as s:
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        r = httpx.post(s.url + path, content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and r.json()["error"]["code"] == code
        assert app.state.kvlab.counts.totals()["rejected"] == 1 and app.state.kvlab.counts.add_up()


# -- time ----------------------------------------------------------------------------------------------------
# The time-outs cut a client off after TIMEOUT_S; the checks below only ask that it happens well before the
# socket's own GENEROUS_S (a busy machine may be late by seconds; a missing time-out is late forever).
def test_a_half_sent_request_head_is_cut_off(impatient_server):
    server = impatient_server
    with socket.create_connection((server.host, server.port), timeout=GENEROUS_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        t = time.perf_counter()
        assert sock.recv(1024) == b""  # closed by the server
        assert time.perf_counter() - t < GENEROUS_S / 2


def test_a_half_sent_body_is_answered_408(impatient_server):
    server = impatient_server
    with socket.create_connection((server.host, server.port), timeout=GENEROUS_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"model\"")
        t = time.perf_counter()
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 408") and b"request_timeout" in head + sock.recv(4096)
        assert time.perf_counter() - t < GENEROUS_S / 2


def test_a_tiny_temperature_is_served_with_a_warning(server):
    r = post(server, {"model": MODEL, "prompt": "warm", "max_tokens": 4, "temperature": 1e-38, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert "raised to 0.01" in r.headers["x-kvlab-warning"]


def test_loopback_is_what_stays_on_this_machine():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10")
