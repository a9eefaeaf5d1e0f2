"""`python -m kvlab loadtest`: the four clocks of any OpenAI-compatible server, measured at the client.

    python -m kvlab loadtest --url http://127.0.0.1:8000 --profile mixture --arrival poisson --rate 4 \\
        --num-requests 200 --json results/loadtest.json

Workload and arrival options as in `kvlab.workload` (or `--trace` to replay an Azure-format CSV or a Mooncake trace,
`kvlab.traces`); the run itself is `kvlab.http.loadgen.run_loadtest`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from kvlab.clocks import SLO, Summary
from kvlab.http.loadgen import PROMPT_FORMATS, LoadTestResult, http_workload, run_loadtest
from kvlab.traces import TRACE_FORMATS
from kvlab.workload import ARRIVALS, PROFILE_NAMES, Request
from kvlab.command_args import command_args


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload and arrival options shared by `loadtest` and other commands."""
    g = parser.add_argument_group("workload")
    g.add_argument("--profile", default="short_short", choices=PROFILE_NAMES)
    g.add_argument("--num-requests", type=int, default=100)
    g.add_argument("--arrival", default="poisson", choices=ARRIVALS)
    g.add_argument("--rate", type=float, default=None, help="requests/s (needed unless --arrival all_at_once)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma arrivals: 1 Poisson, <1 burstier")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--scale", type=float, default=1.0, help="multiply the profile's lengths")
    g.add_argument("--max-context", type=int, default=None, help="clip prompt + max_tokens to this")
    g.add_argument("--shared-prefix-tokens", type=int, default=0, help="a common system prompt of this length")
    g.add_argument("--trace", default=None, help="replay a trace instead of --profile: an Azure-format CSV or a "
                                                  "Mooncake JSON-lines trace (its shared prefixes stay shared)")
    g.add_argument("--trace-format", default=None, choices=TRACE_FORMATS, help="trace: default detected from the file")
    g.add_argument("--time-scale", type=float, default=1.0, help="trace: multiply arrival gaps")
    g.add_argument("--length-scale", type=float, default=1.0,
                   help="trace: divide prompt and output lengths (Mooncake: 1, 2, 4, 8, 16, ...)")


def workload_from_args(args: argparse.Namespace) -> tuple[list[Request], dict]:
    """(requests, settings) from `add_workload_arguments` options."""
    kw = dict(profile=args.profile, num_requests=args.num_requests, arrival=args.arrival, rate=args.rate,
              burstiness=args.burstiness, seed=args.seed, trace=args.trace, time_scale=args.time_scale,
              length_scale=args.length_scale, scale=args.scale, max_context=args.max_context,
              shared_prefix_tokens=args.shared_prefix_tokens, trace_format=getattr(args, "trace_format", None))
    return http_workload(**kw), {"workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in kw.items()}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab loadtest`."""
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to request (default: first of GET /v1/models)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions (text prompts)")
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=None,
                   help="completions: token id list (default) or text")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument("--deadline", type=float, default=None, help="whole-run deadline, seconds")
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--api-key", default=None,
                   help="sent as `Authorization: Bearer <key>` to a server run with --api-key "
                        "(default: $KVLAB_API_KEY)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos=true (vLLM and kvlab honour it)")
    p.add_argument("--slo-ttft", type=float, default=None, help="TTFT target (s) for goodput")
    p.add_argument("--slo-tpot", type=float, default=None, help="TPOT target (s) for goodput")
    p.add_argument("--json", default=None, help="write the summary here (.json)")
    p.add_argument("--csv", default=None, help="write one row per request here (.csv)")
    p.add_argument("--no-progress", action="store_true")
    add_workload_arguments(p)


def format_summary(result: LoadTestResult, summary: Summary) -> str:
    """A few lines a person reads after a run."""
    s = summary
    lines = [f"{s.sent} sent, {s.completed} completed, {s.failed} failed "
             f"{dict(sorted(s.failed_by_reason.items())) or ''} in {result.wall_s:.2f} s",
             f"output tokens counted from: {result.output_tokens_from}; "
             f"{s.output_tokens_per_s:.1f} output tok/s, {s.requests_per_s:.2f} req/s",
             s.latency_frame().to_string(float_format=lambda x: f"{x:.4f}")]
    delay = [r.clocks()["send_delay_s"] for r in result.records if r.extra.get("sent")]
    if delay:
        lines.append(f"send delay (client behind schedule): p50 {np.median(delay) * 1e3:.2f} ms, "
                     f"max {max(delay) * 1e3:.2f} ms")
    if s.slo is not None:
        lines.append(f"goodput {s.goodput_rps:.2f} req/s ({s.slo_share:.0%} of ended requests met {s.slo.targets()})")
    return "\n".join(lines)


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """`python -m kvlab loadtest ...` (parsed options, or a list of words to parse)."""
    args = command_args(args, "python -m kvlab loadtest", __doc__, add_arguments)
    requests, settings = workload_from_args(args)
    slo_targets = {k: v for k, v in (("ttft_s", args.slo_ttft), ("tpot_s", args.slo_tpot)) if v is not None}
    slo = SLO(**slo_targets) if slo_targets else None
    result = run_loadtest(args.url, requests, args.model, chat=args.chat, prompt_format=args.prompt_format,
                          timeout_s=args.timeout, deadline_s=args.deadline, max_connections=args.max_connections,
                          temperature=args.temperature, extra_body={"ignore_eos": True} if args.ignore_eos else None,
                          progress=False if args.no_progress else None, settings=settings, api_key=args.api_key)
    print(format_summary(result, result.summary(slo)))
    for path in (args.json, args.csv):
        if path:
            print(f"wrote {result.save(path, slo)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
