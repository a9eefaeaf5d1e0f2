"""The room's submissions in SQLite: one row per submission, duplicates merged, newer runs superseding, history kept.

Why SQLite: a workshop's collector may be stopped or killed halfway (a laptop lid, a Ctrl-C); every submission it
answered "accepted" was committed before the answer went out, in WAL mode with full sync, so a restart on the same file
finds them all. Readers (the room view) may open the database while the collector writes.

Rules, in ``Store.add``:

- one row per ``submission_id``; the same id with the same content again is a **duplicate**, merged
  (acknowledged, nothing doubled); the same id with other content is a **conflict** (refused);
- a learner's newer run of the same notebook **supersedes** the older one in the view, which stays in
  the table (history); newer means a later ``created`` stamp, then a later arrival;
- a file from another kvlab major.minor version is accepted with a **note** (its numbers come from other
  code: the view marks it); one of another schema version is refused by ``record.validate``;
- a run's request times are checked against when it was received (``clock_check``): the learner's clock
  error measured at sending is kept with it (``clock_offset_s``), and times that cannot be right are
  accepted with a **clock note**, and left out of the room's curve by the view.
"""
from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kvlab.results_io import to_json
from kvlab.version import __version__

from kvlab.room.record import LearnerRun, RoomFileError, validate

ROOM_FILE_SCHEMA = "kvlab-room"
MAX_FILE_BYTES = 1 << 20  # a dropped file is held to the collector's body limit too
SKEW_TOLERANCE_S = 2.0  # a learner's clock this close to the collector's is taken as right (a send takes ms)
LATE_S = 30 * 60.0  # a run received longer than this after it ended is "shared late": its clock is checked or named

_TABLE = """CREATE TABLE IF NOT EXISTS submissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    submission_id TEXT NOT NULL UNIQUE,
    learner TEXT NOT NULL,
    notebook TEXT NOT NULL,
    created TEXT NOT NULL,
    kvlab_version TEXT NOT NULL,
    received_at REAL NOT NULL,
    source TEXT NOT NULL,
    note TEXT,
    digest TEXT NOT NULL,
    body TEXT NOT NULL,
    clock_offset_s REAL)"""
# clock_offset_s: the collector's clock minus the learner's, measured when the file was sent (NULL: not measured,
# a file from the inbox or an older kvlab). Added after the first release: an older database gains the column.


@dataclass(frozen=True)
class Outcome:
    """What became of one submission: "accepted", "duplicate" (merged), "superseding" (accepted, replaces an
    older run of the same learner and notebook) or "refused"; ``message`` says it in words. ``note``: another
    kvlab version's; ``clock_note``: what ``clock_check`` found in its times (None: nothing to say)."""

    status: str
    message: str
    submission_id: str | None = None
    note: str | None = None
    clock_note: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "refused"


