"""What a server open to a room checks before a request reaches the model: API key, content type, size, time.

- **API key** (`--api-key`, or `$KVLAB_API_KEY`): when set, every `/v1` route (completions and `/v1/models`, as OpenAI
  and vLLM do), `/metrics` and `/kvlab/requests` need OpenAI's header `Authorization: Bearer <key>` (compared in
  constant time); `/health` stays open, for supervisors. `KVLAB_API_KEY`, not `OPENAI_API_KEY`: a learner's real OpenAI
  key must never be sent to a classroom server by default.
- **Content type**: a POST must say `application/json`. A web page can send `text/plain` (or form data) to any address
  without asking first; JSON needs the browser's permission (a CORS preflight this server never grants), so no page a
  learner opens can drive the server on their machine.
- **Size**: a body over `max_body_bytes` is refused with 413.
- **Time**: a client gets `read_timeout_s` to send its request headers (else the connection is closed) and as long
  again to send its body (else 408): half-sent requests do not hold connections forever.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from kvlab.http.client import API_KEY_ENV, api_key_from_env  # noqa: F401 (one home: the client's side)
from kvlab.http.protocol import APIError

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 32k-token prompt as a list of ids is ~200 KB
READ_TIMEOUT_S = 10.0
JSON_TYPES = ("application/json",)


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


def check_api_key(request: Request, api_key: str | None) -> None:
    """Raise 401 unless `api_key` is unset or the request carries it as `Authorization: Bearer <key>`."""
    if api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        what = "no API key was sent" if not given else "the API key sent is not this server's"
        raise APIError(401, f"{what}: send the header `Authorization: Bearer <key>` (the openai client's "
                            f"api_key=..., kvlab's api_key=... or ${API_KEY_ENV}); ask whoever runs the server",
                       "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_content_type(request: Request) -> None:
    """Raise 415 unless the body is declared `application/json` (a charset parameter is fine)."""
    given = request.headers.get("content-type", "")
    if given.split(";")[0].strip().lower() not in JSON_TYPES:
        raise APIError(415, f"the request body must be JSON sent with `Content-Type: application/json`, got "
                            f"{given or 'no content type'!r}", "unsupported_media_type", "content-type")


async def read_body(request: Request, max_bytes: int = MAX_BODY_BYTES, timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The whole body, or 413 past `max_bytes`, 408 when it takes longer than `timeout_s`; ClientGone if the client left."""
    declared = request.headers.get("content-length")
    too_big = APIError(413, f"the request body is larger than this server's limit of {max_bytes:,} bytes; send a "
                            "shorter prompt", "request_too_large")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    chunks: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_big
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s", "request_timeout") from None
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server to this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def header_timeout_protocol(timeout_s: float = READ_TIMEOUT_S) -> type:
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head within `timeout_s`.

    uvicorn times out idle kept-alive connections but not a request whose headers are still
    coming (a "slowloris" client holds its connection forever). The timer runs from the
    connection's start and from the end of each response until the next request's headers are in.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection that sent no whole request within %g s", timeout_s)
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers are in: the app has it now
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # before: a pipelined request handled inside disarms it again
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


def error_response(e: APIError, headers: dict | None = None) -> Response:
    """``e`` as OpenAI's JSON error body. ASCII-escaped JSON: a message quoting the client's text (a lone surrogate
    even) always encodes."""
    return Response(json.dumps(e.body()), status_code=e.status, headers={**e.headers, **(headers or {})},
                    media_type="application/json")


GUARDED_PREFIXES = ("/v1/", "/kvlab/")  # what the key guards, known routes or not (plus "/v1" itself)


def answer_errors_as_json(app, api_key: str | None = None) -> None:
    """Every error of the FastAPI ``app`` answered as that JSON body: its own `APIError`s, starlette's (404 for
    an unknown path, 405 for a wrong method) and a bug's 500. With ``api_key`` set, a path under `/v1` or
    `/kvlab` that no route serves asks for the key first (401), as the known ones do: without the key,
    nothing says which paths exist."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = request.url.path
        if path == "/v1" or path.startswith(GUARDED_PREFIXES):
            try:
                check_api_key(request, api_key)
            except APIError as e:
                return error_response(e)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(APIError(exc.status_code, f"{request.method} {path}: {exc.detail}", code))

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> Response:  # still JSON; starlette logs the traceback
        return error_response(APIError(500, f"the server failed on this request ({type(exc).__name__}); the "
                                            "server's log has the details", "internal_error", type_="server_error"))
