"""The room view as tables: everyone's answers by device and threads, the room's guesses, hold rates, misfits, one service curve.

    room = load_room("room.sqlite")      # or a room file (.json), a folder of learners' files, or the collector's URL
    room.summary()                       # 30 learners, 151 submissions, ...
    room.by_device("01_the_slowdown.ipynb")
    room.guesses()                       # per question: the room's guesses against the measurements
    room.hold_rates()                    # per claim: how many machines it held on, and which it did not
    room.outliers()                      # machines that disagree with the rest, named with their settings
    room.placements()                    # notebook 09: where each run's requests go, and which are left out, why
    room.service_curve()                 # notebook 09: everyone's requests pooled on one time axis
    room.knee_rps()                      # the knee, or why there is none (kept up / behind from the start)

Only each learner's *current* run of a notebook counts (a newer run supersedes an older one; the
collector keeps both). The figures are ``kvlab.room.figures``.

**Outliers** are judged on log values (the quantities are ratios and rates) with a robust z-score,
``0.6745 (x - median) / MAD`` — the median and the median absolute deviation resist the very misfits being looked for —
within the learner's device class when it holds at least ``min_group`` machines, else against the whole room (two GPUs
are compared with the room, not with each other). A quantity every machine measures alike (02's bytes) has a MAD of 0:
a floor of 0.01 (1 %) stands in, so any machine off by more than a few percent is named.

**Placing the requests** (``placements()``): each file says when its client's clock started (wall time),
moved by the learner's clock error where the collector measured it at sending; a run whose times cannot
be right against when it was received (``kvlab.room.store.clock_check``: it ends after it was received,
or it came long after with its clock never checked) is left out of the curve and named, and a run
shared twice under two names (the same requests) is pooled once, under the first, and named.

**The service curve** pools every placed 09 record by wall time: windows of ``window_s`` seconds give the offered rate
(arrivals / s), the achieved rate (completions / s) and the clocks of the requests that arrived in them; windows are
grouped into buckets of offered rate, and the knee is ``kvlab.serving.knee.find_knee``'s walk: the highest bucket
before the first that does not keep up. A bucket keeps up when at least ``min_served`` (``KEEPS_UP_RATIO``, 0.9) of its
requests completed (not refused with 429, not failed) and their TTFT p95 is within ``slo_ttft_s`` (1 s by default: say
the room's own), as notebook 09 judges a rate. Achieved / offered is shown, not judged: within one window it lags the
arrivals by a request's own latency. Beside the clocks each bucket gives the share of its requests refused (HTTP 429:
the server's queue was full) and the share that failed otherwise (a time-out, an engine error); ``knee_rps()`` says
which of three cases the curve is.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from kvlab.clocks import RequestRecord, quantiles

from kvlab.room.record import LearnerRun, RoomFileError, validate
from kvlab.room.store import ROOM_FILE_SCHEMA, ClockCheck, Store, clock_check, room_file
from kvlab.serving.knee import KEEPS_UP_RATIO, find_knee, keeps_up

MAD_FLOOR = 0.01
CLOCKS = ("ttft", "tpot", "e2e")
REFUSED = "http_429"  # the start of a request's fail_reason when the server refused it (queue full)


@dataclass(frozen=True)
class Knee:
    """The room's knee and which case the curve is: ``"knee"`` (``rps``: the busiest offered rate before the first
    bucket that did not keep up), ``"kept_up"`` (every bucket kept up: the knee lies beyond the busiest rate),
    ``"behind_from_the_start"`` (the lowest bucket already did not: the knee lies below it) or ``"no_requests"``.
    ``rps`` is None but for a knee; ``message`` (also ``str(knee)``) says it in words."""

    rps: float | None
    case: str
    message: str

    def __str__(self) -> str:
        return self.message


def load_room(source: Any, key: str | None = None) -> "Room":
    """A Room from a room file (path or dict), a collector database (.sqlite), a folder of learners' files,
    or a collector's URL (``http://host:8100``, with the room ``key`` or ``$KVLAB_ROOM_KEY``)."""
    if isinstance(source, dict):
        return Room.from_room_file(source)
    text = str(source)
    if text.startswith(("http://", "https://")):
        import os

        import httpx

        from kvlab.http.client import auth_headers

        from kvlab.room.record import ROOM_KEY_ENV

        r = httpx.get(text.rstrip("/") + "/room/export", timeout=30,
                      headers=auth_headers(key or os.environ.get(ROOM_KEY_ENV)))
        r.raise_for_status()
        return Room.from_room_file(r.json())
    path = Path(source)
    if path.is_dir():
        return Room.from_folder(path)
    if path.suffix in (".sqlite", ".db", ".sqlite3"):
        store = Store(path)
        try:
            return Room.from_room_file(store.room_file())
        finally:
            store.close()
    return Room.from_room_file(json.loads(path.read_text(encoding="utf-8")))


