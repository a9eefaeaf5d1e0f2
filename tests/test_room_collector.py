"""The room's collector: thirty learners submitting at once, the collector killed mid-run and restarted, bad input refused.

The headline test runs the simulated room (`kvlab.room.simulate`, 30 learners x 5 notebooks) through a
real `python -m kvlab room` process, kills it (SIGKILL) in the middle, restarts a collector on the same
SQLite file and checks that every submission it had answered "accepted" is still there; one Colab
learner who cannot reach the teacher hands in files through the inbox folder instead. The rest checks
each bad input on its own, with FastAPI's TestClient.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from kvlab.http.local import ServerProcess, ServerThread
from kvlab.room import LearnerRun, share, validate
from kvlab.room.collector import create_app
from kvlab.room.record import MACHINE_KEYS, machine_facts
from kvlab.room.simulate import simulated_room
from kvlab.room.store import Store
from kvlab.room.view import Room

KEY = "tulip-42"
AUTH = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
BY_FOLDER = "Ursula"  # a Colab runtime that cannot reach the teacher's machine: her files go in the inbox


@pytest.fixture(scope="module")
def room_runs() -> list[LearnerRun]:
    return simulated_room(30)


# one client for all learner threads (httpx clients are thread-safe; a fresh one per request costs ~20 ms of TLS setup)
HTTP = httpx.Client(timeout=10, limits=httpx.Limits(max_connections=64), trust_env=False)


def post(url: str, run: LearnerRun) -> tuple[int | None, dict]:
    """(status, body) of one submission; (None, {}) when the collector could not be reached."""
    try:
        r = HTTP.post(url + "/room/submissions", content=run.to_json().encode(), headers=AUTH)
    except httpx.HTTPError:
        return None, {}
    return r.status_code, r.json()


# -- the headline: the room through a kill and a restart -----------------------------------------------------
def test_thirty_learners_at_once_through_a_kill_and_a_restart_lose_nothing(tmp_path, room_runs):
    db, inbox = tmp_path / "room.sqlite", tmp_path / "inbox"
    inbox.mkdir()
    by_learner: dict[str, list[LearnerRun]] = {}
    for run in room_runs[:150]:  # the 151st is Alan's second run of 01, sent after the restart
        by_learner.setdefault(run.learner, []).append(run)
    online = {name: runs for name, runs in by_learner.items() if name != BY_FOLDER}
    accepted, unreached, lock = set(), [], threading.Lock()
    start = threading.Barrier(len(online))

    collector = ServerProcess(["kvlab", "room", "--db", str(db), "--inbox", str(inbox), "--log-level", "warning"],
                              env={"KVLAB_ROOM_KEY": KEY}).start()

    def learner(runs: list[LearnerRun]) -> None:
        start.wait()  # everyone at once
        for run in runs:
            status, body = post(collector.url, run)
            with lock:
                if status == 201:
                    accepted.add(run.submission_id)
                else:
                    assert status is None, (status, body)  # only the kill may stop a submission
                    unreached.append(run)
            time.sleep(0.1)  # the next notebook

    with ThreadPoolExecutor(len(online)) as pool:
        futures = [pool.submit(learner, runs) for runs in online.values()]
        while len(accepted) < 40:
            time.sleep(0.005)
        collector.process.kill()  # SIGKILL mid-run: no shutdown, no flush
        collector.process.wait()
        for f in futures:
            f.result()
    assert unreached, "the kill came after every learner had finished; it must land mid-run"

    # the restart: a new collector on the same file holds every submission it had accepted
    store = Store(db)
    assert {row["submission_id"] for row in store.rows()} >= accepted
    with ServerThread(create_app(store, KEY, inbox)) as restarted:
        # every learner sends everything again (the unsure ones too): nothing is doubled
        with ThreadPoolExecutor(len(online)) as pool:
            answers = list(pool.map(lambda run: (run, *post(restarted.url, run)),
                                    [run for runs in online.values() for run in runs]))
        for run, status, body in answers:
            if run.submission_id in accepted:
                assert (status, body["status"]) == (200, "duplicate") and "nothing changed" in body["message"]
            else:  # new, or stored in the instant before the kill with its answer lost: merged either way
                assert (status, body["status"]) in ((201, "accepted"), (200, "duplicate")), body
        status, body = post(restarted.url, room_runs[150])  # Alan ran 01 again: his newer run supersedes
        assert (status, body["status"]) == (201, "superseding") and "replaces the earlier run" in body["message"]
        # Ursula's files come by hand, with one that a download broke
        for run in by_learner[BY_FOLDER]:
            run.save(inbox)
        (inbox / "kvlab-room-broken.json").write_text('{"schema": "kvlab-room-run", ', encoding="utf-8")
        export = HTTP.get(restarted.url + "/room/export", headers=AUTH).json()
        assert HTTP.get(restarted.url + "/health").json() == {"status": "ok", "submissions": 151}

    ids = {s["run"]["submission_id"] for s in export["submissions"]}
    assert ids == {run.submission_id for run in room_runs} and len(export["submissions"]) == 151
    room = Room.from_room_file(export)
    learners = room.learners()
    assert len(learners) == 30 and set(learners["learner"]) == set(by_learner)
    assert (learners["notebooks"] == 5).all()
    assert "from another kvlab version (marked *): 0.2.0" in room.summary()  # Zoe's files: accepted, marked
    zoe = [s for s in export["submissions"] if s["run"]["learner"] == "Zoe"]
    assert all("kvlab 0.2.0" in s["note"] for s in zoe)
    sources = {s["source"] for s in export["submissions"] if s["run"]["learner"] == BY_FOLDER}
    assert all(source.startswith("folder:kvlab-room-Ursula-") for source in sources)
    store.close()


# -- bad input, one at a time -----------------------------------------------------------------------------------
@pytest.fixture
def client(tmp_path):
    store = Store(tmp_path / "room.sqlite")
    with TestClient(create_app(store, KEY, max_body_bytes=16_384), raise_server_exceptions=False) as c:
        c.store = store
        yield c
    store.close()


def a_run(name: str = "Ada", **kwargs) -> LearnerRun:
    run = LearnerRun(name, "01_the_slowdown.ipynb", machine={"device": "Apple M2", "device_class": "cpu",
                                                             "torch_threads": 4}, **kwargs)
    return run.add_prediction(3.0, 2.5, question="late over early?", unit="×").add_figure("late_early_ratio", 2.5)


def send(client, body: bytes | str, headers: dict | None = None):
    return client.post("/room/submissions", content=body if isinstance(body, bytes) else body.encode(),
                       headers=AUTH if headers is None else headers)


def test_a_wrong_or_missing_key_is_refused_with_401(client):
    body = a_run().to_json()
    for headers in ({"content-type": "application/json"}, {**AUTH, "Authorization": "Bearer nope"}):
        r = send(client, body, headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "room key" in r.json()["error"]["message"] and "KVLAB_ROOM_KEY" in r.json()["error"]["message"]
    assert client.get("/room/export").status_code == 401
    assert client.store.count() == 0


def test_an_oversized_file_is_refused_with_413(client):
    run = a_run()
    run.figures.update({f"figure_{i}": float(i) for i in range(2000)})
    r = send(client, run.to_json())
    assert r.status_code == 413 and "16,384 bytes" in r.json()["error"]["message"]


def test_a_malformed_file_is_refused_with_422_and_says_what_is_wrong(client):
    r = send(client, '{"schema": "kvlab-room-run", "learner": ')
    assert r.status_code == 422 and "it is not JSON" in r.json()["error"]["message"]
    bad = a_run().to_dict()
    bad.update(learner="../etc", submission_id="x", predictions=[{"question": "q", "guess": "lots"}])
    bad["machine"]["hostname"] = "adas-laptop"
    message = send(client, json.dumps(bad)).json()["error"]["message"]
    for problem in ("path separator", "submission_id is not 32 hex digits", "predictions[0].guess is 'lots'",
                    "machine holds ['hostname']"):
        assert problem in message
    assert client.store.count() == 0


@pytest.mark.parametrize("what", ["a body of 8,000 nested arrays", "a machine nested 10 deep", "a 5,000-character text",
                                  "a bug behind the route"])
def test_a_file_no_one_could_have_shared_is_a_4xx_json_error_and_a_bug_a_json_500(client, what, monkeypatch):
    body = a_run().to_dict()
    if what == "a body of 8,000 nested arrays":  # past Python's recursion limit, under the 16 KiB body limit
        raw = b"[" * 8000 + b"]" * 8000
    elif what == "a machine nested 10 deep":
        deep: dict = {}
        body["machine"]["device"] = deep
        for _ in range(10):
            deep["x"] = deep = {}
        raw = json.dumps(body).encode()
    elif what == "a 5,000-character text":
        body["predictions"][0]["unit"] = "$" * 5000
        raw = json.dumps(body).encode()
    else:
        monkeypatch.setattr(client.store, "add", lambda *a, **k: 1 / 0)
        raw = a_run().to_json().encode()
    r = send(client, raw)
    assert r.headers["content-type"] == "application/json", r.text
    if what == "a bug behind the route":
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        return
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_room_file"
    assert {"a body of 8,000 nested arrays": "nested too deeply", "a machine nested 10 deep": "nested more than 6",
            "a 5,000-character text": "5,000 characters"}[what] in r.json()["error"]["message"]
    assert client.store.count() == 0


def test_a_duplicate_is_merged_and_a_reused_id_with_other_content_is_409(client):
    run = a_run()
    first, again = send(client, run.to_json()), send(client, run.to_json())
    assert (first.status_code, first.json()["status"]) == (201, "accepted")
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    run.figures["late_early_ratio"] = 9.0
    r = send(client, run.to_json())
    assert r.status_code == 409 and "share again" in r.json()["error"]["message"]
    assert client.store.count() == 1


def test_another_kvlab_version_is_accepted_with_a_note_and_another_schema_refused(client):
    r = send(client, a_run(kvlab_version="0.9.3").to_json())
    assert r.status_code == 201 and "kvlab 0.9.3" in r.json()["note"] and "marked in the view" in r.json()["message"]
    patch = send(client, a_run("Alan", kvlab_version="0.1.7").to_json())
    assert patch.status_code == 201 and patch.json()["note"] is None  # a patch release: the same code's numbers
    newer = a_run("Grace").to_dict() | {"schema_version": 2}
    r = send(client, json.dumps(newer))
    assert r.status_code == 422 and "pip install -U kvlab" in r.json()["error"]["message"]


def test_a_body_that_is_not_declared_json_is_refused_with_415(client):
    r = send(client, a_run().to_json(), {**AUTH, "content-type": "text/plain"})
    assert r.status_code == 415 and client.store.count() == 0


def test_a_newer_run_supersedes_the_older_and_history_is_kept(client):
    older, newer = a_run(created="2026-01-29T10:00:00+00:00"), a_run(created="2026-01-29T11:00:00+00:00")
    send(client, older.to_json())
    assert send(client, newer.to_json()).json()["status"] == "superseding"
    rows = client.store.rows()
    assert [(r["submission_id"], r["current"]) for r in rows] == [(older.submission_id, False),
                                                                   (newer.submission_id, True)]
    assert len(Room.from_room_file(client.get("/room/export", headers=AUTH).json()).runs) == 1


def test_the_folder_import_uses_the_same_checks_and_merges_a_second_import(tmp_path):
    folder = tmp_path / "dropped"
    folder.mkdir()
    a_run("Ada").save(folder)
    a_run("Alan").save(folder)
    (folder / "notes.json").write_text("[1, 2]", encoding="utf-8")
    store = Store(tmp_path / "room.sqlite")
    first = dict(store.import_folder(folder))
    assert [first[f].status for f in sorted(first)] == ["accepted", "accepted", "refused"]
    assert "not an object" in first["notes.json"].message
    assert {o.status for f, o in store.import_folder(folder) if f != "notes.json"} == {"duplicate"}
    assert store.count() == 2
    frame = store.room_frame()  # who handed in what: one row per submission
    assert sorted(frame["learner"]) == ["Ada", "Alan"] and set(frame["source"]) == {
        "folder:kvlab-room-Ada-01_the_slowdown.json", "folder:kvlab-room-Alan-01_the_slowdown.json"}
    store.close()


# -- the learner's side -------------------------------------------------------------------------------------------
def test_a_learners_file_keeps_nothing_personal():
    host, home = socket.gethostname(), os.path.expanduser("~")
    env = {"device": f"cpu on {host}", "cpu": "Apple M2", "cpu_count": 8, "torch_threads": 4, "cuda_device": None,
           "platform": "Linux-6.1-x86_64", "hostname": host, "cwd": "/home/ada/kvlab", "python": "3.11.9",
           "versions": {"kvlab": "0.1.0", "torch": f"{home}/torch"}, "timestamp": "2026-01-29T10:00:00+00:00"}
    facts = machine_facts(env)
    assert set(facts) <= set(MACHINE_KEYS) and facts["device"] == "(removed)" and facts["cpu"] == "Apple M2"
    assert facts["versions"]["torch"] == "(removed)" and facts["system"] == "Linux"
    text = LearnerRun("Ada", "01_the_slowdown.ipynb", machine=machine_facts()).to_json()  # this very machine
    assert host not in text and home not in text and os.getcwd() not in text


def test_a_name_is_1_to_40_printable_characters_without_a_path():
    for bad, why in (("", "empty"), ("a/b", "path separator"), ("x" * 41, "at most 40"), ("Ada\tL", "control")):
        with pytest.raises(ValueError, match=why):
            LearnerRun(bad, "01_the_slowdown.ipynb")
    assert LearnerRun("  Zoë K.  ", "01_the_slowdown.ipynb").learner == "Zoë K."
    assert validate(a_run("Zoë K.").to_json()).learner == "Zoë K."


def test_share_saves_without_a_url_and_never_raises(tmp_path, monkeypatch):
    class Comparison:  # the shape of kvlab.lessons.common.predict.Comparison
        question, predicted, measured, unit = "late over early?", 3.0, 2.5, "×"

    class Verdict:  # the shape of kvlab.lessons.common.claims.Verdict
        class claim:
            name, asserts = "uncached_tokens_slow_down", True
        holds, values = True, {"measured": 2.5, "late": 194, "note": "text is not kept"}

    saved = share("Ada", "01_the_slowdown.ipynb", [Comparison()], [Verdict()], {"late_early_ratio": 2.5},
                  folder=str(tmp_path))
    path = tmp_path / "kvlab-room-Ada-01_the_slowdown.json"
    assert saved.startswith("room: saved") and path.is_file()
    run = validate(path.read_bytes())
    assert run.predictions[0]["guess"] == 3.0 and run.verdicts[0]["values"] == {"measured": 2.5, "late": 194.0}
    assert share("", "01_the_slowdown.ipynb").startswith("room: not shared — the name is empty")
    monkeypatch.setenv("KVLAB_ROOM_KEY", KEY)
    closed = f"http://127.0.0.1:{_closed_port()}"
    message = share("Alan", "01_the_slowdown.ipynb", figures={"late_early_ratio": 2.4}, url=closed,
                    folder=str(tmp_path))
    assert "not sent" in message and "download that file" in message
    assert (tmp_path / "kvlab-room-Alan-01_the_slowdown.json").is_file()


def test_a_load_test_result_becomes_request_records_with_a_start_time():
    from kvlab.clocks import RequestRecord
    from kvlab.http.loadgen import LoadTestResult

    done = RequestRecord(0, 8, 4, 0.0, admitted_s=0.1, first_token_s=0.2, token_s=[0.2, 0.3], finished_s=0.4,
                         status="completed", output_tokens_reported=4)
    refused = RequestRecord(1, 8, 4, 0.5, finished_s=0.51, status="failed", fail_reason="http_429:queue_full")
    result = LoadTestResult([done, refused], {"url": "http://teacher:8000", "rate": 2.0, "num_requests": 2}, 1.0)
    run = a_run().add_requests(result, started_at=1_767_000_000.0)
    assert run.load == {"started_at": 1_767_000_000.0, "started_at_from": "caller", "num_requests": 2,
                        "rate": 2.0}  # no URL kept
    assert run.requests[0]["output_tokens"] == 4 and run.requests[1]["fail_reason"] == "http_429:queue_full"
    assert validate(run.to_json()).requests == run.requests


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
