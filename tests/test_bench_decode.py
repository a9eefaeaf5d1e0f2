"""The decode benchmark runs end to end on a tiny model and writes the JSON it promises (schema, not speed)."""
from __future__ import annotations

import json
import math

import pytest

import kvlab
from kvlab.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "decode.json"
    status = main(["bench", "decode", "--config", "tiny", "--prompt", "12", "--new", "6", "--repeats", "1",
                   "--threads", "1", "--bandwidth-mb", "8", "--json", str(path)])
    assert status == 0
    return json.loads(path.read_text())


def test_every_kvlab_cache_and_transformers_has_a_row(report):
    rows = {(r["impl"], r["cache"]) for r in report["results"]}
    assert {("kvlab", name) for name in kvlab.CACHE_NAMES} <= rows
    assert {("transformers", name) for name in ("dynamic", "static", "quantized", "offloaded")} <= rows
    assert {r["impl"] for r in report["results"]} == {"kvlab", "transformers"}


def test_measured_rows_carry_the_promised_fields(report):
    ok = [r for r in report["results"] if r["status"] == "ok"]
    assert {(r["impl"], r["cache"]) for r in ok} >= {("kvlab", "dynamic"), ("kvlab", "static"), ("kvlab", "none"),
                                                     ("transformers", "dynamic"), ("transformers", "static")}
    for r in ok:
        assert r["tokens_per_s"] > 0 and r["prefill_ms"] > 0 and r["achieved_GBps"] > 0
        assert set(r["ms_per_token"]) == {"1", "5"}  # positions past --new are dropped, the last one kept
        assert all(v > 0 for v in r["ms_per_token"].values())
        assert isinstance(r["cache_bytes"], int) and r["cache_bytes"] >= 0
        assert r["cold"]["tokens_per_s"] > 0 and len(r["runs_tokens_per_s"]) == 1
        assert r["timing"]
    by = {(r["impl"], r["cache"]): r for r in ok}
    # the formula: tiny-llama holds 2 x 2 layers x 2 kv heads x 16 x 4 bytes = 512 bytes per token
    assert by[("kvlab", "dynamic")]["cache_bytes"] == 512 * (12 + 6 - 1)
    assert by[("kvlab", "static")]["cache_bytes"] == 512 * (12 + 6)
    assert by[("kvlab", "none")]["cache_bytes"] == 0
    assert by[("transformers", "dynamic")]["cache_bytes"] == 512 * (12 + 6 - 1)


def test_rows_that_cannot_run_say_why(report):
    for r in report["results"]:
        assert r["status"] in ("ok", "unavailable", "error")
        if r["status"] != "ok":
            assert r["reason"], r
    assert not [r for r in report["results"] if r["status"] == "error"]


def test_environment_settings_and_summary(report):
    env = report["env"]
    assert {"versions", "device", "device_used", "threads", "model_config", "cpu_count"} <= set(env)
    assert env["threads"] == 1 and env["model_config"]["name"] == "tiny-llama"
    assert {"torch", "transformers", "kvlab"} <= set(env["versions"])
    assert report["settings"]["prompt_tokens"] == 12 and report["settings"]["new_tokens"] == 6
    assert math.isfinite(report["summary"]["ratio_dynamic_tokens_per_s"])
    bw = report["machine_bandwidth"]
    assert bw["sum_read_GBps"] > 0 and bw["copy_GBps"] > 0 and bw["matvec_GBps"] > 0


def test_bad_benchmark_settings_are_refused_before_running():
    with pytest.raises(SystemExit, match=r"unknown cache\(s\) \['paged'\] in --caches"):
        main(["bench", "decode", "--config", "tiny", "--caches", "dynamic,paged"])
    with pytest.raises(SystemExit, match=r"--prompt 1000 \+ --new 128 exceeds the tiny-llama context of 1024"):
        main(["bench", "decode", "--config", "tiny", "--prompt", "1000"])