class Room:
    """Every submission of a room; the tables read the current ones (see the module docstring)."""

    def __init__(self, entries: list[dict]) -> None:
        self.entries = entries  # {"run": LearnerRun, "note", "current", "source", "received_at", "clock_offset_s"}
        current = [e for e in entries if e["current"]]
        self.runs: list[LearnerRun] = [e["run"] for e in current]
        self.notes = {(e["run"].learner, e["run"].notebook): e["note"] for e in current}
        # where each run's requests go on the room's axis (runs without requests have none)
        self.clocks: dict[int, ClockCheck] = {id(e["run"]): clock_check(e["run"], e.get("received_at"),
                                                                       e.get("clock_offset_s"))
                                              for e in current if e["run"].requests}
        self.pooled_as: dict[int, LearnerRun] = {}  # a run whose requests another current run already holds -> that
        first: dict[tuple, LearnerRun] = {}
        for run in self.runs:
            if run.requests:
                same = first.setdefault(_fingerprint(run), run)
                if same is not run:
                    self.pooled_as[id(run)] = same

    @classmethod
    def from_room_file(cls, data: dict) -> "Room":
        if data.get("schema") != ROOM_FILE_SCHEMA:
            raise RoomFileError([f"schema is {data.get('schema')!r}, not {ROOM_FILE_SCHEMA!r}: export a room file "
                                 "with python -m kvlab room --export PATH"], "this room")
        return cls([{**s, "run": validate(s["run"])} for s in data["submissions"]])

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Room":
        """Learners' files in a folder, through the collector's rules (an in-memory database)."""
        import tempfile  # a throwaway database: the same checks, duplicates and superseding as the collector

        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "room.sqlite")
            store.import_folder(folder)
            data = room_file(store.rows())
            store.close()
        return cls.from_room_file(data)

    # -- who is in the room ------------------------------------------------------------------------
    def learners(self) -> pd.DataFrame:
        """One row per learner: machine, threads, where it runs, kvlab version, notebooks shared."""
        rows: dict[str, dict[str, Any]] = {}
        for run in self.runs:
            row = rows.setdefault(run.learner, {**self._who(run), "learner": run.learner, "kvlab": run.kvlab_version,
                                                "notebooks": 0})
            row["notebooks"] += 1
        columns = ["learner", "device", "device_class", "threads", "runtime", "kvlab", "notebooks"]
        return pd.DataFrame(list(rows.values()), columns=columns).sort_values("learner", ignore_index=True)

    def summary(self) -> str:
        learners = self.learners()
        classes = learners["device_class"].value_counts().to_dict() if len(learners) else {}
        superseded = sum(1 for e in self.entries if not e["current"])
        other = sorted({r.kvlab_version for r in self.runs if self.notes.get((r.learner, r.notebook))})
        placements = self.placements()
        out = placements[~placements["pooled"]] if len(placements) else placements
        return (f"{len(learners)} learners, {len(self.entries)} submissions ({superseded} superseded by a newer run), "
                f"{len({r.notebook for r in self.runs})} notebooks; devices: "
                + ", ".join(f"{n} {c}" for c, n in classes.items())
                + (f"; from another kvlab version (marked *): {', '.join(other)}" if other else "")
                + (f"; left out of the room's curve: {', '.join(out['learner'])} (room.placements() says why)"
                   if len(out) else ""))

    def placements(self) -> pd.DataFrame:
        """One row per run with requests: who, how many, its start on the room's clock, the shift applied for its
        clock, whether it is ``pooled`` into the room's curve, and the ``note`` saying why it was moved or left out."""
        rows = []
        for run in self.runs:
            if not run.requests:
                continue
            check, same = self.clocks[id(run)], self.pooled_as.get(id(run))
            notes = [check.note] if check.note else []
            if same is not None:
                notes.append(f"the same requests as {self._who(same)['learner']}'s run (shared twice under two "
                             "names?): pooled once, under the first")
            rows.append({"learner": self._who(run)["learner"], "notebook": run.notebook, "requests": len(run.requests),
                         "started_at": float(run.load["started_at"]) + check.shift_s, "shift_s": check.shift_s,
                         "pooled": check.placed and same is None, "note": "; ".join(notes) or None})
        return pd.DataFrame(rows, columns=["learner", "notebook", "requests", "started_at", "shift_s", "pooled",
                                           "note"])

    def _who(self, run: LearnerRun) -> dict:
        m = run.machine
        mark = "*" if self.notes.get((run.learner, run.notebook)) else ""
        return {"learner": run.learner + mark, "device": m.get("device"), "device_class": m.get("device_class"),
                "threads": m.get("torch_threads"), "runtime": m.get("runtime")}

    # -- predictions -------------------------------------------------------------------------------
    def measured(self, notebook: str | None = None) -> pd.DataFrame:
        """One row per learner and question: their machine, guess, measured answer, guess / measured."""
        rows = [{"notebook": run.notebook, **self._who(run), "question": p["question"],
                 "text": p.get("text", p["question"]), "unit": p["unit"], "guess": p["guess"], "measured": p["measured"]}
                for run in self.runs if notebook in (None, run.notebook) for p in run.predictions]
        frame = pd.DataFrame(rows, columns=["notebook", "learner", "device", "device_class", "threads", "runtime",
                                            "question", "text", "unit", "guess", "measured"])
        frame[["guess", "measured"]] = frame[["guess", "measured"]].astype(float)
        frame["guess_over_measured"] = frame["guess"] / frame["measured"]
        return frame.sort_values(["notebook", "question", "learner"], ignore_index=True)

    def by_device(self, notebook: str) -> pd.DataFrame:
        """The measured answers of ``notebook`` by device and threads: n, median, min, max, who."""
        frame = self.measured(notebook)
        out = (frame.groupby(["question", "device_class", "device", "threads"], dropna=False)
               .agg(n=("measured", "count"), median=("measured", "median"), min=("measured", "min"),
                    max=("measured", "max"), learners=("learner", lambda s: ", ".join(sorted(s)))))
        return out.reset_index().sort_values(["question", "median"], ignore_index=True)

    def guesses(self, notebook: str | None = None) -> pd.DataFrame:
        """Per question, the room's guesses against its measurements: medians, the room's error, who came close."""
        frame = self.measured(notebook).dropna(subset=["measured"])
        rows = []
        for (nb, question), g in frame.groupby(["notebook", "question"], sort=True):
            guessed = g.dropna(subset=["guess"])
            ratio = guessed["guess_over_measured"]
            ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
            rows.append({"notebook": nb, "question": question, "unit": g["unit"].iloc[0], "n_measured": len(g),
                         "measured_median": g["measured"].median(), "n_guessed": len(guessed),
                         "guess_median": guessed["guess"].median() if len(guessed) else math.nan,
                         "room_error_x": float(np.exp(np.median(np.log(ratio)))) if len(ratio) else math.nan,
                         "within_2x": float(((ratio >= 0.5) & (ratio <= 2)).mean()) if len(ratio) else math.nan})
        return pd.DataFrame(rows, columns=["notebook", "question", "unit", "n_measured", "measured_median", "n_guessed",
                                           "guess_median", "room_error_x", "within_2x"])

    # -- claims --------------------------------------------------------------------------------------
    def hold_rates(self, notebook: str | None = None) -> pd.DataFrame:
        """Per claim: machines it was checked on, held on, the hold rate, and where it did not hold."""
        rows: dict[tuple[str, str], dict] = {}
        for run in self.runs:
            if notebook not in (None, run.notebook):
                continue
            for v in run.verdicts:
                row = rows.setdefault((run.notebook, v["claim"]), {"notebook": run.notebook, "claim": v["claim"],
                                                                   "checked": 0, "held": 0, "failed_on": []})
                if v["holds"] is None:
                    continue
                row["checked"] += 1
                row["held"] += bool(v["holds"])
                if not v["holds"]:
                    who = self._who(run)
                    row["failed_on"].append(f"{who['learner']} ({who['device']}, {who['threads']} threads)")
        frame = pd.DataFrame(list(rows.values()), columns=["notebook", "claim", "checked", "held", "failed_on"])
        frame["hold_rate"] = frame["held"] / frame["checked"].where(frame["checked"] > 0)
        frame["failed_on"] = frame["failed_on"].map("; ".join)
        return frame[["notebook", "claim", "checked", "held", "hold_rate", "failed_on"]].sort_values(
            ["notebook", "hold_rate", "claim"], ignore_index=True)

    # -- headline figures and misfits ----------------------------------------------------------------
    def figures(self, notebook: str) -> pd.DataFrame:
        """One row per learner of ``notebook``: machine and each headline figure."""
        rows = [{**self._who(run), **run.figures} for run in self.runs if run.notebook == notebook]
        return pd.DataFrame(rows).sort_values("learner", ignore_index=True) if rows else pd.DataFrame()

    def quantities(self) -> pd.DataFrame:
        """Every number a machine measured, long: notebook, quantity, learner and machine, value."""
        rows: list[dict] = []
        for run in self.runs:
            figures = set(run.figures.values())  # a figure that is also the answer: once
            answers = [(p["question"], p["measured"]) for p in run.predictions if p["measured"] not in figures]
            rows += [{"notebook": run.notebook, "quantity": name, **self._who(run), "value": float(value)}
                     for name, value in [*run.figures.items(), *answers] if value is not None]
        return pd.DataFrame(rows)

    def outliers(self, threshold: float = 3.5, min_group: int = 4) -> pd.DataFrame:
        """Machines whose number disagrees with the rest (see the module docstring), worst first."""
        frame, rows = self.quantities(), []
        if frame.empty:
            return pd.DataFrame(columns=["notebook", "quantity", "learner", "value", "median", "compared_with", "z"])
        for (nb, quantity), g in frame.groupby(["notebook", "quantity"]):
            sizes = g["device_class"].value_counts()
            for _, row in g.iterrows():
                same = g[g["device_class"] == row["device_class"]]
                peers, compared = (same, f"{row['device_class']} machines") if sizes[row["device_class"]] >= min_group \
                    else (g, "the room")
                x = peers["value"].to_numpy()
                log = bool((x > 0).all() and row["value"] > 0)
                xs, v = (np.log(x), math.log(row["value"])) if log else (x, row["value"])
                med = float(np.median(xs))
                mad = max(float(np.median(np.abs(xs - med))), MAD_FLOOR if log else MAD_FLOOR * max(abs(med), 1e-12))
                z = 0.6745 * (v - med) / mad
                if abs(z) > threshold:
                    rows.append({"notebook": nb, "quantity": quantity, "learner": row["learner"],
                                 "device": row["device"], "threads": row["threads"], "runtime": row["runtime"],
                                 "value": row["value"], "median": float(np.median(x)), "compared_with": compared,
                                 "z": round(z, 1)})
        out = pd.DataFrame(rows, columns=["notebook", "quantity", "learner", "device", "threads", "runtime", "value",
                                          "median", "compared_with", "z"])
        return out.reindex(out["z"].abs().sort_values(ascending=False).index).reset_index(drop=True)

    # -- one server, the whole room --------------------------------------------------------------------
    def requests(self, every_run: bool = False) -> pd.DataFrame:
        """Every pooled 09 request of the room on one time axis: ``t_s`` (arrival since the room's first), status and
        ``fail_reason`` (``http_429:...`` refused, ``timeout``, ...), clocks. ``every_run``: the runs
        ``placements()`` leaves out too (their times as they came, shifted where the clock was measured)."""
        rows = []
        for run in self.runs:
            if not run.requests:
                continue
            check = self.clocks[id(run)]
            if not every_run and not (check.placed and id(run) not in self.pooled_as):
                continue
            start = float(run.load["started_at"]) + check.shift_s
            who = self._who(run)
            for r in run.requests:
                record = RequestRecord(r["request_id"], int(r.get("prompt_tokens") or 0),
                                       int(r.get("max_new_tokens") or 0), r["scheduled_s"], r.get("sent_s"),
                                       r.get("admitted_s"), r["first_token_s"], [], r["finished_s"], r["status"],
                                       r.get("fail_reason"), r.get("output_tokens"))
                clocks = record.clocks()
                rows.append({"learner": who["learner"], "device": who["device"], "arrival": start + r["scheduled_s"],
                             "finish": None if r["finished_s"] is None else start + r["finished_s"],
                             "status": r["status"], "fail_reason": r.get("fail_reason"),
                             "output_tokens": r.get("output_tokens") or 0, **{c: clocks[f"{c}_s"] for c in CLOCKS}})
        frame = pd.DataFrame(rows, columns=["learner", "device", "arrival", "finish", "status", "fail_reason",
                                            "output_tokens", *CLOCKS])
        if len(frame):
            t0 = frame["arrival"].min()
            frame.insert(2, "t_s", frame["arrival"] - t0)
            frame["finish_t_s"] = frame["finish"] - t0
        return frame.drop(columns=["arrival", "finish"])

    def timeline(self, window_s: float = 5.0) -> pd.DataFrame:
        """Per window of ``window_s`` seconds: learners sending, offered and achieved rates, tokens/s, clocks."""
        frame = self.requests()
        if frame.empty:
            return pd.DataFrame()
        frame["window"] = (frame["t_s"] // window_s).astype(int)
        done = frame[frame["status"] == "completed"]
        finished = (done["finish_t_s"] // window_s).astype(int)
        rows = []
        for w in range(int(frame["window"].max()) + 1):
            arrived = frame[frame["window"] == w]
            ended = done[finished == w]
            ok = arrived[arrived["status"] == "completed"]
            refused = _refused(arrived)
            rows.append({"window": w, "t_s": w * window_s, "learners": arrived["learner"].nunique(),
                         "arrived": len(arrived), "offered_rps": len(arrived) / window_s,
                         "achieved_rps": len(ended) / window_s,
                         "output_tokens_per_s": ended["output_tokens"].sum() / window_s,
                         "failed": int((arrived["status"] == "failed").sum()), "refused": int(refused.sum()),
                         **_clock_quantiles(ok)})
        return pd.DataFrame(rows)

    def service_curve(self, window_s: float = 5.0, bins: int | Sequence[float] = 5, slo_ttft_s: float = 1.0,
                      min_served: float = KEEPS_UP_RATIO, until: str = "peak") -> pd.DataFrame:
        """The room's service curve: windows bucketed by offered rate; quantiles with n; ``is_knee`` marked.

        ``until="peak"``: the windows up to the busiest (the class piling on); later ones, where the room
        winds down and the queue drains, are left out (``until="all"`` keeps them).
        """
        if until not in ("peak", "all"):
            raise ValueError(f"until={until!r}: 'peak' (the room piling on) or 'all' (every window)")
        frame, windows = self.requests(), self.timeline(window_s)
        if frame.empty:
            return pd.DataFrame()
        frame["window"] = (frame["t_s"] // window_s).astype(int)
        if until == "peak":
            windows = windows.iloc[:int(windows["offered_rps"].to_numpy().argmax()) + 1]
        busy = windows[windows["arrived"] > 0]
        edges = np.asarray(bins, dtype=float) if not isinstance(bins, int) else \
            np.linspace(0, busy["offered_rps"].max(), bins + 1)
        bucket = np.clip(np.searchsorted(edges, busy["offered_rps"], side="left") - 1, 0, len(edges) - 2)
        rows = []
        for b in sorted(set(bucket)):
            ws = busy[bucket == b]
            arrived = frame[frame["window"].isin(ws["window"])]
            ok = arrived[arrived["status"] == "completed"]
            row = {"rate_from": edges[b], "rate_to": edges[b + 1], "windows": len(ws), "requests": len(arrived),
                   "learners": round(ws["learners"].mean(), 1), "offered_rps": ws["offered_rps"].mean(),
                   "achieved_rps": ws["achieved_rps"].mean(), "output_tokens_per_s": ws["output_tokens_per_s"].mean(),
                   "served": float((arrived["status"] == "completed").mean()),
                   "refused": float(_refused(arrived).mean()),
                   "failed_otherwise": float(((arrived["status"] != "completed") & ~_refused(arrived)).mean())}
            rows.append({**row, "throughput_ratio": row["achieved_rps"] / row["offered_rps"], **_clock_quantiles(ok)})
        curve = pd.DataFrame(rows)
        curve["keeps_up"] = [keeps_up(s, t, slo_ttft_s, min_served) for s, t in zip(curve["served"], curve["ttft_p95_s"])]
        knee = find_knee(curve["offered_rps"].tolist(), curve["keeps_up"].tolist())
        curve["is_knee"] = [i == knee.index for i in range(len(curve))]
        curve.attrs["knee"] = knee
        return curve

    def knee_rps(self, **kwargs) -> Knee:
        """The room's knee on ``service_curve(**kwargs)`` and which case it is: ``.rps`` (None unless a knee was
        found), ``.case``, and in words ``str(...)`` (see ``Knee``)."""
        curve = self.service_curve(**kwargs)
        if curve.empty:
            return Knee(None, "no_requests", "no knee: the room holds no pooled 09 requests")
        slo, knee = kwargs.get("slo_ttft_s", 1.0), curve.attrs["knee"]
        if knee.case == "knee":
            rps = float(knee.rps)
            above = curve[~curve["keeps_up"]].iloc[0]
            return Knee(rps, "knee", f"{rps:.3g} requests/s offered by the room: the busiest rate that kept up; at "
                                     f"{above['offered_rps']:.3g}/s {_behind(above, slo)}")
        if knee.case == "kept_up":
            top = float(knee.highest_rps)
            return Knee(None, "kept_up", f"no knee: every rate the room offered kept up, up to {top:.3g} requests/s "
                                         f"({curve['refused'].max():.0%} refused at most); the knee lies beyond it")
        low = curve.iloc[0]
        return Knee(None, "behind_from_the_start",
                    f"no knee: at the lowest rate the room offered ({low['offered_rps']:.3g} requests/s) the server "
                    f"already {_behind(low, slo)}; the knee lies below it")


def _clock_quantiles(completed: pd.DataFrame) -> dict:
    """Each clock's n, p50 and p95 over ``completed`` requests, as columns of a window or a bucket."""
    return {f"{c}_{k}": q[stat] for c in CLOCKS for q in [quantiles(completed[c], (0.5, 0.95))]
            for k, stat in (("n", "n"), ("p50_s", "p50"), ("p95_s", "p95"))}


def _refused(requests: pd.DataFrame) -> pd.Series:
    """Which of ``requests`` the server refused (HTTP 429: its queue was full)."""
    return requests["fail_reason"].fillna("").astype(str).str.startswith(REFUSED)


def _behind(bucket: pd.Series, slo_ttft_s: float) -> str:
    """Why a bucket of the service curve did not keep up, in words."""
    return (f"{bucket['served']:.0%} were served ({bucket['refused']:.0%} refused, {bucket['failed_otherwise']:.0%} "
            f"failed otherwise), TTFT p95 {bucket['ttft_p95_s']:.3g} s against {slo_ttft_s:g} s")


def _fingerprint(run: LearnerRun) -> tuple:
    """What makes two runs' requests the same run: every request's own times and outcome."""
    return tuple((r.get("scheduled_s"), r.get("first_token_s"), r.get("finished_s"), r.get("status"))
                 for r in run.requests)
