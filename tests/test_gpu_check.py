"""The GPU check's decisions, on fake numbers: the pinned tier's verdict, PASS/FAIL/SKIP and the summaries.

The checks themselves are tests/gpu/ (``python -m pytest -m gpu tests/gpu`` on a lent GPU, or with
KVLAB_GPU_CHECK_DEVICE=cpu here, in minutes); these tests check only the pure functions of tests/gpu/report.py
that turn its measurements into verdicts, so a wrong rule is caught before a GPU is ever lent.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gpu
import gpu.report


@pytest.fixture(scope="module")
def gpu_check():
    """The report helpers (tests/gpu/report.py)."""
    return gpu.report


def fake_tier(pinned: bool, nbytes: int, device: str = "cpu"):
    """What ``tier_facts`` reads off a tensor: ``is_pinned()``, its storage's bytes and its device."""
    return SimpleNamespace(is_pinned=lambda: pinned, untyped_storage=lambda: SimpleNamespace(nbytes=lambda: nbytes),
                           device=torch.device(device))


TIER = 8 * 2**20  # the offloaded bytes the cache reports


def test_a_reused_pinned_block_passes_where_the_allocator_delta_failed(gpu_check):
    """The second repeat's tier reuses the first one's freed pinned block: the host allocator shows 0 extra
    bytes. The old rule (tier <= delta <= 2 x tier) said FAIL; the tier's own tensor says it is all there."""
    allocator_delta = 0  # active_bytes.current after - before, on the repeat that reused the block
    old_rule = TIER <= allocator_delta <= 2 * TIER
    assert old_rule is False
    facts = gpu_check.tier_facts(fake_tier(pinned=True, nbytes=TIER))
    ok, expected, measured = gpu_check.pinned_tier_verdict(facts, TIER, expect_pinned=True)
    assert ok, (expected, measured)
    assert expected == f"pinned host tensor of {TIER} B" and measured == f"pinned cpu tensor of {TIER} B"


