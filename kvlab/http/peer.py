"""Two real engines on loopback: kvlab serve and `transformers serve --continuous-batching`, on one checkpoint folder.

`transformers serve` is transformers' own OpenAI-compatible server. With `--continuous-batching`
it schedules requests step by step over a paged KV cache (`model.init_continuous_batching`),
as kvlab's engine does; it needs FastAPI, uvicorn, openai and `accelerate` (it loads the model
with `device_map`). `kvlab_server(folder)` and `transformers_server(folder)` describe the two
as `LoopbackServer`s with the same knobs where both engines have them: KV block size, number
of KV blocks, tokens per step, device, and torch threads (pinned through `OMP_NUM_THREADS` and
kvlab's `--threads`). Each runs in a subprocess on 127.0.0.1, offline (`HF_HUB_OFFLINE=1`), and
is waited for at `/health`; when it fails to start, the error quotes the end of its log.

What differs on the wire, and how the load client copes:

- transformers takes text prompts only (`prompt_format="text"`);
- it refuses fields it does not know with 422, `ignore_eos` among them; the same effect is
  `generation_config` with `eos_token_id: -1` (its continuous batching then never stops early),
  which `LoopbackServer.extra_body` sends;
- it answers to the folder's path as the model name (`LoopbackServer.model`).

`transformers_serve_available()` says in one line whether this machine can run it at all.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvlab.http.local import LOOPBACK, ServerProcess
from kvlab.allocator import DEFAULT_ALLOCATOR, Allocator, check_allocator
from kvlab.serving.compiled_decode import COMPILE_SIZES
from kvlab.serving.config import SERVE_SPEC, EngineSpec, engine_args
from kvlab.threads import LESSON_THREADS

TRANSFORMERS_CLI = "transformers.cli.transformers"  # `python -m` this = the `transformers` command
NEEDED = ("accelerate", "fastapi", "uvicorn", "openai", "pydantic")  # what `transformers serve` imports
NUM_BLOCKS = 512  # the peers' KV pool: room for 16 sequences of 512 tokens in SERVE_SPEC's blocks of 16
PEER_SPEC = SERVE_SPEC.replace(max_waiting=4096)  # kvlab serve as a peer: a queue no sweep fills
# kvlab serve at its best, as bench serve and 09's three engines run it beside vLLM: its decode step compiled per batch
# size at start, its decodes read in the pool, its prompt-chunk steps compiled for any token count (the three levers
# bench serve measures on and off). Not the lessons' two
# engines: a learner's first start would compile and build for two minutes.
BEST_SPEC = PEER_SPEC.replace(compile_sizes=COMPILE_SIZES, attention="in_place", compile_mixed=True)
IGNORE_EOS: dict[str, dict[str, Any]] = {"kvlab serve": {"ignore_eos": True},
                                         "transformers serve": {"generation_config": json.dumps({"eos_token_id": -1})}}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers_serve_available() -> tuple[bool, str]:
    """(can `transformers serve --continuous-batching` run here?, one line saying why or why not)."""
    version = _version("transformers")
    if version is None or importlib.util.find_spec("transformers") is None:
        return False, "transformers is not installed: pip install transformers"
    spec = importlib.util.find_spec("transformers.cli.serve")
    source = Path(spec.origin).read_text() if spec is not None and spec.origin else ""
    if ("continuous_batching" not in source or "cb_num_blocks" not in source
            or importlib.util.find_spec("transformers.cli.serving.completion") is None):
        return False, (f"transformers {version} has no `transformers serve --continuous-batching` with "
                       "/v1/completions and --cb-* options; upgrade it (pip install -U transformers; 5.24 is tested)")
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        return False, (f"transformers serve needs {', '.join(missing)}, not installed here: "
                       "pip install 'kvlab[serve]' (or pip install " + " ".join(missing) + ")")
    return True, f"transformers {version}: transformers serve --continuous-batching is available"


def child_env(threads: int | None) -> dict:
    """The environment of a server subprocess: offline, no update check, `threads` torch threads."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


