"""A learner's run as one file: who (a typed name), on what machine, and what one notebook predicted, measured and checked.

The file is versioned JSON (``SCHEMA``, ``SCHEMA_VERSION``), built at the end of a notebook::

    run = LearnerRun("Ada", "01_the_slowdown.ipynb")
    run.add_prediction(guess.against(measured))          # a Comparison, or a guess and its measurement
    run.add_verdicts(verdicts(result, "later_tokens_cost_more"))
    run.add_figure("late_early_ratio", 2.5)
    run.add_requests(load_test_result)                   # notebook 09: the client's per-request records
    run.save()                                           # kvlab-room-Ada-01_the_slowdown.json, or
    run.submit("http://teacher:8100", key)               # to the teacher's collector (kvlab.room.collector)

Nothing personal goes in besides the name the learner types: the machine facts are an allow-list of
``kvlab.env.environment()`` (device, CPU model, threads, versions), each value scrubbed of this machine's host name,
home folder and anything that looks like a path; no prompts, no URLs, no settings a learner typed. ``validate(dict)``
is what the collector and the folder import read a file with: every problem named, with what to do.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvlab.results_io import to_json
from kvlab.version import __version__

SCHEMA, SCHEMA_VERSION = "kvlab-room-run", 1
ROOM_KEY_ENV = "KVLAB_ROOM_KEY"  # not $KVLAB_API_KEY: the room's key is not the model server's
MAX_NAME = 40
MAX_REQUESTS = 5000  # per file: 09's client sends tens to hundreds
MAX_TEXT = 200  # characters of any text in a file (a prediction's question is the longest: add_prediction cuts it)
MAX_DEPTH = 6  # levels of nesting a file may hold (it needs 4: the file, machine, versions, a value)
# The machine facts a room file keeps (everything else environment() says stays on the machine).
MACHINE_KEYS = ("device", "device_class", "cpu", "cpu_count", "torch_threads", "cuda_device", "machine", "python",
                "system", "runtime", "versions")
VERSION_PACKAGES = ("kvlab", "torch", "transformers", "numpy", "pandas")
REQUEST_STATUSES = ("completed", "failed", "waiting", "running")
SENT_AT_HEADER = "X-Kvlab-Sent-At"  # the learner's clock (unix s) as submit sends: the collector measures its error
NOTEBOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,78}\.ipynb$")


class RoomFileError(ValueError):
    """A room file that cannot be read: ``problems`` lists each one, the message says what to do."""

    def __init__(self, problems: list[str], what: str = "this room file") -> None:
        self.problems = problems
        super().__init__(f"{what} cannot be accepted: " + "; ".join(problems))


def check_name(name: Any) -> str:
    """The learner's name, stripped; ValueError naming the rule when it breaks it (1-40 printable, no / or \\)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("the name is empty: type the name the teacher should see, e.g. name='Ada'")
    name = name.strip()
    if len(name) > MAX_NAME:
        raise ValueError(f"the name {name[:20]!r}... has {len(name)} characters; use at most {MAX_NAME}")
    if not name.isprintable():
        raise ValueError(f"the name {name!r} holds a control character (a tab, a line break); type it on one line")
    if any(c in name for c in "/\\") or name in (".", ".."):
        raise ValueError(f"the name {name!r} holds a path separator (/ or \\); use letters, digits, spaces, - or _")
    return name


def _scrub(value: Any, personal: tuple[str, ...]) -> Any:
    """`value` with any string that looks like a path, or names this machine or its user (as a whole word),
    replaced by "(removed)"."""
    if isinstance(value, str):
        if "/" in value or "\\" in value or any(re.search(rf"(?<![A-Za-z0-9]){re.escape(p)}(?![A-Za-z0-9])", value,
                                                            re.IGNORECASE) for p in personal):
            return "(removed)"
        return value[:MAX_TEXT]
    if isinstance(value, Mapping):
        return {k: _scrub(v, personal) for k, v in value.items()}
    return value


