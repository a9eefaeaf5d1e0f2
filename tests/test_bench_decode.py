"""The decode benchmark runs end to end on a tiny model and writes the JSON it promises (schema, not speed).

Its figures come from interleaved rounds: these tests recompute the paired ratios and the roofline
fractions from the per-round values the report keeps, so a ratio can never be a ratio of medians.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import kvlab
from kvlab.rounds import paired_ratio, rotated, spread
from kvlab.cli import main

LESSONS = ("05",)  # the lessons these tests belong to: `pytest -m lNN`

ROUNDS = 3


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "decode.json"
    status = main(["bench", "decode", "--config", "tiny", "--prompt", "12", "--new", "6", "--rounds", str(ROUNDS),
                   "--threads", "1", "--bandwidth-mb", "8", "--compile-backend", "eager", "--json", str(path)])
    assert status == 0
    return json.loads(path.read_text())


def rows(report) -> dict:
    return {(r["impl"], r["cache"], r["compiled"]): r for r in report["results"]}


def test_every_kvlab_cache_and_transformers_has_a_row_and_the_compiled_pair_is_marked(report):
    have = set(rows(report))
    assert {("kvlab", name, False) for name in kvlab.CACHE_NAMES} <= have
    assert {("transformers", name, False) for name in ("dynamic", "static", "quantized", "offloaded")} <= have
    assert {("kvlab", "static", True), ("transformers", "static", True)} <= have  # like for like, both compiled
    assert {r["impl"] for r in report["results"]} == {"kvlab", "transformers"}
    assert report["settings"]["compile"] and report["settings"]["compile_backend"] == "eager"
    assert report["settings"]["inductor_cache"].startswith("shared")  # says whether compile_s was a first use


def test_measured_rows_carry_the_promised_fields(report):
    ok = [r for r in report["results"] if r["status"] == "ok"]
    assert {(r["impl"], r["cache"]) for r in ok} >= {("kvlab", "dynamic"), ("kvlab", "static"), ("kvlab", "none"),
                                                     ("transformers", "dynamic"), ("transformers", "static")}
    for r in ok:
        assert r["tokens_per_s"] > 0 and r["prefill_ms"] > 0 and r["achieved_GBps"] > 0
        assert set(r["ms_per_token"]) == {"1", "5"}  # positions past --new are dropped, the last one kept
        assert all(v > 0 for v in r["ms_per_token"].values())
        assert isinstance(r["cache_bytes"], int) and r["cache_bytes"] >= 0
        assert r["cold"]["tokens_per_s"] > 0 and len(r["runs_tokens_per_s"]) == ROUNDS
        assert r["timing"]
        for name in ("tokens_per_s", "decode_tokens_per_s", "achieved_GBps", "roofline_fraction"):
            s = r["spread"][name]
            assert s["n"] == ROUNDS and s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"]
        assert r["tokens_per_s"] == pytest.approx(np.median(r["runs_tokens_per_s"]))
    by = rows(report)
    # the formula: tiny-llama holds 2 x 2 layers x 2 kv heads x 16 x 4 bytes = 512 bytes per token
    assert by[("kvlab", "dynamic", False)]["cache_bytes"] == 512 * (12 + 6 - 1)
    assert by[("kvlab", "static", False)]["cache_bytes"] == 512 * (12 + 6)
    assert by[("kvlab", "none", False)]["cache_bytes"] == 0
    assert by[("transformers", "dynamic", False)]["cache_bytes"] == 512 * (12 + 6 - 1)
    # K/V read per step: stored tokens at the mean position, every slot for fixed shapes, nothing without a cache
    assert by[("kvlab", "dynamic", False)]["kv_bytes_per_step"] == 512 * (12 + 6 / 2)
    assert by[("kvlab", "static", True)]["kv_bytes_per_step"] == 512 * (12 + 6)
    assert by[("kvlab", "none", False)]["kv_bytes_per_step"] == 0


def test_compiled_rows_report_their_compile_time(report):
    for key in (("kvlab", "static", True), ("transformers", "static", True)):
        r = rows(report)[key]
        assert r["status"] == "ok" and r["compile_s"] >= 0 and r["compile_how"]
    assert rows(report)[("kvlab", "dynamic", False)]["compile_s"] is None


def test_rounds_are_interleaved_and_rotated(report):
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    orders = [r["order"] for r in rounds]
    assert all(sorted(o) == sorted(orders[0]) for o in orders)  # every mode once per round
    assert len({o[0] for o in orders}) == ROUNDS  # a different mode goes first each round
    assert orders[1] == rotated(orders[0], 1)
    assert all(r["matvec_GBps"] == max(r["matvec_plain_GBps"], r["matvec_split_GBps"]) > 0 for r in rounds)


def test_ratios_are_medians_of_per_round_pairs_with_their_spread(report):
    by = {f"{r['impl']}/{r['cache']}" + (" compiled" if r["compiled"] else ""): r for r in report["results"]}
    ratios = {(r["a"], r["b"]): r for r in report["summary"]["ratios"]}
    assert ("kvlab/dynamic", "transformers/dynamic") in ratios
    assert ("kvlab/static", "transformers/static") in ratios  # like for like
    assert ("kvlab/static compiled", "transformers/static compiled") in ratios
    for (a, b), r in ratios.items():
        per_round = [x / y for x, y in zip(by[a]["runs_tokens_per_s"], by[b]["runs_tokens_per_s"])]
        s = r["tokens_per_s"]
        assert s["values"] == pytest.approx(per_round) and s["n"] == ROUNDS
        assert s["median"] == pytest.approx(np.median(per_round))
        assert (s["min"], s["max"]) == pytest.approx((min(per_round), max(per_round)))
        assert s["q1"] == pytest.approx(np.percentile(per_round, 25))
        assert s["q3"] == pytest.approx(np.percentile(per_round, 75))
        assert r["decode_tokens_per_s"]["n"] == ROUNDS
    headline = ratios[("kvlab/dynamic", "transformers/dynamic")]["tokens_per_s"]["median"]
    assert report["summary"]["ratio_dynamic_tokens_per_s"] == headline and math.isfinite(headline)


def test_roofline_fraction_divides_by_the_same_rounds_matvec_bandwidth(report):
    matvec = [r["matvec_GBps"] for r in report["rounds"]]
    for r in report["results"]:
        if r["status"] != "ok":
            continue
        achieved = r["spread"]["achieved_GBps"]["values"]
        assert r["spread"]["roofline_fraction"]["values"] == pytest.approx([a / m for a, m in zip(achieved, matvec)])
        assert r["roofline_fraction"] == pytest.approx(np.median([a / m for a, m in zip(achieved, matvec)]))


def test_the_step_is_split_into_its_weight_products_and_the_rest_round_by_round(report):
    products = [r["products_ms"] for r in report["rounds"]]
    weights = report["summary"]["weight_bytes_per_step"]
    for rnd in report["rounds"]:  # the products stream exactly the weights a step streams
        assert rnd["products_GBps"] == pytest.approx(weights / rnd["products_ms"] / 1e6)
    sp = report["summary"]["step_products"]
    assert sp["ms"]["values"] == pytest.approx(products) and sp["ms"]["n"] == ROUNDS
    assert sp["share_of_matvec"]["values"] == pytest.approx(
        [r["products_GBps"] / r["matvec_GBps"] for r in report["rounds"]])
    for r in report["results"]:
        if r["status"] != "ok":
            continue
        step_ms = [(weights + r["kv_bytes_per_step"]) / a / 1e6 for a in r["spread"]["achieved_GBps"]["values"]]
        assert r["spread"]["outside_products_ms"]["values"] == pytest.approx([s - p for s, p in zip(step_ms, products)])
        assert r["outside_products_ms"] == pytest.approx(np.median([s - p for s, p in zip(step_ms, products)]))


def test_step_products_probe_runs_every_weight_matrix_of_the_step_once():
    from kvlab.experiments.bandwidth import StepProductsProbe, weight_bytes_per_step
    from kvlab.model.config import tiny_gpt2, tiny_llama
    from kvlab.model.decoder import build_model

    for config in (tiny_llama(), tiny_gpt2()):  # untied lm_head; tied head applied as F.linear on the embedding
        model = build_model(config)
        probe = StepProductsProbe(model)
        streamed = sum(w.nbytes for w in probe.weights) + (probe.head.nbytes if probe.head is not None else 0)
        looked_up = {"pos_embed"} | ({"embed"} if model.lm_head is not None else set())  # rows fetched, not streamed
        matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and n not in looked_up]
        assert streamed == sum(p.nbytes for p in matrices)  # every matrix of the step, the embedding only when tied
        assert streamed <= weight_bytes_per_step(model)  # the rest: norms and biases, read but not multiplied
        m = probe.measure(repeats=2)
        assert m["products_ms"] > 0 and m["products_GBps"] == pytest.approx(probe.nbytes / m["products_ms"] / 1e6)


def test_environment_settings_load_and_summary(report):
    env = report["env"]
    assert {"versions", "device", "device_used", "threads", "model_config", "cpu_count"} <= set(env)
    assert env["threads"] == 1 and env["model_config"]["name"] == "tiny-llama"
    assert {"torch", "transformers", "kvlab"} <= set(env["versions"])
    assert report["settings"]["prompt_tokens"] == 12 and report["settings"]["new_tokens"] == 6
    assert report["settings"]["rounds"] == ROUNDS
    load = report["summary"]["load_average"]
    assert set(load) == {"before", "after"} and {"1m", "5m", "15m"} <= set(load["before"])
    assert report["settings"]["load_average_1m"] == [load["before"]["1m"], load["after"]["1m"]]
    bw = report["machine_bandwidth"]
    assert bw["sum_read_GBps"] > 0 and bw["copy_GBps"] > 0 and bw["matvec_GBps"] > 0


def test_paired_statistics():
    assert rotated(["a", "b", "c"], 1) == ["b", "c", "a"] and rotated(["a", "b", "c"], 3) == ["a", "b", "c"]
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"], s["n"]) == (3.0, 1.0, 100.0, 2.0, 4.0, 5)
    assert paired_ratio([2.0, 9.0], [1.0, 3.0])["values"] == [2.0, 3.0]
    with pytest.raises(ValueError, match="one value of each side per round"):
        paired_ratio([1.0, 2.0], [1.0])


def test_bad_benchmark_settings_are_refused_before_running():
    with pytest.raises(SystemExit, match=r"unknown cache\(s\) \['paged'\] in --caches"):
        main(["bench", "decode", "--config", "tiny", "--caches", "dynamic,paged"])
    with pytest.raises(SystemExit, match=r"--prompt 1000 \+ --new 128 exceeds the tiny-llama context of 1024"):
        main(["bench", "decode", "--config", "tiny", "--prompt", "1000"])


def test_transformers_rows_read_a_prompt_holding_the_pad_token_id_like_kvlab():
    # transformers' generate masks every prompt token equal to pad_token_id (0 here) unless it is given a mask
    import kvlab
    from kvlab.benchmarks.decode_runs import Mode, run_kvlab
    from kvlab.benchmarks.transformers_runs import run_transformers
    from kvlab.model.loading import to_transformers

    model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")
    prompt = [5, 0, 17, 0, 9, 3, 0, 11]
    mode = Mode("transformers", "dynamic")
    hf = to_transformers(model)
    ours = run_kvlab(model, prompt, Mode("kvlab", "dynamic"), 8, model.config.kv_bytes_per_token(), "inductor")
    theirs = run_transformers(hf, prompt, mode, 8, model.device, model.config.kv_bytes_per_token())
    assert theirs.tokens == ours.tokens, (theirs.tokens, ours.tokens)
