"""The room's one curve places every request where it happened: learners who share hours late, out of order and
with clocks off by up to two hours, through the collector, checked against the server's own records.

The server is `kvlab.room.simulate.shared_server_requests` (one FIFO server for the room, 429 when its queue is
full): its records are the truth, each request's arrival on the server's clock. Each learner's file carries the
same requests on the learner's own clock (started_at off by the learner's clock error), and is sent hours after
the run, in shuffled order, with that clock's reading in the X-Kvlab-Sent-At header. The collector runs on a
fixed clock, so every number below is exact.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from kvlab.room import LearnerRun
from kvlab.room.collector import create_app
from kvlab.room.record import SENT_AT_HEADER
from kvlab.room.simulate import shared_server_requests
from kvlab.room.store import LATE_S, Store
from kvlab.room.view import Room

KEY = "tulip-42"
NB = "09_measure_a_real_server.ipynb"
T_RUN = 1_767_000_000.0  # when the server ran, on the collector's clock
SHARED = T_RUN + 3 * 3600.0  # when everyone shares: three hours later, far past LATE_S
JOIN_S = 1.5  # learner i started its client i * JOIN_S after the first
# each learner's clock minus the true time: right, an hour behind or ahead, two hours ahead, minutes and seconds off
SKEW_S = {"Ada": 0.0, "Alan": -3600.0, "Barbara": 3600.0, "Claude": 45.0, "Dana": -600.0, "Edsger": 0.0,
          "Frances": 7200.0, "Grace": -30.0}
WINDOW_S = 5.0


def learner_run(i: int, name: str, records: list, clock_error_s: float) -> LearnerRun:
    """Learner i's 09 file as their share() writes it: their requests, their client's start on their own clock."""
    run = LearnerRun(name, NB, machine={"device": "Apple M2", "device_class": "cpu", "torch_threads": 4})
    run.requests = [{"request_id": str(k), "prompt_tokens": 64, "max_new_tokens": 16, "scheduled_s": s,
                     "sent_s": s, "admitted_s": a, "first_token_s": f, "finished_s": e, "status": status,
                     "fail_reason": reason, "output_tokens": 16 if f is not None else 0}
                    for k, (s, a, f, e, status, reason) in enumerate(records)]
    run.load = {"started_at": T_RUN + i * JOIN_S + clock_error_s, "started_at_from": "client"}
    return run


@pytest.fixture(scope="module")
def server_records():
    """The server's own records: per learner, (scheduled_s, admitted_s, first_token_s, finished_s, status, reason)."""
    return shared_server_requests(len(SKEW_S), seed=3, rate=1.2, duration_s=20.0, join_every_s=JOIN_S, slots=3,
                                  max_waiting=12)


@pytest.fixture(scope="module")
def collected(tmp_path_factory, server_records):
    """The room as the collector saw it: every learner late, in shuffled order, each with their clock's error."""
    store = Store(tmp_path_factory.mktemp("room") / "room.sqlite")
    runs = {name: learner_run(i, name, server_records[i], SKEW_S[name]) for i, name in enumerate(SKEW_S)}
    answers = {}
    with TestClient(create_app(store, KEY, clock=lambda: SHARED)) as client:
        order = list(runs)
        random.Random(7).shuffle(order)
        for name in order:
            sent_at = SHARED + SKEW_S[name]  # the learner's clock as it sends
            r = client.post("/room/submissions", content=runs[name].to_json().encode(),
                            headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json",
                                     SENT_AT_HEADER: repr(sent_at)})
            assert r.status_code == 201, r.text
            answers[name] = r.json()
        twice = learner_run(0, "Mallory", server_records[0], SKEW_S["Ada"])  # Ada's run, shared under a second name
        assert client.post("/room/submissions", content=twice.to_json().encode(),
                           headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json",
                                    SENT_AT_HEADER: repr(SHARED)}).status_code == 201
        export = client.get("/room/export", headers={"Authorization": f"Bearer {KEY}"}).json()
    # handed in as a file (no clock measured at sending), from a clock four hours ahead: its requests "end" after
    # the collector received them
    ahead = learner_run(2, "Hedy", server_records[2], 4 * 3600.0)
    outcome = store.add(ahead, "folder:kvlab-room-Hedy.json", received_at=SHARED)
    assert "cannot be" in outcome.clock_note
    export["submissions"] += [s for s in store.room_file()["submissions"] if s["run"]["learner"] == "Hedy"]
    store.close()
    return Room.from_room_file(json.loads(json.dumps(export))), answers


