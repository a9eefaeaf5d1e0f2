"""The room view: all thirty of the sample room shown, hold rates and guesses against hand counts, a misfit named,
one service curve pooled from known requests with hand-computed quantiles, and the teacher's notebook run once.
"""
from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from kvlab.room import LearnerRun
from kvlab.room.simulate import NAMES
from kvlab.room.view import Room, load_room

ROOT = Path(__file__).resolve().parent.parent
ROOM_DIR = ROOT / "notebooks" / "room"
SAMPLE = ROOM_DIR / "sample_room.json"
NB = "01_the_slowdown.ipynb"


def room_of(*runs: LearnerRun) -> Room:
    return Room([{"run": r, "note": None, "current": True, "source": "test", "received_at": 0.0} for r in runs])


def learner(name: str, device_class: str = "cpu", threads: int = 4, device: str | None = None) -> LearnerRun:
    return LearnerRun(name, NB, machine={"device": device or f"{device_class} box", "device_class": device_class,
                                         "torch_threads": threads, "runtime": "local"})


# -- the sample room ---------------------------------------------------------------------------------------------
def test_the_view_of_the_sample_room_shows_all_thirty():
    room = load_room(SAMPLE)
    learners = room.learners()
    assert sorted(learners["learner"].str.rstrip("*")) == sorted(NAMES) and (learners["notebooks"] == 5).all()
    assert room.summary().startswith("30 learners, 151 submissions (1 superseded by a newer run), 5 notebooks")
    for notebook in {r.notebook for r in room.runs}:
        assert room.by_device(notebook)["n"].sum() == 30
    assert (room.guesses()["n_measured"] == 30).all()
    assert (room.hold_rates()["checked"] == 30).all()
    assert room.requests()["learner"].nunique() == 30


def test_the_sample_room_file_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("make_sample_room", ROOT / "scripts" / "make_sample_room.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert json.loads(SAMPLE.read_text(encoding="utf-8")) == json.loads(json.dumps(script.sample_room())), (
        "notebooks/room/sample_room.json is stale: run python scripts/make_sample_room.py")


# -- hand counts ---------------------------------------------------------------------------------------------------
def test_hold_rates_match_a_hand_count():
    a, b, c = learner("A"), learner("B", threads=2), learner("C")
    a.add_verdicts([{"claim": "slows_down", "holds": True}, {"claim": "flat", "holds": True}])
    b.add_verdicts([{"claim": "slows_down", "holds": False}, {"claim": "flat", "holds": True}])
    c.add_verdicts([{"claim": "slows_down", "holds": None}, {"claim": "flat", "holds": True}])  # not checked on C
    rates = room_of(a, b, c).hold_rates().set_index("claim")
    assert rates.loc["slows_down", ["checked", "held", "hold_rate"]].tolist() == [2, 1, 0.5]
    assert rates.loc["slows_down", "failed_on"] == "B (cpu box, 2 threads)"
    assert rates.loc["flat", ["checked", "held", "hold_rate", "failed_on"]].tolist() == [3, 3, 1.0, ""]


def test_the_rooms_guesses_against_a_hand_count():
    runs = [learner(n).add_prediction(g, 2.0, question="late over early?", unit="×") for n, g in
            (("A", 8.0), ("B", 3.0), ("C", 1.0))]
    row = room_of(*runs).guesses().iloc[0]
    assert row["guess_median"] == 3.0 and row["measured_median"] == 2.0
    assert row["room_error_x"] == pytest.approx(1.5)  # median of 4, 1.5 and 0.5
    assert row["within_2x"] == pytest.approx(2 / 3)


