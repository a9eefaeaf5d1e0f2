"""The GPU checks' device, sizes and time budget, the ``record`` fixture, and the hooks that write the report.

Which device: $KVLAB_GPU_CHECK_DEVICE when set (``cpu`` runs every check at small sizes, to exercise the code
without a GPU), else CUDA when present; without either every test here skips with one line saying so.
Sizes: the CUDA sizes, or small ones (``quick``) on the CPU; $KVLAB_GPU_CHECK_QUICK=1/0 overrides.
Time: $KVLAB_GPU_CHECK_BUDGET_S seconds for the session (450 on CUDA, 240 quick); the compiles, ``bench decode``
and the claims get what is left, 150 s kept aside when other test files share the session (the device tests).
$KVLAB_GPU_CHECK_BIG=1 adds the hidden-2048 model to the cache checks on the CPU too (slow).

A test records each check with ``record(name, ok, expected, measured)`` (``ok`` None: SKIP, ``measured`` says
why) and ends with ``record.verdict()``: a FAIL fails the test with every failing check's expected beside
measured; a test whose checks all skipped is skipped. At the end of a session that ran tests from here, the
report goes to test-artifacts/gpu_check.json (or $KVLAB_GPU_CHECK_JSON) and gpu_check.md beside it, and to
$OUT as well when $OUT is set: every check, one line for each test that recorded none (skipped, or failed
before it measured), one line for the other tests of the session (the device tests), versions, device and
settings.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
import torch

from gpu.report import (Check, environment_facts, make_check, markdown_summary, output_paths, summarize_checks,
                        write_json)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLUGIN_NAME = "kvlab-gpu-check"


@dataclass
class GpuRun:
    """Where and how big the checks run, and the session's time budget."""

    device: torch.device | None  # None: no device here (``why_not`` says why); every check skips
    why_not: str
    quick: bool
    big: bool
    budget_s: float
    started: float = field(default_factory=time.perf_counter)
    reserve_s: float = 0.0  # kept for the other tests of the session (the device tests)

    @property
    def repeats(self) -> int:
        """Repeats of each cache run (the fastest is kept): 2 on CUDA, 1 on the CPU."""
        return 2 if self.device is not None and self.device.type == "cuda" else 1

    def left(self) -> float:
        """Seconds of the budget not yet spent, the other tests' share kept aside."""
        return self.budget_s - (time.perf_counter() - self.started) - self.reserve_s

    def settings(self) -> dict:
        return dict(device=str(self.device) if self.device is not None else "none", quick=self.quick, big=self.big,
                    budget_s=self.budget_s, reserve_s=self.reserve_s, repeats=self.repeats, dtype="float32",
                    greedy=True, KVLAB_TEST_DEVICE=os.environ.get("KVLAB_TEST_DEVICE"),
                    KVLAB_GPU_CHECK_DEVICE=os.environ.get("KVLAB_GPU_CHECK_DEVICE"))


def _flag(name: str) -> bool | None:
    value = os.environ.get(name)
    return None if value in (None, "") else value.lower() not in ("0", "false", "no")


def gpu_run_from_env() -> GpuRun:
    """$KVLAB_GPU_CHECK_DEVICE, else cuda if present, else no device (see the module docstring)."""
    asked = os.environ.get("KVLAB_GPU_CHECK_DEVICE") or None
    device, why_not = None, ""
    if asked is not None:
        device = torch.device(asked)
        if device.type == "cuda" and not torch.cuda.is_available():
            device, why_not = None, f"KVLAB_GPU_CHECK_DEVICE={asked} but CUDA is not available here"
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        why_not = (f"no CUDA here (torch {torch.__version__}"
                   + (", built without CUDA" if torch.version.cuda is None else ", no device visible")
                   + "); KVLAB_GPU_CHECK_DEVICE=cpu runs these checks on the CPU at small sizes")
    quick = _flag("KVLAB_GPU_CHECK_QUICK")
    if quick is None:
        quick = device is not None and device.type != "cuda"
    budget = os.environ.get("KVLAB_GPU_CHECK_BUDGET_S")
    budget_s = float(budget) if budget else 240.0 if quick else 450.0 if device is None or device.type == "cuda" \
        else 900.0
    return GpuRun(device, why_not, quick, bool(_flag("KVLAB_GPU_CHECK_BIG")), budget_s)


