"""The GPU check's report: one PASS/FAIL/SKIP line per check, the verdict rules, and the JSON and Markdown files.

Pure functions over measured numbers, so ``tests/test_gpu_check.py`` can check every rule on fake numbers in the
default tier, before a GPU is ever lent. The measurements themselves are in ``tests/gpu/test_*.py``; the hooks that
gather the lines and write ``test-artifacts/gpu_check.json`` and ``gpu_check.md`` are in ``tests/gpu/conftest.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

import kvlab
from kvlab.results_io import write_json  # noqa: F401  (strict JSON: NaN and inf as null; the report is written so)

ROOT = Path(__file__).resolve().parents[2]  # the checkout

# mode name -> (cache strategy, options): every cache the GPU check runs
MODES: dict[str, tuple[str, dict]] = {
    "none": ("none", {}),
    "dynamic": ("dynamic", {}),
    "static": ("static", {}),
    "quantized-8": ("quantized", dict(bits=8, residual=64)),
    "quantized-4": ("quantized", dict(bits=4, residual=64)),
    "quantized-2": ("quantized", dict(bits=2, residual=64)),
    "offloaded-prefetch": ("offloaded", dict(prefetch=True)),
    "offloaded-sync": ("offloaded", dict(prefetch=False)),
}
EXACT_MODES = ("none", "static", "offloaded-prefetch", "offloaded-sync")  # same tokens as dynamic, in any dtype


# --- checks: what was expected, what was measured, and the verdict --------------------------------

@dataclass
class Check:
    """One line of the report: PASS, FAIL or SKIP (not applicable here, or out of time), with the numbers."""

    name: str
    status: str  # "PASS" | "FAIL" | "SKIP"
    expected: str = ""
    measured: str = ""
    test: str = ""  # the pytest node that recorded it


def make_check(name: str, ok: bool | None, expected: str = "", measured: str = "") -> Check:
    """``ok`` True -> PASS, False -> FAIL, None -> SKIP (then ``measured`` says why)."""
    return Check(name, "SKIP" if ok is None else "PASS" if ok else "FAIL", str(expected), str(measured))


def summarize_checks(checks: list[Check]) -> dict:
    """Counts per status; ``ok`` when nothing failed and something passed (an empty run proves nothing)."""
    counts = {status: sum(c.status == status for c in checks) for status in ("PASS", "FAIL", "SKIP")}
    return dict(passed=counts["PASS"], failed=counts["FAIL"], skipped=counts["SKIP"], total=len(checks),
                ok=counts["FAIL"] == 0 and counts["PASS"] > 0,
                failed_names=[c.name for c in checks if c.status == "FAIL"])


def tier_facts(tier) -> dict:
    """What the offloaded tier is, read off the tensor itself: pinned or not, and the bytes its storage holds."""
    return dict(pinned=bool(tier.is_pinned()), storage_bytes=int(tier.untyped_storage().nbytes()),
                device=str(tier.device))


def pinned_tier_verdict(facts: dict, offloaded_bytes: int, expect_pinned: bool) -> tuple[bool, str, str]:
    """Does the offloaded tier hold what the cache reports? -> (ok, expected, measured).

    The tier (``tier_facts``) must be pinned exactly when the cache runs on CUDA (page-locked host
    memory the GPU copies from without staging), live on the host, and its storage must hold exactly
    the ``offloaded_bytes`` the cache reports. The pinned host allocator's counter
    (``torch.cuda.host_memory_stats()["active_bytes.current"]``) cannot decide this: a freed pinned
    block waits on the allocator's event list and is subtracted only at the next pinned allocation,
    so the next cache reuses that block and shows 0 extra pinned bytes, and the fastest repeat,
    usually that one, is the one kept.
    """
    ok = (facts["pinned"] == expect_pinned and facts["storage_bytes"] == offloaded_bytes
          and str(facts.get("device", "cpu")).startswith("cpu"))
    expected = f"{'pinned' if expect_pinned else 'not pinned'} host tensor of {offloaded_bytes} B"
    measured = (f"{'pinned' if facts['pinned'] else 'not pinned'} {facts.get('device', 'cpu')} tensor of "
                f"{facts['storage_bytes']} B")
    return ok, expected, measured


def markdown_summary(report: dict, checks: list[Check]) -> str:
    """The short human-readable report: where it ran, each check with expected and measured side by side.

    The verdict is PASS (nothing failed, something passed), FAIL (something failed) or SKIP (nothing ran here,
    e.g. no CUDA: then ``report["note"]`` says why)."""
    env, settings, summary = report.get("env", {}), report.get("settings", {}), summarize_checks(checks)
    verdict = "PASS" if summary["ok"] else "FAIL" if summary["failed"] or summary["passed"] else "SKIP"
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"# gpu_check: {verdict}", "",
             f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped of "
             f"{summary['total']} checks in {report.get('seconds', float('nan')):.0f} s on "
             f"{settings.get('device', '?')} ({env.get('device_name', '?')}); torch {env.get('torch', '?')}, "
             f"CUDA {env.get('cuda')}, kvlab {env.get('kvlab', '?')}; quick={settings.get('quick')}, "
             f"budget {settings.get('budget_s', float('nan')):.0f} s.", ""]
    if report.get("note"):
        lines += [str(report["note"]), ""]
    if report.get("command"):
        lines += [f"Command: `{report['command']}`", ""]
    seconds = report.get("section_seconds", {})
    if seconds:
        lines += ["Sections (s): " + ", ".join(f"{name} {s:.0f}" for name, s in seconds.items()), ""]
    lines += ["| status | check | expected | measured |", "|---|---|---|---|"]
    order = {"FAIL": 0, "SKIP": 1, "PASS": 2}
    for c in sorted(checks, key=lambda c: order[c.status]):  # failures first, otherwise in run order
        lines.append(f"| {c.status} | {cell(c.name)} | {cell(c.expected)} | {cell(c.measured)} |")
    return "\n".join(lines) + "\n"


def output_paths(json_arg: str | None, out_env: str | None) -> list[Path]:
    """Where the JSON goes: ``json_arg`` ($KVLAB_GPU_CHECK_JSON: a file, or a folder for gpu_check.json) or
    test-artifacts/, and $OUT too; the Markdown summary goes beside each, as gpu_check.md."""
    main = Path(json_arg) if json_arg else ROOT / "test-artifacts"
    paths = [main if main.suffix == ".json" else main / "gpu_check.json"]
    if out_env:
        extra = Path(out_env) / "gpu_check.json"
        if extra.resolve() != paths[0].resolve():
            paths.append(extra)
    return paths


def environment_facts(device: torch.device | None) -> dict:
    """Versions and the machine, for the report: kvlab's environment() plus torch, CUDA and the device's name."""
    try:
        from kvlab.env import environment
        env = environment()
    except Exception as e:  # the environment helper is optional here
        env = {"error": repr(e)}
    env.update(torch=torch.__version__, cuda=torch.version.cuda, kvlab=kvlab.__version__,
               threads=torch.get_num_threads(),
               device_name=(torch.cuda.get_device_name(device) if device is not None and device.type == "cuda"
                            else "cpu" if device is not None else "none"))
    return env


# --- the verdicts of the sections that measure a whole dict at once -------------------------------

def half_precision_checks(half: dict) -> list[Check]:
    """Exact caches equal the same dtype's dynamic cache; logits near fp32's; the cache half the bytes;
    a loaded checkpoint in half precision no further from fp32 than transformers' own (within 2x)."""
    checks = []
    for name, row in half["dtypes"].items():
        if not row["supported"]:
            checks.append(make_check(f"{name}: build_model and every cache", None, "runs where supported",
                                     f"not supported here: {row['reason']}"))
            continue
        failed = {m: r["error"] for m, r in row["modes"].items() if "error" in r}
        checks.append(make_check(f"{name} {half['model']}: every cache mode generates", not failed,
                                 f"{len(MODES)} modes", f"{len(MODES) - len(failed)} ran"
                                 + (f"; {failed}" if failed else "")))
        exact = {m: row["modes"][m].get("equal_half_dynamic") for m in EXACT_MODES if m in row["modes"]}
        checks.append(make_check(f"{name} {half['model']}: exact caches' tokens == {name} dynamic's",
                                 all(exact.values()), "all True", exact))
        agreement = {m: round(r["agreement_with_fp32"], 2) for m, r in row["modes"].items() if "error" not in r}
        checks.append(make_check(f"{name} {half['model']}: teacher-forced top-1 == fp32's", row["top1_vs_fp32"] >= 0.9,
                                 ">= 0.90", f"{row['top1_vs_fp32']:.3f} (greedy agreement with fp32 per mode: "
                                 f"{agreement})"))
        checks.append(make_check(f"{name} {half['model']}: max |logit - fp32 logit|",
                                 row["max_abs_logit_diff"] <= row["tolerance"],
                                 f"<= {row['tolerance']:.2e} (4 eps x max |logit| {row['max_abs_logit']:.2f})",
                                 f"{row['max_abs_logit_diff']:.2e}"))
        checks.append(make_check(f"{name}: dynamic cache bytes == fp32's / 2", 2 * row["cache_bytes"]
                                 == half["fp32_cache_bytes"], f"{half['fp32_cache_bytes'] // 2} B",
                                 f"{row['cache_bytes']} B"))
    for r in half["checkpoints"]:
        label = f"{r['dtype']} checkpoint {r['family']}"
        if "error" in r:
            checks.append(make_check(f"{label}: from_pretrained(dtype=...) vs transformers", False, "runs", r["error"]))
            continue
        checks.append(make_check(f"{label}: kvlab's |logit - fp32| <= 2 x transformers' in {r['dtype']}",
                                 r["kvlab_vs_fp32"] <= 2 * r["transformers_vs_fp32"] and
                                 r["model_dtype"] == f"torch.{r['dtype']}",
                                 f"<= {2 * r['transformers_vs_fp32']:.2e}, weights torch.{r['dtype']}",
                                 f"{r['kvlab_vs_fp32']:.2e} ({r['model_dtype']}; vs transformers "
                                 f"{r['kvlab_vs_transformers']:.2e}, top-1 {r['top1_vs_transformers']:.2f})"))
    return checks