@dataclass
class LoopbackServer:
    """One engine's server as a subprocess on loopback; a context manager.

    `args` follow `python -m` (host and port are appended); `model` is the name it answers to;
    `extra_body` is merged into every request so that answers run to `max_tokens`; `settings`
    and `version` go into results.
    """

    name: str
    args: list[str]
    model: str
    extra_body: dict
    settings: dict
    version: str | None
    threads: int | None = LESSON_THREADS
    start_timeout_s: float = 120.0  # until /health answers (a server that compiles at start needs longer)
    log_path: Path | None = None
    process: ServerProcess | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started; call start() first")
        return self.process.url

    @property
    def cmd(self) -> list[str]:
        return self.process.cmd if self.process is not None else [sys.executable, "-m", *self.args]

    def log_tail(self, lines: int = 15) -> str:
        """The end of the server's own output (what it said before failing)."""
        if self.log_path is None or not Path(self.log_path).exists():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def start(self, timeout_s: float | None = None) -> "LoopbackServer":
        if self.log_path is None:
            fd, path = tempfile.mkstemp(prefix=self.name.replace(" ", "-") + "-", suffix=".log")
            os.close(fd)
            self.log_path = Path(path)
        self.process = ServerProcess(self.args, host=LOOPBACK, log_path=self.log_path, env=child_env(self.threads))
        try:
            self.process.start(timeout_s=self.start_timeout_s if timeout_s is None else timeout_s)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{self.name} did not start ({e}); the end of its log:\n{self.log_tail()}") from None
        return self

    def stop(self) -> int | None:
        """Stop the subprocess (SIGTERM, then SIGKILL); its exit code, or None if it never started."""
        return self.process.stop() if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.process is not None and self.process.process.poll() is None

    def describe(self) -> dict:
        """Name, version, command and settings, for a results file."""
        return {"engine": self.name, "version": self.version, "command": " ".join(["python", "-m", *self.args]),
                "threads": self.threads, **self.settings}

    def __enter__(self) -> "LoopbackServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _check_sizes(num_blocks: int, threads: int | None) -> None:
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks={num_blocks!r} must be an integer >= 1")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads={threads!r} must be an integer >= 1, or None for torch's default")


def _folder(folder: str | Path) -> Path:
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no config.json: give a checkpoint folder "
                                "(kvlab.http.shared_checkpoint.save_shared_checkpoint writes one)")
    return folder.resolve()