def _message(report) -> str:
    """One line: a skip's reason or a failure's error."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return crash.message.strip().splitlines()[0] if crash.message.strip() else ""
    lines = report.longreprtext.strip().splitlines()
    return lines[-1] if lines else ""


class GpuCheckReport:
    """A plugin for the whole session (so it also sees the device tests outside tests/gpu): gathers every
    test's outcome and every recorded check, and writes the report when the session ends."""

    def __init__(self, config):
        self.config = config
        self.run = gpu_run_from_env()
        self.checks: list[Check] = []
        self.measured: dict = {}  # what the tests keep beside their checks: rows, tables, settings
        self.tests: dict[str, dict] = {}  # nodeid -> outcome, seconds, message
        self.gpu_nodes: set[str] = set()
        self.other_files: set[str] = set()
        self.written: list[Path] = []
        self.text = ""

    def keep(self, key: str, value) -> None:
        """Keep a measurement in the report's JSON, under ``measured[key]``."""
        self.measured[key] = value

    def pytest_collection_finish(self, session):
        for item in session.items:
            if Path(item.path).resolve().is_relative_to(HERE):
                self.gpu_nodes.add(item.nodeid)
            else:
                self.other_files.add(Path(item.path).name)
        self.run.reserve_s = 150.0 if self.gpu_nodes and self.other_files else 0.0

    def pytest_runtest_logreport(self, report):
        t = self.tests.setdefault(report.nodeid, dict(outcome="passed", seconds=0.0, message=""))
        t["seconds"] += report.duration
        if report.failed:
            t["outcome"], t["message"] = "failed", _message(report)
        elif report.skipped and t["outcome"] == "passed":
            t["outcome"], t["message"] = "skipped", _message(report)
        if report.when == "teardown" and report.nodeid in self.gpu_nodes:
            self._close_gpu_test(report.nodeid, t)

    def _close_gpu_test(self, nodeid: str, t: dict) -> None:
        """A test that recorded no check gets one line; one that failed without a FAIL check, a FAIL for the error."""
        recorded = [c for c in self.checks if c.test == nodeid]
        name = nodeid.split("/")[-1]
        status = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[t["outcome"]]
        if not recorded or (status == "FAIL" and not any(c.status == "FAIL" for c in recorded)):
            self.checks.append(Check(f"{name} ran" if status == "FAIL" else name, status,
                                     "no error" if status == "FAIL" else "", t["message"], test=nodeid))

    def _device_tests_check(self) -> Check | None:
        """One line for the tests of the session outside tests/gpu: the device-parametrised tests."""
        others = {k: v for k, v in self.tests.items() if k not in self.gpu_nodes}
        if not others:
            return None
        count = {o: sum(v["outcome"] == o for v in others.values()) for o in ("passed", "failed", "skipped")}
        where = os.environ.get("KVLAB_TEST_DEVICE") or os.environ.get("KVLAB_DEVICE") or "cpu"
        failed = [k for k, v in others.items() if v["outcome"] == "failed"]
        measured = f"{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped"
        if failed:
            more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
            measured += "; failed: " + ", ".join(failed[:5]) + more
        elif not count["passed"]:
            measured += "; " + next((v["message"] for v in others.values() if v["message"]), "")
        ok = False if failed else True if count["passed"] else None
        return Check(f"pytest on {where} ({len(self.other_files)} files, KVLAB_TEST_DEVICE={where})",
                     make_check("", ok).status, "every test passes", measured, test="(device tests)")

    def pytest_sessionfinish(self, session, exitstatus):
        if not self.gpu_nodes:
            return  # no test of tests/gpu ran in this session: no report
        checks = list(self.checks)
        device_tests = self._device_tests_check()
        if device_tests is not None:
            checks.append(device_tests)
        sections: dict[str, float] = {}
        for nodeid, t in self.tests.items():
            if nodeid in self.gpu_nodes:
                stem = Path(nodeid.split("::")[0]).stem.removeprefix("test_")
                section = stem.split("_", 1)[1] if stem[:1].isdigit() else stem
            else:
                section = "device tests"
            sections[section] = sections.get(section, 0.0) + t["seconds"]
        env = {k: os.environ[k] for k in ("KVLAB_GPU_CHECK_DEVICE", "KVLAB_TEST_DEVICE", "KVLAB_DEVICE")
               if os.environ.get(k)}
        command = " ".join([*(f"{k}={v}" for k, v in env.items()), "python -m pytest",
                            shlex.join(self.config.invocation_params.args)])
        report = dict(env=environment_facts(self.run.device), settings=self.run.settings(), command=command,
                      note=(f"Nothing ran on a device: {self.run.why_not}." if self.run.device is None else ""),
                      seconds=time.perf_counter() - self.run.started, section_seconds=sections,
                      checks=[asdict(c) for c in checks], summary=summarize_checks(checks),
                      tests=self.tests, measured=self.measured, exit_status=int(exitstatus))
        self.text = markdown_summary(report, checks)
        for path in output_paths(os.environ.get("KVLAB_GPU_CHECK_JSON"), os.environ.get("OUT")):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, report)
            path.with_suffix(".md").write_text(self.text)
            self.written.append(path)

    def pytest_terminal_summary(self, terminalreporter):
        if self.written:
            terminalreporter.write_sep("-", "gpu_check")
            terminalreporter.write_line(self.text.splitlines()[0] + ": " + self.text.splitlines()[2])
            for path in self.written:
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                terminalreporter.write_line(f"wrote {shown} and {shown.with_suffix('.md')}")