def compiled_step_checks(compiled: dict, device: torch.device) -> list[Check]:
    """The compiled step's tokens equal dynamic's on the device; reduce-overhead's step is a captured CUDA graph.

    ``compiled`` maps a label ("default", "reduce-overhead") to the child's answer (``status``: "compiled",
    "timeout", "failed" or "not applicable"). A compile that ran out of time is a SKIP, not a FAIL."""
    checks = []
    for label, r in compiled.items():
        name = f"compiled step ({label})"
        if r["status"] in ("not applicable", "timeout"):
            checks.append(make_check(f"{name}: tokens == dynamic's", None, "compiled, same tokens",
                                     f"{r['status']}: {r['message']}"))
            continue
        if r["status"] != "compiled":
            checks.append(make_check(f"{name}: tokens == dynamic's", False, "compiled, same tokens", r["message"]))
            continue
        on = str(r.get("device", "?"))
        checks.append(make_check(f"{name}: tokens == dynamic's on {device.type}",
                                 r.get("same_tokens") is True and on.startswith(device.type),
                                 f"same tokens, on {device.type}",
                                 f"same_tokens={r.get('same_tokens')} on {on}; compile {r.get('compile_s', 0):.1f} s, "
                                 f"eager/compiled {r.get('speedup', float('nan')):.2f}x, "
                                 f"cuda_graph={r['cuda_graph']!r}"))
        if label == "reduce-overhead":
            graph = r["cuda_graph"]
            checks.append(make_check(f"{name}: the step replays a CUDA graph", None if graph is None else
                                     graph == "captured", "cuda_graph == 'captured'",
                                     "compiled_decode reports no cuda_graph field" if graph is None else repr(graph)))
    return checks