def kvlab_server(folder: str | Path, spec: EngineSpec = PEER_SPEC, *, num_blocks: int = NUM_BLOCKS,
                 device: str = "cpu", threads: int | None = LESSON_THREADS, engine_in_thread: bool = False,
                 allocator: Allocator = DEFAULT_ALLOCATOR) -> LoopbackServer:
    """`python -m kvlab serve --model folder` running `spec` (its options, `engine_args`), with its KV pool sized to
    `num_blocks` blocks (its engine in a process of its own, or with `engine_in_thread` in a thread of the
    server's; `allocator`: `serve --allocator`, kvlab.allocator). A spec that compiles or builds the in-place kernel
    gets longer to start (its first start on a machine compiles for a minute or two)."""
    from kvlab.cache.base import kv_cache_bytes  # the one KV formula, to size --kv-budget-mb to whole blocks
    from kvlab.version import __version__

    _check_sizes(num_blocks, threads)
    check_allocator(allocator)
    folder = _folder(folder)
    config = json.loads((folder / "config.json").read_text())
    layers, kv_heads = config["num_hidden_layers"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    spec = spec.replace(kv_budget_bytes=num_blocks * kv_cache_bytes(layers, kv_heads, head_dim, spec.block_size))
    args = ["kvlab", "serve", "--model", str(folder), "--served-model-name", str(folder), "--device", device,
            *engine_args(spec), "--allocator", allocator, "--log-level", "warning"]
    if threads is not None:
        args += ["--threads", str(threads)]
    if engine_in_thread:
        args.append("--engine-in-thread")
    sched = spec.scheduler
    settings = {"block_size": spec.block_size, "num_blocks": num_blocks, "max_batch_tokens": sched.max_batch_tokens,
                "max_seqs": sched.max_seqs, "max_waiting": sched.max_waiting, "device": device,
                "prefix_caching": spec.enable_prefix_caching, "chunked_prefill": sched.chunked_prefill,
                "scheduling": f"{sched.policy}, {sched.priority.replace('_', ' ')}",
                "engine": "in a thread of the server" if engine_in_thread else "in its own process",
                "allocator": allocator, "compile_sizes": list(spec.compile_sizes), "attention": spec.attention,
                "compile_mixed": spec.compile_mixed}
    builds = spec.compile_sizes or spec.attention == "in_place" or spec.compile_mixed
    return LoopbackServer("kvlab serve", args, str(folder), dict(IGNORE_EOS["kvlab serve"]), settings,
                          __version__, threads, start_timeout_s=300.0 if builds else 120.0)


def transformers_server(folder: str | Path, spec: EngineSpec = PEER_SPEC, *, num_blocks: int = NUM_BLOCKS,
                        device: str = "cpu", threads: int | None = LESSON_THREADS) -> LoopbackServer:
    """`transformers serve --continuous-batching folder` with `spec`'s block size and tokens per step, and
    `num_blocks` blocks: the KV blocks and steps of kvlab serve's.

    `--cb-num-blocks` matters on a CPU: without it transformers sizes its paged cache from the
    memory it finds free, gigabytes for a model of a few megabytes. Raises RuntimeError with
    `transformers_serve_available()`'s line when it cannot run here.
    """
    ok, why = transformers_serve_available()
    if not ok:
        raise RuntimeError(why)
    _check_sizes(num_blocks, threads)
    folder = _folder(folder)
    block_size, max_batch_tokens = spec.block_size, spec.scheduler.max_batch_tokens
    args = [TRANSFORMERS_CLI, "serve", "--continuous-batching", "--device", device, "--dtype", "float32",
            "--cb-block-size", str(block_size), "--cb-num-blocks", str(num_blocks),
            "--cb-max-batch-tokens", str(max_batch_tokens), "--log-level", "warning", str(folder)]
    settings = {"block_size": block_size, "num_blocks": num_blocks, "max_batch_tokens": max_batch_tokens,
                "device": device, "continuous_batching": True, "attention": "paged (transformers' default)"}
    return LoopbackServer("transformers serve", args, str(folder), dict(IGNORE_EOS["transformers serve"]), settings,
                          _version("transformers"), threads)


def _proc_stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds used, threads) of a live process, from Linux's /proc; None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, int(fields[17])  # ppid, utime+stime, threads


def process_usage(pid: int) -> dict | None:
    """What a server's process tree (the process `pid` and its descendants) holds and has used: processes, OS
    threads, CPU seconds so far and the cores it may run on. None where /proc is missing (not Linux) or it is gone."""
    if not Path("/proc/self/stat").exists() or _proc_stat(pid) is None:
        return None
    stats = {int(p.name): _proc_stat(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    tree, grew = {pid}, True
    while grew:
        more = {p for p, st in stats.items() if st is not None and st[0] in tree} - tree
        tree |= more
        grew = bool(more)
    cores: set[int] = set()
    for p in tree:
        try:
            cores |= os.sched_getaffinity(p)
        except OSError:
            pass
    live = [st for p in tree if (st := stats.get(p)) is not None]
    return {"processes": len(live), "threads": sum(st[2] for st in live),
            "cpu_s": round(sum(st[1] for st in live), 2), "cores_allowed": len(cores)}


def greedy_answer(server: LoopbackServer, prompt: str, max_tokens: int = 16, timeout_s: float = 60.0) -> str:
    """The server's greedy (temperature 0) completion of `prompt`, `max_tokens` tokens, not streamed."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": False,
            **server.extra_body}
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=timeout_s, trust_env=False)
    if resp.status_code != 200:
        raise RuntimeError(f"{server.name} answered HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()["choices"][0]["text"]


__all__ = ["BEST_SPEC", "IGNORE_EOS", "LoopbackServer", "NUM_BLOCKS", "PEER_SPEC", "child_env", "greedy_answer",
           "kvlab_server", "process_usage", "transformers_server", "transformers_serve_available"]
