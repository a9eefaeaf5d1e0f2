"""vLLM for real (full tier): set up in its own venv, started beside kvlab serve on the lesson checkpoint, the same
greedy tokens on 16 prompts, every request of a short sweep accounted for, stopped with nothing left behind.

No speed is asserted: this checks that the third engine of `bench serve` and notebook 09 computes what kvlab
computes and is measured by the same client. Skipped, with the reason printed, only where vLLM's torch build
(torch==2.13.0+cpu) cannot be had; any other failure to set it up fails. On a fresh machine it installs vLLM
(about 2-3 minutes, 3.5 GB under ~/.cache/kvlab/vllm, or $KVLAB_VLLM_HOME) and compiles on the first start.
"""
from __future__ import annotations

import os
import socket

import pytest

from kvlab.http import vllm
from kvlab.http.peer import process_usage
from kvlab.experiments.three_engines import (GREEDY_PROMPTS, same_greedy_tokens,
                                                                   server_pid, vllm_folder)
from kvlab.experiments.two_engines import Protocol, make_server, start_together, sweep

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def servers(real_vllm_home):
    try:
        vllm.setup_vllm()
    except vllm.VllmUnavailable as e:
        if e.reason != "torch":
            raise
        print(f"\nvLLM test skipped: {e}")
        pytest.skip(str(e))
    folder = vllm_folder()
    kvlab, peer = make_server("kvlab serve", folder), make_server(vllm.NAME, folder)
    start_together([kvlab, peer])
    try:
        yield kvlab, peer
    finally:
        kvlab.stop()
        peer.stop()


def test_vllm_writes_the_same_greedy_tokens_as_kvlab_serve_on_16_prompts(servers):
    greedy = same_greedy_tokens(servers, GREEDY_PROMPTS, max_tokens=16)
    assert greedy["prompts"] == len(GREEDY_PROMPTS) >= 16
    assert greedy["same"], f"the two engines differ on {greedy['differ']}"


def test_every_request_of_a_short_sweep_is_accounted_for(servers):
    _, peer = servers
    rows = sweep(peer, [8.0, 32.0, 96.0], Protocol(duration_s=1.0, warmup=4), stop_past_knee=False)
    assert [r["offered_rps"] for r in rows] == [8.0, 32.0, 96.0]
    for r in rows:  # read at each rate's close: every request sent by then is in exactly one place
        assert r["sent"] == r["completed"] + r["failed"] + r["waiting"], r
        assert r["sent"] <= r["num_requests"], r  # the rest: not yet sent by the close (the client's own lag)
    assert rows[0]["completed"] == rows[0]["sent"] == rows[0]["num_requests"]  # 8 req/s: far below its knee
    usage = process_usage(server_pid(peer))
    assert usage["processes"] >= 3  # API server, engine core, worker


def test_vllms_own_client_measures_both_servers_and_vllm_runs_as_its_cpu_guide_asks(servers):
    from kvlab.benchmarks.vllm_client import CLIENT, vllm_client_sweep

    kvlab, peer = servers
    for server in servers:  # the second client of `bench serve --second-client`: every request accounted for
        [row] = vllm_client_sweep(server, [8.0], 2.0, warmups=2)
        assert row["client"] == CLIENT and row["completed"] == row["sent"] == 16 and not row["first_error"], row
        assert 0 < row["ttft_p50_s"] <= row["e2e_p50_s"] and row["output_tokens_per_s"] > 0
    settings = peer.describe()  # what `bench serve` writes into its JSON
    assert settings["omp_binding"] and "OpenMP threads on cores" in settings["omp_binding"]
    assert "libiomp5.so" in (settings["ld_preload"] or "")  # vLLM's venv always has Intel's OpenMP


def test_stopping_vllm_leaves_no_process_and_no_port_behind(servers):
    _, peer = servers
    group, port = peer.process.process.pid, peer.process.port
    assert peer.stop() == 0
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