@dataclass(frozen=True)
class ClockCheck:
    """Where a run's requests go on the room's time axis: moved by ``shift_s`` (the learner's clock error, when it
    was measured), ``placed`` False when its times cannot be right (left out of the room's curve), and ``note``."""

    shift_s: float = 0.0
    placed: bool = True
    note: str | None = None


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def clock_check(run: LearnerRun, received_at: float | None, clock_offset_s: float | None = None) -> ClockCheck:
    """Check a run's request times (the learner's clock) against when the collector received it (its own clock).

    - ``clock_offset_s`` (the collector's clock minus the learner's, measured as the file was sent) beyond
      SKEW_TOLERANCE_S: the learner's clock is off by that much, and the run is moved by it.
    - requests that end after the collector received them: the learner's clock runs ahead, unmeasured; the
      times cannot be right and the run is left out (``placed`` False).
    - received more than LATE_S after the run ended: with the clock measured at sending, placed and noted; with
      no measurement (a file handed in), a clock off by an hour would look just like this: left out, named.
    A run without requests has nothing to place.
    """
    if not run.requests:
        return ClockCheck()
    notes, placed = [], True
    measured = clock_offset_s is not None and math.isfinite(clock_offset_s)
    shift = (float(clock_offset_s) if measured and clock_offset_s is not None and abs(clock_offset_s) > SKEW_TOLERANCE_S
             else 0.0)
    if shift:
        notes.append(f"the learner's clock was {_span(shift)} {'behind' if shift > 0 else 'ahead of'} the "
                     "collector's when it was shared: its requests are moved by that much")
    last = max(max(r.get("scheduled_s") or 0.0, r.get("finished_s") or 0.0) for r in run.requests)
    end = float(run.load.get("started_at", 0.0)) + shift + last
    if received_at is not None and end > received_at + SKEW_TOLERANCE_S:
        placed = False
        notes.append(f"its requests end {_span(end - received_at)} after the collector received it, which cannot be "
                     "(the learner's clock runs ahead); left out of the room's curve")
    elif received_at is not None and received_at - end > LATE_S:
        if measured:
            notes.append(f"shared {_span(received_at - end)} after its run ended; placed by the learner's clock, "
                         "checked when it was shared")
        else:
            placed = False
            notes.append(f"received {_span(received_at - end)} after its run ended, and the learner's clock was never "
                         "checked (a file handed in): a clock that far off would look the same; left out of the "
                         "room's curve")
    if run.load.get("started_at_from") == "share":
        notes.append("its client recorded no start time: the start was estimated when it was shared, so sharing "
                     "late places it late")
    return ClockCheck(shift, placed, "; ".join(notes) or None)


def version_note(version: str) -> str | None:
    """A note when ``version`` differs from this kvlab's in major or minor (None for the same or a patch)."""
    if version.split(".")[:2] == __version__.split(".")[:2]:
        return None
    return (f"measured with kvlab {version}, the collector runs {__version__}: accepted, and marked in the view "
            "(other code may measure differently)")