def test_a_machine_that_disagrees_is_named_with_its_settings():
    values = {"A": 2.0, "B": 2.1, "C": 1.9, "D": 2.05, "E": 1.95, "Slow": 6.0}
    runs = [learner(n, threads=1 if n == "Slow" else 4).add_figure("late_early_ratio", v) for n, v in values.items()]
    runs += [learner(n, "cuda", 2, "Tesla T4").add_figure("late_early_ratio", v) for n, v in (("G1", 1.0),
                                                                                            ("G2", 1.02))]
    out = room_of(*runs).outliers().set_index("learner")
    assert set(out.index) == {"Slow", "G1", "G2"}  # the five CPUs near 2 are not named
    assert out.loc["Slow", ["device", "threads", "compared_with"]].tolist() == ["cpu box", 1, "cpu machines"]
    assert out.loc["G1", ["device", "compared_with"]].tolist() == ["Tesla T4", "the room"]  # 2 GPUs: too few alone
    logs = [math.log(v) for v in values.values()]  # the oracle: robust z on logs within the six CPUs
    med = statistics.median(logs)
    mad = statistics.median(abs(x - med) for x in logs)
    assert out.loc["Slow", "z"] == round(0.6745 * (math.log(6.0) - med) / mad, 1)


def test_one_service_curve_pooled_from_known_requests():
    def record(i, s, first, finish, out=5, status="completed"):
        return {"request_id": str(i), "prompt_tokens": 8, "max_new_tokens": out, "scheduled_s": s, "sent_s": s,
                "admitted_s": None, "first_token_s": first, "finished_s": finish, "status": status,
                "fail_reason": None if status == "completed" else "http_429:queue_full",
                "output_tokens": out if status == "completed" else 0}

    one, two = learner("One"), learner("Two")
    one.requests = [record(0, 0.0, 0.1, 0.5), record(1, 1.0, 1.3, 1.9), record(2, 2.5, 3.0, 3.6)]
    one.load = {"started_at": 1000.0}
    two.requests = [record(0, 1.0, 1.6, 2.4), record(1, 1.5, 2.5, 3.5), record(2, 2.0, None, 2.01, status="failed")]
    two.load = {"started_at": 1001.0}  # joined a second later: its arrivals are at 2.0, 2.5 and 3.0 on the room's axis
    room = room_of(one, two)
    timeline = room.timeline(window_s=2.0)
    assert timeline[["learners", "arrived", "offered_rps", "achieved_rps"]].values.tolist() == [[1, 2, 1.0, 1.0],
                                                                                              [2, 4, 2.0, 1.0]]
    curve = room.service_curve(window_s=2.0, bins=[0, 1.5, 10])
    low, high = curve.iloc[0], curve.iloc[1]
    assert (low["requests"], low["ttft_n"], low["served"]) == (2, 2, 1.0)
    assert low["ttft_p50_s"] == pytest.approx(0.2) and low["ttft_p95_s"] == pytest.approx(0.1 + 0.95 * 0.2)
    assert low["tpot_p50_s"] == pytest.approx(((0.4 / 4) + (0.6 / 4)) / 2)
    assert (high["requests"], high["ttft_n"], high["served"]) == (4, 3, 0.75)  # the 429 is not served
    assert high["ttft_p50_s"] == pytest.approx(0.6) and high["ttft_p95_s"] == pytest.approx(0.6 + 0.9 * 0.4)
    assert curve["is_knee"].tolist() == [True, False] and room.knee_rps(window_s=2.0, bins=[0, 1.5, 10]) == 1.0


# -- the teacher's notebook ----------------------------------------------------------------------------------------
def test_the_notebook_is_its_source():
    jupytext = pytest.importorskip("jupytext")
    source = jupytext.read(ROOM_DIR / "room_view.py")
    built = json.loads((ROOM_DIR / "room_view.ipynb").read_text(encoding="utf-8"))
    assert [c.source for c in source.cells] == ["".join(c["source"]) for c in built["cells"]], (
        "notebooks/room/room_view.ipynb differs from its source: rebuild it (see notebooks/room/README.md)")


def test_the_teachers_notebook_runs_top_to_bottom_and_shows_all_thirty():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from notebook_run import _kernel_manager
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOM_DIR / "room_view.ipynb", as_version=4)
    for cell in nb.cells:
        cell.outputs = [] if cell.cell_type == "code" else cell.get("outputs")
    NotebookClient(nb, km=_kernel_manager(), timeout=120, allow_errors=True,
                   resources={"metadata": {"path": str(ROOM_DIR)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "30 learners, 151 submissions" in text and "knee: " in text
    assert all(name in text for name in NAMES)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
