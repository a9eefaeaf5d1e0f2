"""`python -m kvlab room`: the teacher's collector, a small FastAPI server storing every learner's run in SQLite.

    KVLAB_ROOM_KEY=tulip-42 python -m kvlab room --host 0.0.0.0 --db room.sqlite --inbox dropped/

Routes:

- `POST /room/submissions` (`Authorization: Bearer <room key>`, `Content-Type: application/json`, a body up to
  `--max-body-bytes`): one learner's file (`kvlab.room.record`). 201 accepted (or superseding an older run of the same
  learner and notebook), 200 duplicate (merged, nothing doubled), 401 wrong or missing key, 409 a submission id reused
  for other content, 413 too large, 415 not JSON, 422 a file that cannot be read (nested too deeply, a text too long,
  ...), with every problem and what to do. The learner's clock at sending (`X-Kvlab-Sent-At`) against the collector's
  gives its error, kept with the submission; a run whose times cannot be right against when it was received is accepted
  with a `clock_note` (`kvlab.room.store.clock_check`). A file from another kvlab major.minor version is **accepted
  with a note** (the answer's `note`, the room view marks it): refusing it would lose a learner's work in the middle of
  a workshop. One of another *schema* version cannot be read and is refused (422) with the upgrade to make.
- `GET /room/export` (key): the room file, every accepted submission as one JSON (`kvlab.room.store`); files dropped
  into `--inbox` are imported first, through the same checks.
- `GET /health`: `{"status": "ok", "submissions": n}` (no names: it needs no key).

The key, the content type and the body limit are `kvlab.http.guard`'s, as in `kvlab serve`. Without
`--key` or `$KVLAB_ROOM_KEY` a key is drawn and printed: a collector is never open to everyone.
"""
from __future__ import annotations

import argparse
import logging
import math
import secrets
import time
from pathlib import Path
from typing import Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from kvlab.command_args import command_args
from kvlab.http.guard import (MAX_BODY_BYTES, READ_TIMEOUT_S, ClientGone, answer_errors_as_json, check_api_key,
                              check_content_type, header_timeout_protocol, read_body)
from kvlab.http.protocol import APIError

from kvlab.room.record import ROOM_KEY_ENV, SENT_AT_HEADER, RoomFileError, validate
from kvlab.room.store import Store

log = logging.getLogger("kvlab.room")
STATUS = {"accepted": 201, "superseding": 201, "duplicate": 200}


def _check_room_key(request: Request, key: str) -> None:
    """kvlab.http.guard's key check, its message naming the room's key rather than a model server's."""
    try:
        check_api_key(request, key)
    except APIError as e:
        what = e.message.split(":", 1)[0].replace("API key", "room key").replace("server's", "room's")
        raise APIError(401, f"{what}: share(..., key=...) or set ${ROOM_KEY_ENV} to the key your teacher gave; "
                            "or save the file (url=None) and hand it over", e.code, headers=e.headers) from None


def clock_offset(request: Request, now: float) -> float | None:
    """The collector's clock (``now``) minus the learner's, from the ``SENT_AT_HEADER`` ``LearnerRun.submit`` sends
    (None without one: an older kvlab, or another client)."""
    try:
        sent = float(request.headers.get(SENT_AT_HEADER, "nan"))
    except ValueError:
        return None
    return now - sent if math.isfinite(sent) else None


def create_app(store: Store, key: str, inbox: str | Path | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               read_timeout_s: float = READ_TIMEOUT_S, clock: Callable[[], float] = time.time) -> FastAPI:
    """The collector over ``store``; ``key`` is required on submissions and export (`app.state.store`). ``clock``:
    the collector's wall clock (unix seconds), which learners' clocks are measured against."""
    if not key:
        raise ValueError(f"the collector needs a room key (--key or ${ROOM_KEY_ENV}); none was given")
    app = FastAPI(title="kvlab room", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store

    def import_inbox() -> None:
        if inbox is not None and Path(inbox).is_dir():
            for name, outcome in store.import_folder(inbox):
                if outcome.status != "duplicate":
                    log.info("inbox %s: %s — %s", name, outcome.status, outcome.message)

    answer_errors_as_json(app)

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok", "submissions": await run_in_threadpool(store.count)})

    @app.post("/room/submissions")
    async def submit(request: Request) -> Response:
        arrived = clock()
        offset = clock_offset(request, arrived)  # at once: the body's transfer time is not the learner's clock error
        _check_room_key(request, key)
        check_content_type(request)
        try:
            raw = await read_body(request, max_body_bytes, read_timeout_s)
        except ClientGone:
            return Response(status_code=400)  # nobody reads it
        try:
            run = validate(raw)
        except RoomFileError as e:
            log.warning("refused a submission: %s", e)
            raise APIError(422, str(e), "invalid_room_file") from None
        outcome = await run_in_threadpool(store.add, run, "http", offset, arrived)  # committed before we answer
        if not outcome.ok:
            log.warning("refused %s's %s: %s", run.learner, run.notebook, outcome.message)
            raise APIError(409, outcome.message, "submission_conflict")
        notes = "; ".join(n for n in (outcome.note, outcome.clock_note) if n) or None
        log.info("%s: %s%s", outcome.status, outcome.message, f" ({notes})" if notes else "")
        return JSONResponse({"status": outcome.status, "message": outcome.message + (
            f" — note: {notes}" if notes else ""), "submission_id": outcome.submission_id,
            "note": outcome.note, "clock_note": outcome.clock_note}, status_code=STATUS[outcome.status])

    @app.get("/room/export")
    async def export(request: Request) -> Response:
        _check_room_key(request, key)
        await run_in_threadpool(import_inbox)
        return JSONResponse(await run_in_threadpool(store.room_file))

    import_inbox()
    return app


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab room`."""
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default loopback only; 0.0.0.0 for learners on the room's network)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--db", default="room.sqlite", help="the SQLite file (kept across restarts; default room.sqlite)")
    p.add_argument("--key", default=None,
                   help=f"the room key learners send (default ${ROOM_KEY_ENV}, else one is drawn and printed)")
    p.add_argument("--inbox", default=None, help="a folder of learners' files to import (checked again on export)")
    p.add_argument("--export", default=None, metavar="PATH",
                   help="write the room file from --db (and --inbox) to PATH and exit, serving nothing")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="larger submissions get 413")
    p.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S)
    p.add_argument("--log-level", default="info")


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Serve until interrupted (0); with --export, write the room file and exit."""
    import os

    args = command_args(args, "python -m kvlab room", __doc__, add_arguments)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    store = Store(args.db)
    if args.export:
        from kvlab.room.store import write_room_file

        if args.inbox:
            store.import_folder(args.inbox)
        path = write_room_file(args.export, store)
        print(f"wrote {path}: {store.count()} submission(s) from {args.db}")
        return 0
    key = args.key or os.environ.get(ROOM_KEY_ENV) or secrets.token_urlsafe(6)
    app = create_app(store, key, args.inbox, args.max_body_bytes, args.read_timeout)
    import uvicorn

    shown = key if not (args.key or os.environ.get(ROOM_KEY_ENV)) else "(the key you set)"
    print(f"kvlab room on http://{args.host}:{args.port}: {store.count()} submission(s) in {args.db}; "
          f"room key {shown}\n  learners: share(name=..., notebook=..., url='http://<this machine>:{args.port}', "
          f"key=...)", flush=True)
    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                                  http=header_timeout_protocol(args.read_timeout))).run()
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