def http_checks(http: dict, device: torch.device) -> list[Check]:
    """Every request of the load client completed with the tokens it asked for; greedy text == generate's."""
    return [
        make_check(f"serve --device {device.type}: every request completed", http["completed"] == http["requests"]
                   and http["failed"] == 0, f"{http['requests']} completed, 0 failed",
                   f"{http['completed']} completed, {http['failed']} failed"
                   + (f" {http['failed_by_reason']}" if http["failed_by_reason"] else "") + "; "
                   f"{http['output_tokens_per_s']:.0f} output tok/s, server up in {http['startup_s']:.1f} s"),
        make_check(f"serve --device {device.type}: output tokens == max_tokens asked (ignore_eos)",
                   http["output_tokens"] == http["expected_output_tokens"],
                   f"{http['expected_output_tokens']} tokens", f"{http['output_tokens']} tokens "
                   f"(counted from {http['output_tokens_from']})"),
        make_check(f"serve --device {device.type}: greedy completion == generate's on {device.type}",
                   http["greedy_text"] == http["generate_text"], repr(http["generate_text"]),
                   repr(http["greedy_text"])),
    ]


def bench_decode_checks(bench: dict, device: torch.device) -> list[Check]:
    """``bench decode`` ran on the device and wrote its JSON; every kvlab cache ran; exact caches agree."""
    checks = [make_check(f"bench decode on {device.type}: ran and wrote its JSON",
                         bench.get("returncode") == 0 and "rows" in bench and
                         str(bench.get("device_used", "")).startswith(device.type),
                         f"exit 0, device_used {device.type}",
                         f"exit {bench.get('returncode')}, device_used {bench.get('device_used')}"
                         + (f"; {bench['error']}" if "error" in bench else ""))]
    if "rows" not in bench:
        return checks
    rows = {f"{r['impl']}/{r['cache']}": r for r in bench["rows"] if not r["compiled"]}
    kvlab_rows = {k: r for k, r in rows.items() if r["impl"] == "kvlab"}
    broken = {k: r["reason"] for k, r in kvlab_rows.items() if r["status"] != "ok"}
    checks.append(make_check(f"bench decode on {device.type}: every kvlab cache ran", not broken,
                             f"{len(kvlab_rows)} ok", f"{len(kvlab_rows) - len(broken)} ok" + (f"; {broken}" if broken
                                                                                              else "")))
    exact = {k: r["same_tokens_as_kvlab_dynamic"] for k, r in rows.items()
             if r["status"] == "ok" and k in ("kvlab/none", "kvlab/static", "kvlab/offloaded")}
    # transformers' rows are shown, not checked: their parity on the device is the checkpoints' (with an attention
    # mask); bench decode's own generate call passes pad_token_id=0 and no mask, so a prompt holding token 0
    # differs there for a reason that is not the device's
    theirs = {k: r["same_tokens_as_kvlab_dynamic"] for k, r in rows.items() if r["impl"] == "transformers"
              and r["status"] == "ok"}
    speed = ", ".join(f"{k} {r['tokens_per_s']:.0f} tok/s" for k, r in rows.items() if r["status"] == "ok")
    checks.append(make_check(f"bench decode on {device.type}: exact kvlab caches' tokens == kvlab dynamic's",
                             bool(exact) and all(exact.values()), "all True",
                             f"{exact}; transformers rows, information: {theirs}; {speed}"))
    return checks


def batch_scaling_checks(scaling: dict, device: torch.device) -> list[Check]:
    """Notebook 05 on the device: per-sequence decode time at the largest batch < half of batch 1's; a batched
    prefill gives every first token sooner than one by one (both on the wall clock)."""
    per_seq, first = scaling["per_seq_ms"], scaling["all_first_ms"]
    big = max(per_seq)
    return [
        make_check(f"batch_scaling on {device.type}: per-sequence decode time at batch {big} < half of batch 1's "
                   "(wall clock)", per_seq[big] < per_seq[1] / 2, f"< {per_seq[1] / 2:.3f} ms",
                   f"{per_seq[big]:.3f} ms (step {scaling['step_ms'][1]:.2f} ms at batch 1, "
                   f"{scaling['step_ms'][big]:.2f} ms at batch {big})"),
        make_check(f"batch_scaling on {device.type}: a batched prefill gives every first token sooner (wall clock)",
                   first["batched"] < first["one by one"], f"< {first['one by one']:.2f} ms (one by one)",
                   f"{first['batched']:.2f} ms batched"),
    ]
