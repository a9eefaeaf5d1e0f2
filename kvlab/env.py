"""The machine a result was measured on: versions, CPU, threads, device.

Every saved benchmark or experiment result carries `environment()` next to its numbers, so a figure can be read against
the hardware and software that produced it (tiny-llm does the same for its benchmark JSON).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import sys

from kvlab.version import __version__

_PACKAGES = ("kvlab", "torch", "transformers", "numpy", "pandas")


def package_version(name: str) -> str | None:
    """Installed version of `name`, or None when it is not installed.

    kvlab's own version is the running package's (`kvlab/version.py`), not the
    installed metadata's, which an editable install can leave behind.
    """
    if name == "kvlab":
        return __version__
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_info() -> dict:
    """Threads and accelerator as torch sees them; empty if torch is absent."""
    try:
        import torch
    except Exception:
        return {}
    info: dict = {"torch_threads": torch.get_num_threads(), "cuda_device": None}
    try:  # a broken CUDA set-up is reported, not raised: the setup cell must still say where it runs
        if torch.cuda.is_available():
            info["cuda_device"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = torch.version.cuda
    except Exception as exc:
        info["cuda_error"] = f"{type(exc).__name__}: {exc}"
    return info


def environment() -> dict:
    """Describe this machine and its software as a JSON-friendly dict.

    Keys: `timestamp` (UTC, ISO 8601), `python`, `platform`, `machine`, `cpu`, `cpu_count`, `versions` ({package:
    version or None} for kvlab, torch, transformers, numpy, pandas), and, when torch is installed, `torch_threads` and
    `cuda_device` (None on a CPU-only machine). `device` is the device name a learner would quote: the CUDA GPU's name
    if there is one, else the CPU's.
    """
    env = {"timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
           "cpu": cpu_name(), "cpu_count": os.cpu_count(),
           "versions": {name: package_version(name) for name in _PACKAGES}, **_torch_info()}
    return {**env, "device": env.get("cuda_device") or env["cpu"]}
