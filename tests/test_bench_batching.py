"""The batching benchmark, shrunk to a tiny model: every run reported with the agreed schema (not its speed).

Its ratios come from interleaved rounds: the tests recompute them from the per-round throughputs the
report keeps, so a ratio is always the median of paired per-round ratios, with its spread.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

import kvlab
from kvlab.benchmarks import batching
from kvlab.benchmarks.batching import ENTRY_KEYS, BenchSettings, make_requests, run_benchmark
from kvlab.benchmarks.kv_allocation import paged_vs_reservation
from kvlab.serving import SchedulerConfig
from kvlab.results_io import to_json
from kvlab.serving.cost_model import load_calibration
from kvlab.serving.reservation import ReservationEngine, ReservingBlockManager
from kvlab.workload import Request
from kvlab.serving.config import EngineSpec

TINY = BenchSettings(config="tiny", requests=5, prompt_tokens=(8, 40), output_tokens=(2, 10), max_seqs=2,
                     max_batch_tokens=64, max_model_len=128, spreads=((6, 6), (2, 10)), threads=1, repeats=3)


@pytest.fixture(scope="module")
def report() -> dict:
    return run_benchmark(TINY, log=lambda _m: None)


def test_every_entry_carries_the_agreed_keys_and_accounts_for_every_request(report):
    impls = {(r["impl"], r["policy"], r["outputs"]) for r in report["results"]}
    assert ("kvlab", "static", "mixed 2-10") in impls and ("kvlab", "continuous", "mixed 2-10") in impls
    assert ("transformers", "generate_batch", "fixed 10") in impls and ("kvlab", "continuous", "fixed 10") in impls
    for r in report["results"]:
        assert set(ENTRY_KEYS) <= set(r)
        assert r["completed"] + r["failed"] == TINY.requests and r["failed"] == 0
        assert r["output_tokens_per_s"] > 0 and r["ttft_p50_s"] <= r["ttft_p95_s"]
    mixed = [r for r in report["results"] if r["outputs"].startswith("mixed")]
    expected = sum(q.max_new_tokens for q in make_requests(TINY, vocab=320))
    assert all(r["output_tokens"] == expected for r in mixed)  # each request ran to its own length, in every impl


def test_report_has_ratios_spreads_paging_and_the_environment(report):
    s = report["summary"]
    assert s["ratio_continuous_static"] > 0
    assert s["ratio_kvlab_continuous_vs_transformers_generate_batch_fixed"] > 0
    assert [row["outputs"] for row in report["spread"]] == ["6-6", "2-10"]
    assert report["spread"][0]["mean_output"] == report["spread"][1]["mean_output"] == 6  # only the spread differs
    assert "generate_batch takes one max_new_tokens" in report["settings"]["transformers_note"]
    assert {"versions", "cpu", "threads"} <= set(report["env"]) and report["env"]["threads"] == 1
    assert set(report["load_average"]) == {"before", "after"} and "1m" in report["load_average"]["before"]
    json.loads(to_json(report))  # what --json writes: strict JSON


def test_cells_run_in_rotated_rounds_and_ratios_are_paired_within_rounds(report):
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert len({tuple(r["order"][0]) for r in rounds}) == 3  # a different cell first in each round
    assert all(sorted(map(tuple, r["order"])) == sorted(map(tuple, rounds[0]["order"])) for r in rounds)
    cell = {(r["impl"], r["policy"], r["outputs"]): r for r in report["results"]}
    for r in report["results"]:
        tps = r["runs_output_tokens_per_s"]
        assert r["repeats"] == len(tps) == 3
        assert r["output_tokens_per_s"] == sorted(tps)[1]  # the median run stands for its cell
        sp = r["spread_output_tokens_per_s"]
        assert (sp["min"], sp["median"], sp["max"]) == pytest.approx((min(tps), np.median(tps), max(tps)))
    ratios = report["summary"]["ratios"]
    assert ratios, "every summary ratio is listed with its spread"
    for r in ratios:
        a, b = cell[tuple(r["a"])], cell[tuple(r["b"])]
        per_round = [x / y for x, y in zip(a["runs_output_tokens_per_s"], b["runs_output_tokens_per_s"])]
        s = r["output_tokens_per_s"]
        assert s["values"] == pytest.approx(per_round) and s["n"] == 3
        assert s["median"] == pytest.approx(np.median(per_round))
        assert (s["min"], s["q1"], s["q3"], s["max"]) == pytest.approx(
            (min(per_round), np.percentile(per_round, 25), np.percentile(per_round, 75), max(per_round)))
    by_pair = {(tuple(r["a"]), tuple(r["b"])): r["output_tokens_per_s"]["median"] for r in ratios}
    assert report["summary"]["ratio_continuous_static"] == by_pair[
        (("kvlab", "continuous", "mixed 2-10"), ("kvlab", "static", "mixed 2-10"))]
    assert report["summary"]["ratio_kvlab_continuous_vs_transformers_generate_batch_fixed"] == by_pair[
        (("kvlab", "continuous", "fixed 10"), ("transformers", "generate_batch", "fixed 10"))]


def test_paging_fits_more_sequences_than_max_length_reservation_and_wastes_less():
    s = BenchSettings(config="tiny", requests=12, prompt_tokens=(8, 40), output_tokens=(2, 10), max_model_len=128)
    p = paged_vs_reservation(make_requests(s, vocab=320), load_calibration("tiny-llama"), s, kv_budget_tokens=256)
    paged, reserved = p["runs"]["paged"], p["runs"]["reserve_max_model_len"]
    assert reserved["peak_running"] == 256 // 128  # the formula: budget / max_model_len
    assert paged["peak_running"] > reserved["peak_running"] and p["ratio_mean_running"] > 1
    assert paged["waste_fraction"] < reserved["waste_fraction"]
    assert paged["completed"] == reserved["completed"] == 12


def test_a_reservation_takes_every_block_at_admission_and_never_another(model):
    bm = ReservingBlockManager(num_blocks=20, block_size=4, max_model_len=32)
    engine = ReservationEngine(model, EngineSpec(block_size=4, kv_budget_bytes=20 * 4 * model.config.kv_bytes_per_token(), scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=32, max_model_len=32)))
    assert isinstance(engine.block_manager, ReservingBlockManager) and bm.num_free_blocks == 20
    engine.add_request(Request(0, 5, 6, 0.0, "x"))
    engine.step()
    assert engine.block_manager.stats().used == 8  # 32 tokens reserved = 8 blocks, for a 5-token prompt
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.block_manager.stats().used in (0, 8)
    assert engine.sequences[0].output_token_ids == kvlab.generate(
        model, engine.sequences[0].token_ids[:5], max_new_tokens=6).tokens
    with pytest.raises(ValueError, match="unknown reserve mode"):
        ReservationEngine(model, reserve="sometimes")


def test_cli_writes_the_report_as_json(tmp_path, monkeypatch):
    monkeypatch.setattr(batching, "BenchSettings", lambda **kw: TINY)  # the CLI's settings, shrunk
    parser = argparse.ArgumentParser()
    batching.add_arguments(parser)
    path = tmp_path / "bench.json"
    args = parser.parse_args(["--json", str(path), "--no-transformers", "--no-spread"])
    assert batching.main(args) == 0
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "batching" and len(doc["results"]) == 2 and doc["spread"] == []
    assert len(doc["settings"]["load_average_1m"]) == 2  # before and after
    assert all(set(ENTRY_KEYS) <= set(r) for r in doc["results"])
    assert torch.get_num_threads() >= 1