def pytest_configure(config):
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(GpuCheckReport(config), PLUGIN_NAME)


@pytest.fixture(scope="session")
def gpu_report(pytestconfig) -> GpuCheckReport:
    """The session's report: ``gpu_report.keep(key, value)`` puts a measurement beside the checks in the JSON."""
    return pytestconfig.pluginmanager.get_plugin(PLUGIN_NAME)


@pytest.fixture(scope="package", autouse=True)
def gpu(gpu_report) -> GpuRun:
    """The device, the sizes and the budget of every check here; skips them all, with the reason, without a device.

    While the checks run, KVLAB_DEVICE names the device (the lessons' defaults, the claims' examples and the child
    processes follow it) and PYTHONPATH holds the checkout (the children import this kvlab, installed or not)."""
    run = gpu_report.run
    if run.device is None:
        pytest.skip(run.why_not)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_DEVICE", run.device.type)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if str(ROOT) not in sys.path:
            mp.syspath_prepend(str(ROOT))
        yield run


class Recorder:
    """``record(name, ok, expected, measured)``: one line of the report (ok True PASS, False FAIL, None SKIP);
    ``record.extend(checks)`` adds lines a verdict function made; ``record.verdict()`` ends the test."""

    def __init__(self, nodeid: str, report: GpuCheckReport):
        self.nodeid, self.report, self.checks = nodeid, report, []

    def __call__(self, name: str, ok: bool | None, expected="", measured="") -> Check:
        return self.extend([make_check(name, ok, expected, measured)])[0]

    def extend(self, checks: list[Check]) -> list[Check]:
        for c in checks:
            c.test = self.nodeid
            self.checks.append(c)
            self.report.checks.append(c)
        return checks

    def verdict(self) -> None:
        """Fail with every FAIL's expected and measured; skip when every check skipped; pass otherwise."""
        failed = [c for c in self.checks if c.status == "FAIL"]
        if failed:
            pytest.fail(f"{len(failed)} of {len(self.checks)} checks failed:\n" + "\n".join(
                f"  {c.name}: expected {c.expected}; measured {c.measured}" for c in failed), pytrace=False)
        if not self.checks:
            pytest.fail("the test recorded no check", pytrace=False)
        if all(c.status == "SKIP" for c in self.checks):
            reasons = list(dict.fromkeys(c.measured for c in self.checks))  # the same reason once
            pytest.skip(f"{reasons[0]} ({len(self.checks)} checks)" if len(reasons) == 1 else "; ".join(
                f"{c.name}: {c.measured}" for c in self.checks))


@pytest.fixture
def record(request, gpu_report) -> Recorder:
    """Records this test's checks in the report (see ``Recorder``)."""
    return Recorder(request.node.nodeid, gpu_report)