def machine_facts(env: Mapping | None = None, runtime: str | None = None) -> dict:
    """The allow-listed, scrubbed part of ``kvlab.env.environment()`` (or of ``env``): nothing personal."""
    if env is None:
        from kvlab.env import environment  # lazy: collecting versions imports torch

        env = environment()
    facts = {k: env.get(k) for k in MACHINE_KEYS if k in env}
    facts["versions"] = {p: (env.get("versions") or {}).get(p) for p in VERSION_PACKAGES}
    facts["device_class"] = env.get("device_class") or ("cuda" if env.get("cuda_device") else "cpu")
    facts["system"] = env.get("system") or str(env.get("platform", "")).split("-")[0] or None
    if runtime is not None:
        facts["runtime"] = runtime
    personal = (socket.gethostname(), os.path.expanduser("~"), os.environ.get("USER", ""),
                os.environ.get("USERNAME", ""))
    return _scrub(facts, tuple(p for p in personal if len(p) >= 2))  # matched as whole words


def _number(x: Any) -> float | None:
    """A float, or None for a missing or non-finite value (JSON has no NaN)."""
    if x is None or isinstance(x, bool):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60] or "question"


@dataclass
class LearnerRun:
    """One learner's run of one notebook: predictions, verdicts, headline figures and (09) request records."""

    learner: str
    notebook: str
    machine: dict = field(default_factory=dict)
    predictions: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)
    load: dict = field(default_factory=dict)  # 09: when the client started (unix s) and what it offered
    submission_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    kvlab_version: str = __version__

    def __post_init__(self) -> None:
        self.learner = check_name(self.learner)
        if not NOTEBOOK_NAME.match(self.notebook or ""):
            raise ValueError(f"notebook {self.notebook!r} is not a notebook's file name; pass e.g. "
                             "'01_the_slowdown.ipynb'")

    # -- what a notebook adds --------------------------------------------------------------------
    def add_prediction(self, comparison_or_guess: Any, measured: float | None = None, *, question: str | None = None,
                       unit: str | None = None) -> "LearnerRun":
        """A prediction and its measurement: a ``Comparison`` (``guess.against(x)``), a ``Prediction`` box
        with ``measured``, or a plain number with ``measured`` and ``question``."""
        c = comparison_or_guess
        if hasattr(c, "predicted") and hasattr(c, "measured"):  # Comparison
            text, guess, unit, measured = c.question, c.predicted, unit or c.unit, c.measured
        elif hasattr(c, "value") and hasattr(c, "question"):  # Prediction box
            text, guess, unit = c.question, c.value, unit or c.unit
        else:
            text, guess = question, c
        text = question or text
        if not text:
            raise ValueError("a prediction needs its question: add_prediction(guess, measured, question='...')")
        self.predictions.append({"question": _slug(text), "text": str(text)[:MAX_TEXT], "guess": _number(guess),
                                 "measured": _number(measured), "unit": str(unit or "")[:MAX_TEXT]})
        return self

    def add_verdicts(self, verdicts: Iterable[Any]) -> "LearnerRun":
        """Each claim's verdict (``kvlab.lessons.verdicts(...)``): its name, whether it held, its numbers."""
        for v in verdicts:
            if isinstance(v, Mapping):
                name, holds, asserts, values = v["claim"], v.get("holds"), v.get("asserts", True), v.get("values", {})
            else:
                name, holds = v.claim.name, v.holds
                asserts, values = getattr(v.claim, "asserts", True), getattr(v, "values", {})
            numbers = {str(k)[:MAX_TEXT]: _number(x) for k, x in dict(values).items()
                       if isinstance(x, (int, float)) and not isinstance(x, bool)}
            self.verdicts.append({"claim": str(name)[:MAX_TEXT], "holds": None if holds is None else bool(holds),
                                  "asserts": bool(asserts), "values": numbers})
        return self

    def add_figure(self, name: str, value: float | None) -> "LearnerRun":
        """One headline figure the course map names (01's late/early ratio, 05's continuous/static ratio, ...)."""
        self.figures[str(name)[:MAX_TEXT]] = _number(value)
        return self

    def add_requests(self, result: Any, started_at: float | None = None) -> "LearnerRun":
        """09: the client's per-request records (a ``LoadTestResult`` or a list of ``RequestRecord``).

        ``started_at`` (unix seconds when the run began) puts everyone's requests on one time axis; by
        default it is the ``started_at_unix`` the load generator recorded when its clock started, so sharing
        later places the requests where they happened. Only for records without it (a plain list), it is
        estimated as now minus the run's wall time (``load["started_at_from"]`` says which).
        """
        import time

        records = getattr(result, "records", result)
        settings = getattr(result, "settings", {}) or {}
        source = "caller"
        if started_at is None and _number(settings.get("started_at_unix")) is not None:
            started_at, source = settings["started_at_unix"], "client"
        elif started_at is None:
            started_at, source = time.time() - float(getattr(result, "wall_s", 0.0)), "share"
        for r in list(records)[:MAX_REQUESTS - len(self.requests)]:
            self.requests.append({"request_id": str(r.request_id)[:MAX_TEXT], "prompt_tokens": int(r.prompt_tokens),
                                  "max_new_tokens": int(r.max_new_tokens), "scheduled_s": _number(r.scheduled_s),
                                  "sent_s": _number(r.sent_s), "admitted_s": _number(r.admitted_s),
                                  "first_token_s": _number(r.first_token_s), "finished_s": _number(r.finished_s),
                                  "status": r.status, "fail_reason": None if r.fail_reason is None
                                  else str(r.fail_reason)[:MAX_TEXT],
                                  "output_tokens": int(r.output_tokens)})
        self.load = {"started_at": float(started_at), "started_at_from": source,
                     **{k: settings[k] for k in ("num_requests", "rate", "profile", "max_connections")
                        if isinstance(settings.get(k), (int, float, str)) and not isinstance(settings.get(k), bool)}}
        return self

    # -- the file ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kvlab_version": self.kvlab_version,
                "submission_id": self.submission_id, "created": self.created, "learner": self.learner,
                "notebook": self.notebook, "machine": self.machine, "predictions": self.predictions,
                "verdicts": self.verdicts, "figures": self.figures, "requests": self.requests, "load": self.load}

    def to_json(self) -> str:
        return to_json(self.to_dict())

    @property
    def file_name(self) -> str:
        """``kvlab-room-<name>-<notebook>.json``, the name reduced to letters, digits, - and _."""
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.learner)
        return f"kvlab-room-{safe}-{self.notebook.removesuffix('.ipynb')}.json"

    def save(self, path: str | Path | None = None) -> Path:
        """Write the file (default: ``file_name`` in the working folder); returns its path."""
        path = Path(path) if path is not None else Path(self.file_name)
        if path.is_dir():
            path = path / self.file_name
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    def submit(self, url: str, key: str | None = None, timeout_s: float = 10.0) -> str:
        """POST the file to the collector at ``url``; returns its message, raises RuntimeError saying why not."""
        import time

        import httpx

        from kvlab.http.client import auth_headers

        key = key if key is not None else os.environ.get(ROOM_KEY_ENV) or None
        try:
            r = httpx.post(url.rstrip("/") + "/room/submissions", content=self.to_json().encode(), timeout=timeout_s,
                           headers={**auth_headers(key), "content-type": "application/json",
                                    SENT_AT_HEADER: f"{time.time():.3f}"})  # the collector measures this clock
        except httpx.HTTPError as e:
            raise RuntimeError(f"the collector at {url} could not be reached ({type(e).__name__})") from None
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code >= 400:
            message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
            raise RuntimeError(f"the collector refused it (HTTP {r.status_code}): {message or r.text[:200]}")
        return str(body.get("message", f"HTTP {r.status_code}"))