class Store:
    """The submissions database at ``path`` (created if missing); safe to share between threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_TABLE)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(submissions)")}
        if "clock_offset_s" not in columns:  # a database from before the column
            self._db.execute("ALTER TABLE submissions ADD COLUMN clock_offset_s REAL")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, run: LearnerRun, source: str = "http", clock_offset_s: float | None = None,
            received_at: float | None = None) -> Outcome:
        """Store ``run`` (already validated) under the rules of the module docstring; committed on return.
        ``clock_offset_s``: the collector's clock minus the learner's as it was sent (``clock_check``);
        ``received_at``: when it arrived, unix seconds (default now)."""
        body = run.to_json()
        digest = hashlib.sha256(body.encode()).hexdigest()
        note = version_note(run.kvlab_version)
        received_at = time.time() if received_at is None else received_at
        if clock_offset_s is not None and not math.isfinite(clock_offset_s):
            clock_offset_s = None
        clock_note = clock_check(run, received_at, clock_offset_s).note
        with self._lock:
            row = self._db.execute("SELECT digest, received_at FROM submissions WHERE submission_id = ?",
                                   (run.submission_id,)).fetchone()
            if row is not None:
                if row[0] == digest:
                    when = time.strftime("%H:%M:%S", time.localtime(row[1]))
                    return Outcome("duplicate", f"{run.learner}'s {run.notebook} was already received at {when}; "
                                   "nothing changed", run.submission_id, note)  # its clock was checked then
                return Outcome("refused", f"submission {run.submission_id} was already received with other "
                               "content; share again (a new submission gets a new id)", run.submission_id)
            older = self._db.execute("SELECT COUNT(*) FROM submissions WHERE learner = ? AND notebook = ?",
                                     (run.learner, run.notebook)).fetchone()[0]
            self._db.execute("INSERT INTO submissions (submission_id, learner, notebook, created, kvlab_version, "
                             "received_at, source, note, digest, body, clock_offset_s) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (run.submission_id, run.learner, run.notebook, run.created, run.kvlab_version,
                              received_at, source, note, digest, body, clock_offset_s))
        if older:
            return Outcome("superseding", f"received {run.learner}'s {run.notebook}; it replaces the earlier "
                           f"run{'s' if older > 1 else ''} in the view (kept in history). Not you? Share again with "
                           "your initial added to the name", run.submission_id, note, clock_note)
        return Outcome("accepted", f"received {run.learner}'s {run.notebook}, thank you", run.submission_id, note,
                       clock_note)

    def add_json(self, raw: bytes | str | dict, source: str = "http") -> Outcome:
        """Validate then add; a file that cannot be read is "refused" with every problem in the message."""
        try:
            run = validate(raw)
        except RoomFileError as e:
            return Outcome("refused", str(e))
        return self.add(run, source)

    def import_folder(self, folder: str | Path) -> list[tuple[str, Outcome]]:
        """Every ``*.json`` learner file in ``folder`` (dropped by the teacher), through the same checks; a
        re-import merges as duplicates. Returns (file name, outcome) per file."""
        return [(path.name, Outcome("refused", f"{path.name} is larger than {MAX_FILE_BYTES:,} bytes")
                 if path.stat().st_size > MAX_FILE_BYTES else self.add_json(path.read_bytes(), f"folder:{path.name}"))
                for path in sorted(Path(folder).glob("*.json"))]

    def rows(self) -> list[dict]:
        """Every submission, oldest first, with ``current`` False where a newer run of the same learner and
        notebook supersedes it."""
        with self._lock:
            cursor = self._db.execute("SELECT seq, submission_id, learner, notebook, created, kvlab_version, "
                                      "received_at, source, note, clock_offset_s, body FROM submissions ORDER BY seq")
            names = [d[0] for d in cursor.description]
            rows = [dict(zip(names, r)) for r in cursor.fetchall()]
        latest = {(r["learner"], r["notebook"]): r for r in sorted(rows, key=lambda r: (r["created"], r["seq"]))}
        current = {id(r) for r in latest.values()}
        for r in rows:
            r["current"] = id(r) in current
        return rows

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0]

    def room_file(self) -> dict:
        """The room file: every accepted submission (superseded ones flagged), as one JSON-ready dict."""
        return room_file(self.rows())

    def room_frame(self):
        """One row per submission (no body): who, which notebook, when, from where, its note, whether current.
        The room's numbers are ``kvlab.room.view.load_room(path)``'s tables."""
        import pandas as pd

        rows = [{k: v for k, v in r.items() if k != "body"} for r in self.rows()]
        return pd.DataFrame(rows, columns=["seq", "submission_id", "learner", "notebook", "created", "kvlab_version",
                                           "received_at", "source", "note", "clock_offset_s", "current"])


def room_file(rows: list[dict]) -> dict:
    """``{"schema", "schema_version", "kvlab_version", "exported_at", "submissions": [...]}``; each submission
    is ``{"run": <the learner's file>, "received_at", "source", "note", "clock_offset_s", "current"}``."""
    return {"schema": ROOM_FILE_SCHEMA, "schema_version": 1, "kvlab_version": __version__,
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "submissions": [{"run": json.loads(r["body"]), "received_at": r["received_at"], "source": r["source"],
                             "note": r["note"], "clock_offset_s": r.get("clock_offset_s"), "current": r["current"]}
                            for r in rows]}


def write_room_file(path: str | Path, store_or_file: "Store | dict") -> Path:
    """Save a room file (from a Store or an already built dict) to ``path``."""
    data = store_or_file.room_file() if isinstance(store_or_file, Store) else store_or_file
    head = to_json({k: v for k, v in data.items() if k != "submissions"}, indent=None)[:-1]
    lines = ",\n".join(to_json(s, indent=None) for s in data["submissions"])  # one submission a line: diffs read
    path = Path(path)
    path.write_text(f'{head}, "submissions": [\n{lines}\n]}}\n', encoding="utf-8")
    return path
