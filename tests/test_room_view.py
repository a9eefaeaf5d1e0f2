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
    return Room([{"run": r, "note": None, "current": True, "source": "test", "received_at": None} for r in runs])


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
    assert curve["is_knee"].tolist() == [True, False]
    knee = room.knee_rps(window_s=2.0, bins=[0, 1.5, 10])
    assert (knee.rps, knee.case) == (1.0, "knee") and str(knee).startswith("1 requests/s")
    assert (low["refused"], high["refused"], high["failed_otherwise"]) == (0.0, 0.25, 0.0)  # the 429, beside the curve
    assert room.requests()["fail_reason"].tolist().count("http_429:queue_full") == 1  # the reason is kept


def served_room(rates_and_outcomes) -> Room:
    """One learner per (offered rate, outcome) pair: a 10 s run at that rate, every request ``outcome``."""
    runs = []
    for k, (rate, outcome) in enumerate(rates_and_outcomes):
        run = LearnerRun(f"L{k}", "09_measure_a_real_server.ipynb")
        n = int(rate * 10)
        run.requests = [{"request_id": str(i), "scheduled_s": i / rate, "first_token_s": i / rate + 0.1 if
                         outcome == "completed" else None, "finished_s": i / rate + 0.3, "status":
                         "completed" if outcome == "completed" else "failed", "fail_reason":
                         None if outcome == "completed" else outcome, "output_tokens": 4} for i in range(n)]
        run.load = {"started_at": 1000.0 + 20 * k}  # one after another: each learner's rate is its windows' rate
        runs.append(run)
    return room_of(*runs)


def test_the_knee_says_which_case_it_is():
    knee = served_room([(1.0, "completed"), (2.0, "completed"), (4.0, "completed")]).knee_rps(bins=[0, 1.5, 3, 10])
    assert (knee.rps, knee.case) == (None, "kept_up") and "every rate the room offered kept up" in str(knee)
    knee = served_room([(1.0, "http_429:queue_full"), (2.0, "http_429:queue_full")]).knee_rps(bins=[0, 1.5, 10])
    assert (knee.rps, knee.case) == (None, "behind_from_the_start") and "100% refused" in str(knee)
    assert "the knee lies below it" in str(knee)
    knee = served_room([(1.0, "completed"), (2.0, "completed"), (4.0, "timeout")]).knee_rps(bins=[0, 1.5, 3, 10])
    assert (knee.rps, knee.case) == (2.0, "knee") and "100% failed otherwise" in str(knee)
    assert room_of().knee_rps().case == "no_requests"


MATH = r"$\frac{$"  # matplotlib's math syntax, unbalanced: parsed as math, it raises when the figure is drawn


def test_nothing_a_learner_types_breaks_a_figure_or_the_html():
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from kvlab.room.figures import answers_figure, guesses_figure, hold_rates_figure, service_figure
    from kvlab.room.record import MAX_TEXT, RoomFileError, validate

    eve = learner("<Eve>", device=f"{MATH} <script>alert(1)</script>")
    eve.add_prediction(2.0, 3.0, question=f"late {MATH} over early?", unit=MATH)
    eve.add_verdicts([{"claim": MATH, "holds": False}]).add_figure(MATH, 1.0)
    room = room_of(eve, learner("Ada").add_prediction(2.5, 3.0, question=f"late {MATH} over early?", unit=MATH))
    for draw in (lambda: answers_figure(room, NB), lambda: guesses_figure(room), lambda: hold_rates_figure(room),
                 lambda: service_figure(room)):
        with plt.rc_context({"text.usetex": True}):  # a teacher's TeX setting: still plain text, no LaTeX run
            fig = draw()
        fig.canvas.draw()  # math parsing would raise ValueError here
        assert not any(t.get_usetex() for t in fig.findobj(Text))
        plt.close(fig)
    fig = answers_figure(room, NB)
    assert any(r"\$\frac{\$" in t.get_text() for t in fig.findobj(Text))  # the learner's text, drawn literally
    plt.close(fig)
    html = room.learners()._repr_html_() + room.measured()._repr_html_() + room.hold_rates()._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;Eve&gt;" in html
    long = learner("Al").add_prediction(1.0, 2.0, question="x" * 500, unit="u" * 500)
    assert len(long.predictions[0]["text"]) == len(long.predictions[0]["unit"]) == MAX_TEXT
    assert validate(long.to_json()).predictions == long.predictions
    data = long.to_dict()
    data["machine"]["device"] = "y" * 5000
    with pytest.raises(RoomFileError, match="5,000 characters"):
        validate(data)


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


def rooms_of_one_kind() -> dict:
    """Rooms a workshop may really have: only 09 and no predictions or verdicts, only 01, nobody yet."""
    from kvlab.room.simulate import simulated_room

    runs = simulated_room(6)
    only_09 = [r for r in runs if r.notebook.startswith("09")]
    for r in only_09:
        r.predictions, r.verdicts, r.figures = [], [], {}
    return {"only 09, no predictions, no verdicts": only_09,
            "only 01": [r for r in runs if r.notebook.startswith("01")], "nobody yet": []}


@pytest.mark.parametrize("kind", list(rooms_of_one_kind()))
def test_the_teachers_notebook_runs_top_to_bottom_on_any_room(kind, tmp_path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    import matplotlib.pyplot as plt

    from kvlab.room.store import room_file

    rows = [{"body": r.to_json(), "received_at": None, "source": "test", "note": None, "current": True}
            for r in rooms_of_one_kind()[kind]]
    path = tmp_path / "room.json"
    path.write_text(json.dumps(room_file(rows)), encoding="utf-8")
    monkeypatch.setenv("KVLAB_ROOM", str(path))
    namespace: dict = {}
    for cell in jupytext.read(ROOM_DIR / "room_view.py").cells:  # the cells in order, in one namespace, as a kernel
        if cell.cell_type == "code":
            exec(compile(cell.source, f"room_view.py ({kind})", "exec"), namespace)
    plt.close("all")
    assert namespace["room"].summary().startswith(f"{len({r.learner for r in rooms_of_one_kind()[kind]})} learners")