def validate(data: Any) -> LearnerRun:
    """A room file (dict, JSON text or bytes) as a LearnerRun; RoomFileError listing every problem and its fix.

    A file from another kvlab version is read (the schema is what must match); the collector notes it.
    """
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise RoomFileError([f"it is not JSON ({e}); send the file share() or LearnerRun.save() wrote, "
                                 "unedited"]) from None
        except RecursionError:
            raise RoomFileError(["it is JSON nested too deeply to read; send the file share() or LearnerRun.save() "
                                 "wrote, unedited"]) from None
    if not isinstance(data, dict):
        raise RoomFileError([f"it is a JSON {type(data).__name__}, not an object; send the file share() wrote"])
    p: list[str] = _shape_problems(data)
    if p:
        raise RoomFileError(p)
    if data.get("schema") != SCHEMA:
        raise RoomFileError([f"schema is {data.get('schema')!r}, not {SCHEMA!r}: this is not a kvlab room file"])
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RoomFileError([f"schema_version {version!r}: this kvlab ({__version__}) reads room files of schema "
                             f"version {SCHEMA_VERSION}; install the same kvlab as the room "
                             "(pip install -U kvlab) and share again"])
    for key, kind in (("kvlab_version", str), ("submission_id", str), ("created", str), ("learner", str),
                      ("notebook", str), ("machine", dict), ("predictions", list), ("verdicts", list),
                      ("figures", dict), ("requests", list), ("load", dict)):
        if not isinstance(data.get(key), kind):
            p.append(f"{key} is missing or not a {kind.__name__}")
    if p:
        raise RoomFileError(p)
    if not re.fullmatch(r"[0-9a-f]{32}", data["submission_id"]):
        p.append("submission_id is not 32 hex digits; save the file again (it draws a new one)")
    try:
        check_name(data["learner"])
    except ValueError as e:
        p.append(f"learner: {e}")
    if not NOTEBOOK_NAME.match(data["notebook"]):
        p.append(f"notebook {data['notebook'][:80]!r} is not a notebook's file name (e.g. 01_the_slowdown.ipynb)")
    extra = sorted(set(data["machine"]) - set(MACHINE_KEYS))
    if extra:
        p.append(f"machine holds {extra}, which a room file never keeps (nothing personal); save it again with share()")
    p += _check_rows("predictions", data["predictions"], {"question": str, "guess": "number", "measured": "number"})
    p += _check_rows("verdicts", data["verdicts"], {"claim": str, "holds": "bool"})
    p += [f"figures[{k!r}] is not a number" for k, v in data["figures"].items() if not _is_number(v)]
    if len(data["requests"]) > MAX_REQUESTS:
        p.append(f"it holds {len(data['requests'])} request records; at most {MAX_REQUESTS} are kept")
    p += _check_rows("requests", data["requests"], {"scheduled_s": "number", "first_token_s": "number",
                                                    "finished_s": "number", "output_tokens": "number",
                                                    "status": REQUEST_STATUSES})
    if data["requests"] and not _is_number(data["load"].get("started_at")):
        p.append("load.started_at (unix seconds when the client started) is missing; add_requests() writes it")
    if p:
        raise RoomFileError(p)
    fields = {k: data[k] for k in ("learner", "notebook", "machine", "predictions", "verdicts", "figures",
                                   "requests", "load", "submission_id", "created", "kvlab_version")}
    return LearnerRun(**fields)


