"""One streamed request over HTTP, stamped into a RequestRecord; and the connection lanes that carry them.

`stream_request` sends one OpenAI-style streamed request and stamps, on the caller's clock, when its headers went out
(`sent_s`, httpcore's trace hook) and when each server-sent event carrying text arrived (a token). It never raises for
HTTP trouble: every failure becomes the record's `fail_reason` (see `kvlab.http.loadgen`). `ConnectionLanes` hands out
keep-alive connections, one request at a time each.

API key: a server run with `--api-key` wants `Authorization: Bearer <key>`. The client's key is the one given
(`api_key=`, `--api-key`), else `$KVLAB_API_KEY`; never `$OPENAI_API_KEY`, so a learner's real OpenAI key is not sent
to a classroom server by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import TYPE_CHECKING

import httpx

from kvlab.clocks import RequestRecord

if TYPE_CHECKING:
    import ssl

API_KEY_ENV = "KVLAB_API_KEY"


def api_key_from_env(value: str | None = None) -> str | None:
    """`value` if given, else `$KVLAB_API_KEY`; None (no key) when neither is set or it is empty."""
    return (value if value is not None else os.environ.get(API_KEY_ENV)) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header that carries `api_key` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# -- one request -----------------------------------------------------------------------
def _error_reason(status: int, raw: bytes) -> tuple[str, str]:
    """(`http_<status>[:<code>]`, message) from an OpenAI-style error body, or the raw text."""
    message, code = raw[:500].decode("utf-8", errors="replace"), None
    try:
        err = json.loads(raw)
        err = err.get("error", err) if isinstance(err, dict) else {}
        if isinstance(err, dict):
            message = str(err.get("message", message))
            code = err.get("code") or err.get("type")
        elif isinstance(err, str):
            message = err
    except ValueError:
        pass
    return (f"http_{status}:{code}" if isinstance(code, str) and code else f"http_{status}"), message


def _chunk_text(choice: dict, chat: bool) -> str | None:
    if chat:
        delta = choice.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content")
    return choice.get("text")


async def stream_request(client: httpx.AsyncClient, endpoint: str, payload: bytes, record: RequestRecord,
                      chat: bool, clock, headers: dict[str, str] | None = None) -> None:
    """Send one streamed request and stamp its chunks into `record` (never raises for HTTP trouble).

    `headers` are sent besides `content-type: application/json` (e.g. `auth_headers(key)`).
    """

    async def trace(name: str, info: dict) -> None:
        if name == "connection.connect_tcp.started":
            record.extra["connect_started_s"] = clock()
        elif name == "connection.connect_tcp.complete" and "connect_started_s" in record.extra:
            record.extra["connect_s"] = clock() - record.extra.pop("connect_started_s")  # a new connection opened
        if name.endswith("send_request_headers.started") and "sent" not in record.extra:
            record.sent_s = clock()
            record.extra["sent"] = True

    usage, finish_reason, done, chunks = None, None, False, 0
    try:
        async with client.stream("POST", endpoint, content=payload,
                                 headers={**(headers or {}), "content-type": "application/json"},
                                 extensions={"trace": trace}) as resp:
            if resp.status_code != 200:
                reason, message = _error_reason(resp.status_code, await resp.aread())
                record.extra["error"] = message
                if "retry-after" in resp.headers:
                    record.extra["retry_after_s"] = resp.headers["retry-after"]
                record.fail(clock(), reason)
                return
            async for line in resp.aiter_lines():
                t = clock()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, `event:` lines
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True  # keep reading to the end of the body, so the connection is kept alive
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError:
                    record.extra["error"] = data[:200]
                    record.fail(t, "bad_chunk")
                    return
                if "error" in chunk:
                    record.extra["error"] = str(chunk["error"])[:500]
                    record.fail(t, "stream_error")
                    return
                if chunks == 0 and "id" in chunk:
                    record.extra["response_id"] = chunk["id"]  # joins this record to the server's own
                usage = chunk.get("usage") or usage
                choices = chunk.get("choices") or ()
                if any(_chunk_text(c, chat) for c in choices):
                    record.token(t)
                    chunks += 1
                for c in choices:
                    finish_reason = c.get("finish_reason") or finish_reason
    except httpx.TransportError as e:
        record.extra["error"] = f"{type(e).__name__}: {e}"
        record.fail(clock(), "connect_error" if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                    else "timeout" if isinstance(e, httpx.TimeoutException) else "transport_error")
        return
    end = clock()
    record.extra.update(finish_reason=finish_reason, chunks=chunks)
    if usage:
        record.extra["prompt_tokens_reported"] = usage.get("prompt_tokens")
    if not (done or finish_reason):
        record.fail(end, "incomplete_stream")
        return
    reported = usage.get("completion_tokens") if usage else None
    record.extra["output_tokens_from"] = "usage" if reported is not None else "chunks"
    # E2E ends at the last token, as in vLLM; a request with no token ends at [DONE].
    record.finish(record.token_s[-1] if record.token_s else end, output_tokens=reported)


# -- the connections ------------------------------------------------------------------------
class ConnectionLanes:
    """Up to `size` keep-alive HTTP/1.1 connections, each held by its own one-connection httpx client.

    One shared `httpx.AsyncClient` pool rescans every connection (and polls each socket) whenever a request starts or
    ends, O(connections^2) per request: at 64 connections it cost the client three times the CPU per request of 1
    connection, so the client became the bottleneck it should measure. One-connection clients handed out from a LIFO
    queue cost O(1) per request and reuse the warmest connection first. A request waiting for a free lane is a client
    falling behind: it shows as `send_delay_s`.
    """

    def __init__(self, size: int, timeout_s: float, tls: bool = False) -> None:
        self.size, self.timeout, self.tls = size, httpx.Timeout(timeout_s), tls
        self.clients: list[httpx.AsyncClient] = []
        self._idle: asyncio.LifoQueue | None = None
        self._ssl: ssl.SSLContext | None = None

    def _new_client(self) -> httpx.AsyncClient:
        assert self._ssl is not None, "lanes are opened by `async with`"  # __aenter__ sets it before any lane
        transport = httpx.AsyncHTTPTransport(verify=self._ssl, limits=httpx.Limits(max_connections=1,
                                                                                    max_keepalive_connections=1))
        client = httpx.AsyncClient(transport=transport, timeout=self.timeout, trust_env=False)
        self.clients.append(client)
        return client

    @contextlib.asynccontextmanager
    async def lane(self):
        """A client with one connection, for one request at a time."""
        client = await self._idle.get()
        if client is None:
            client = self._new_client()
        try:
            yield client
        finally:
            self._idle.put_nowait(client)

    async def __aenter__(self) -> "ConnectionLanes":
        import ssl

        # One TLS context for all lanes, built before the run's clock starts: loading the CA store takes ~0.1 s (far
        # more on a busy machine), which the first request would pay. Plain http never uses it, so it gets an empty one.
        self._ssl = ssl.create_default_context() if self.tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._idle = asyncio.LifoQueue()
        for _ in range(self.size - 1):
            self._idle.put_nowait(None)  # a lane not opened yet
        self._idle.put_nowait(self._new_client())  # the first lane, ready before the clock starts
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