@pytest.mark.parametrize("pinned,nbytes,device,why", [
    (False, TIER, "cpu", "pageable memory: the GPU would stage every copy"),
    (True, TIER // 2, "cpu", "the storage holds less than the cache reports"),
    (True, 2 * TIER, "cpu", "the storage holds more than the cache reports"),
    (True, TIER, "cuda:0", "a tier on the GPU is no offloading"),
])
def test_the_tier_fails_when_it_is_not_what_the_cache_reports(gpu_check, pinned, nbytes, device, why):
    facts = dict(pinned=pinned, storage_bytes=nbytes, device=device)
    ok, _, measured = gpu_check.pinned_tier_verdict(facts, TIER, expect_pinned=True)
    assert not ok, why
    assert str(nbytes) in measured


def test_on_cpu_the_tier_is_an_unpinned_file_of_the_reported_size(gpu_check):
    import kvlab

    cache = kvlab.make_cache("offloaded", kvlab.tiny_llama(), max_len=32)
    try:
        facts = gpu_check.tier_facts(cache.tier)
        assert facts == dict(pinned=False, storage_bytes=cache.memory().offloaded_bytes, device="cpu")
        assert gpu_check.pinned_tier_verdict(facts, cache.memory().offloaded_bytes, expect_pinned=False)[0]
        assert not gpu_check.pinned_tier_verdict(facts, cache.memory().offloaded_bytes, expect_pinned=True)[0]
    finally:
        cache.close()


def test_ok_none_and_false_are_pass_skip_and_fail(gpu_check):
    statuses = [gpu_check.make_check("x", ok).status for ok in (True, None, False)]
    assert statuses == ["PASS", "SKIP", "FAIL"]


def test_the_summary_fails_on_one_failure_and_not_on_skips(gpu_check):
    make = gpu_check.make_check
    passing = [make("a", True), make("reduce-overhead on cpu", None, measured="not applicable")]
    assert gpu_check.summarize_checks(passing) == dict(passed=1, failed=0, skipped=1, total=2, ok=True,
                                                       failed_names=[])
    failing = passing + [make("pinned tier", False, "8 B", "0 B")]
    summary = gpu_check.summarize_checks(failing)
    assert not summary["ok"] and summary["failed"] == 1 and summary["failed_names"] == ["pinned tier"]


def test_a_run_with_nothing_passed_is_not_a_pass(gpu_check):
    assert not gpu_check.summarize_checks([])["ok"]
    assert not gpu_check.summarize_checks([gpu_check.make_check("all skipped", None)])["ok"]


def test_the_markdown_puts_failures_first_with_expected_beside_measured(gpu_check):
    make = gpu_check.make_check
    checks = [make("tokens == dynamic", True, "same tokens", "agreement 1.00"),
              make("pinned | tier", False, "pinned host tensor of 8 B", "not pinned cpu tensor of 8 B"),
              make("cuda graph", None, "captured", "not applicable on cpu")]
    report = dict(env=dict(device_name="cpu", torch="2.x", kvlab="0.1.0", cuda=None),
                  settings=dict(device="cpu", quick=True, budget_s=120.0), seconds=61.0,
                  section_seconds={"caches": 3.0, "http serve": 15.2})
    text = gpu_check.markdown_summary(report, checks)
    lines = text.splitlines()
    assert lines[0] == "# gpu_check: FAIL"
    assert "1 passed, 1 failed, 1 skipped of 3 checks in 61 s on cpu" in text
    assert "caches 3, http serve 15" in text
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| status")]
    assert [r.split(" | ")[0] for r in rows] == ["| FAIL", "| SKIP", "| PASS"]
    assert rows[0] == "| FAIL | pinned \\| tier | pinned host tensor of 8 B | not pinned cpu tensor of 8 B |"
    passing = gpu_check.markdown_summary(report, [checks[0]])
    assert passing.startswith("# gpu_check: PASS")


def test_the_report_goes_to_test_artifacts_and_to_out_as_well(gpu_check, tmp_path):
    root = gpu_check.ROOT
    assert gpu_check.output_paths(None, None) == [root / "test-artifacts" / "gpu_check.json"]
    assert gpu_check.output_paths(None, str(tmp_path)) == [root / "test-artifacts" / "gpu_check.json",
                                                           tmp_path / "gpu_check.json"]
    assert gpu_check.output_paths(str(tmp_path / "mine.json"), None) == [tmp_path / "mine.json"]
    assert gpu_check.output_paths(str(tmp_path), str(tmp_path)) == [tmp_path / "gpu_check.json"]  # not twice


def test_half_precision_verdicts_on_fake_numbers(gpu_check):
    modes = {m: dict(tokens=[1, 2], agreement_with_fp32=1.0, equal_half_dynamic=True) for m in gpu_check.MODES}
    row = dict(supported=True, model_dtype="torch.bfloat16", top1_vs_fp32=0.95, max_abs_logit_diff=0.02,
               max_abs_logit=2.0, tolerance=0.0625, cache_bytes=500, modes=modes)
    half = dict(model="llama-30m", fp32_cache_bytes=1000,
                dtypes={"bfloat16": row, "float16": dict(supported=False, reason="no fp16 here")},
                checkpoints=[dict(family="llama", dtype="bfloat16", model_dtype="torch.bfloat16", kvlab_vs_fp32=0.17,
                                  transformers_vs_fp32=0.20, kvlab_vs_transformers=0.15, top1_vs_transformers=0.95)])
    statuses = {c.name: c.status for c in gpu_check.half_precision_checks(half)}
    assert statuses["float16: build_model and every cache"] == "SKIP"
    assert set(statuses.values()) == {"PASS", "SKIP"}, statuses
    modes["static"]["equal_half_dynamic"] = False  # an exact cache that drifts from dynamic in bf16
    half["checkpoints"][0]["kvlab_vs_fp32"] = 0.5  # further from fp32 than 2x transformers' own error
    failed = [c.name for c in gpu_check.half_precision_checks(half) if c.status == "FAIL"]
    assert failed == ["bfloat16 llama-30m: exact caches' tokens == bfloat16 dynamic's",
                      "bfloat16 checkpoint llama: kvlab's |logit - fp32| <= 2 x transformers' in bfloat16"]


def test_reduce_overhead_needs_a_captured_cuda_graph(gpu_check):
    device = torch.device("cuda")
    base = dict(status="compiled", message="ok", same_tokens=True, device="cuda:0", compile_s=20.0, speedup=3.0)
    checks = gpu_check.compiled_step_checks({"reduce-overhead": dict(base, cuda_graph="captured")}, device)
    assert [c.status for c in checks] == ["PASS", "PASS"]
    checks = gpu_check.compiled_step_checks({"reduce-overhead": dict(base, cuda_graph="skipped: cpu tensors")}, device)
    assert [c.status for c in checks] == ["PASS", "FAIL"]
    checks = gpu_check.compiled_step_checks({"reduce-overhead": dict(base, cuda_graph=None)}, device)
    assert [c.status for c in checks] == ["PASS", "SKIP"]  # a kvlab that does not report it yet
    timeout = dict(status="timeout", message="did not finish within 30 s", cuda_graph=None)
    assert [c.status for c in gpu_check.compiled_step_checks({"default": timeout}, device)] == ["SKIP"]
    failed = dict(status="failed", message="no triton", cuda_graph=None)
    assert [c.status for c in gpu_check.compiled_step_checks({"default": failed}, device)] == ["FAIL"]


def test_a_server_that_drops_a_request_fails(gpu_check):
    http = dict(requests=8, completed=8, failed=0, failed_by_reason={}, output_tokens=193, expected_output_tokens=193,
                output_tokens_from="usage", output_tokens_per_s=400.0, startup_s=9.0, greedy_text="7997",
                generate_text="7997")
    device = torch.device("cpu")
    assert [c.status for c in gpu_check.http_checks(http, device)] == ["PASS"] * 3
    dropped = dict(http, completed=7, failed=1, failed_by_reason={"timeout": 1}, output_tokens=170)
    assert [c.status for c in gpu_check.http_checks(dropped, device)] == ["FAIL", "FAIL", "PASS"]


def test_the_report_is_strict_json(gpu_check, tmp_path):
    """NaN (a clock with no samples) is written as null, so any JSON reader takes the report."""
    checks = [gpu_check.make_check("x", True)]
    report = dict(checks=[vars(c) for c in checks], summary=gpu_check.summarize_checks(checks), latency=float("nan"))
    path = gpu_check.write_json(tmp_path / "gpu_check.json", report)
    assert json.loads(Path(path).read_text())["latency"] is None


def test_a_run_where_nothing_ran_says_skip_and_why(gpu_check):
    """No CUDA here: every check skipped. The report is neither PASS nor FAIL, and says why."""
    checks = [gpu_check.make_check("test_1_caches.py::test_x", None, measured="no CUDA here")]
    report = dict(env=dict(device_name="none"), settings=dict(device="none", quick=False, budget_s=450.0),
                  seconds=1.0, note="Nothing ran on a device: no CUDA here.")
    text = gpu_check.markdown_summary(report, checks)
    assert text.startswith("# gpu_check: SKIP\n")
    assert "Nothing ran on a device: no CUDA here." in text
    assert not gpu_check.summarize_checks(checks)["ok"]


def test_the_documented_command_names_every_device_test_and_they_exist():
    """tests/gpu/__init__.py's one command lists exactly DEVICE_TESTS, and README.md beside it shows the same."""
    root = Path(__file__).resolve().parent.parent
    for text in (gpu.__doc__, (root / "tests" / "gpu" / "README.md").read_text()):
        command = text[text.index("KVLAB_TEST_DEVICE=cuda"):].split("\n\n")[0]
        assert re.findall(r"tests/test_\w+\.py", command) == gpu.DEVICE_TESTS
    assert all((root / path).is_file() for path in gpu.DEVICE_TESTS)