def truth_room(server_records) -> Room:
    """The same runs placed by the server's own clock: no clock error, nothing to check."""
    return Room([{"run": learner_run(i, name, server_records[i], 0.0), "note": None, "current": True,
                  "source": "truth", "received_at": None} for i, name in enumerate(SKEW_S)])


def server_arrivals(server_records) -> pd.DataFrame:
    """Every request as the server saw it arrive (its own clock), with its outcome."""
    rows = [{"arrival": T_RUN + i * JOIN_S + s, "status": status, "fail_reason": reason}
            for i, records in enumerate(server_records) for (s, _, _, _, status, reason) in records]
    return pd.DataFrame(rows).sort_values("arrival", ignore_index=True)


def test_the_collector_measures_each_learners_clock_and_says_so(collected):
    _, answers = collected
    assert answers["Ada"]["clock_note"].startswith("shared 3.0 h after its run ended")  # right clock: late, placed
    assert "clock was 60 min ahead of the collector's" in answers["Barbara"]["clock_note"]
    assert "clock was 60 min behind the collector's" in answers["Alan"]["clock_note"]
    for name, skew in SKEW_S.items():
        note = answers[name]["clock_note"]
        moved = abs(skew) > 2.0
        assert ("its requests are moved by that much" in note) == moved, (name, note)
        assert ("ahead of" in note) == (moved and skew > 0) and ("behind" in note) == (moved and skew < 0)


def test_every_request_is_placed_where_the_server_saw_it(collected, server_records):
    room, _ = collected
    placements = room.placements().set_index("learner")
    assert placements.loc[list(SKEW_S), "pooled"].all()
    assert placements.loc[list(SKEW_S), "shift_s"].to_dict() == {n: (-s if abs(s) > 2 else 0.0)
                                                                 for n, s in SKEW_S.items()}
    assert not placements.loc["Mallory", "pooled"] and "the same requests as Ada's run" in placements.loc[
        "Mallory", "note"]
    assert not placements.loc["Hedy", "pooled"] and "cannot be" in placements.loc["Hedy", "note"]
    assert "left out of the room's curve: Mallory, Hedy" in room.summary()

    truth = server_arrivals(server_records)
    pooled = room.requests().sort_values("t_s", ignore_index=True)
    assert len(pooled) == len(truth)  # every request once: Mallory's copy and Hedy's file are not pooled
    assert np.allclose(pooled["t_s"], truth["arrival"] - truth["arrival"].min(), atol=1e-6)
    assert pooled["fail_reason"].fillna("").tolist() == truth["fail_reason"].fillna("").tolist()


def test_the_rooms_curve_is_the_one_the_server_records_give(collected, server_records):
    room, _ = collected
    truth = server_arrivals(server_records)
    window = ((truth["arrival"] - truth["arrival"].min()) // WINDOW_S).astype(int)
    timeline = room.timeline(WINDOW_S)
    refused = truth["fail_reason"].fillna("").str.startswith("http_429")
    counted = pd.DataFrame({"arrived": truth.groupby(window).size(), "refused": refused.groupby(window).sum()})
    assert timeline["arrived"].tolist() == counted["arrived"].reindex(timeline["window"], fill_value=0).tolist()
    assert timeline["refused"].tolist() == counted["refused"].reindex(timeline["window"], fill_value=0).tolist()
    assert truth["fail_reason"].notna().sum() > 0  # the server did refuse some: the curve has a knee to find
    expected = truth_room(server_records)
    pd.testing.assert_frame_equal(room.service_curve(WINDOW_S), expected.service_curve(WINDOW_S))
    assert room.knee_rps(window_s=WINDOW_S) == expected.knee_rps(window_s=WINDOW_S)
    assert room.knee_rps(window_s=WINDOW_S).case == "knee"


def test_a_run_shared_long_after_with_its_clock_never_checked_is_named_and_left_out():
    run = learner_run(0, "Ivan", [(0.0, 0.1, 0.2, 0.5, "completed", None)], 0.0)
    late = Room([{"run": run, "note": None, "current": True, "source": "folder:x",
                  "received_at": T_RUN + LATE_S + 60, "clock_offset_s": None}])
    [row] = late.placements().to_dict("records")
    assert not row["pooled"] and "never checked" in row["note"] and late.requests().empty
    assert len(late.requests(every_run=True)) == 1  # still there for whoever asks
    checked = Room([{"run": run, "note": None, "current": True, "source": "http",
                     "received_at": T_RUN + LATE_S + 60, "clock_offset_s": 0.1}])
    assert checked.placements()["pooled"].all() and len(checked.requests()) == 1  # measured at sending: placed