def _shape_problems(data: Any) -> list[str]:
    """Texts longer than MAX_TEXT and nesting deeper than MAX_DEPTH, anywhere in a file (keys included); no
    recursion, so no file can exhaust the stack. A file share() wrote has neither."""
    problems: list[str] = []
    stack: list[tuple[Any, str, int]] = [(data, "the file", 1)]
    while stack and len(problems) < 5:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_TEXT:
                problems.append(f"{where} holds a text of {len(value):,} characters; at most {MAX_TEXT} are kept")
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            problems.append(f"{where} is nested more than {MAX_DEPTH} levels deep; a room file never is")
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            name = f"{where}[{str(k)[:40]!r}]" if isinstance(value, dict) else f"{where}[{k}]"
            if isinstance(k, str) and len(k) > MAX_TEXT:
                problems.append(f"{where} has a key of {len(k):,} characters; at most {MAX_TEXT} are kept")
            stack.append((v, name, depth + 1))
    return problems


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _check_rows(name: str, rows: list, wanted: dict) -> list[str]:
    """Problems of a list of objects: each must be an object whose `wanted` fields have the right kind."""
    problems = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(f"{name}[{i}] is not an object")
            continue
        for key, kind in wanted.items():
            v = row.get(key)
            ok = (_is_number(v) if kind == "number" else (v is None or isinstance(v, bool)) if kind == "bool"
                  else v in kind if isinstance(kind, tuple) else isinstance(v, kind))
            if not ok:
                wants = (f"one of {kind}" if isinstance(kind, tuple) else "true, false or null" if kind == "bool"
                         else "a number or null" if kind == "number" else "text")
                problems.append(f"{name}[{i}].{key} is {str(v)[:40]!r}, not {wants}")
        if len(problems) >= 10:
            return problems + ["(more problems left out)"]
    return problems
