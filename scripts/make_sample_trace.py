"""Write kvlab's sample traces, one per trace format, into kvlab/data/traces/: small, *synthetic* and seeded.

Neither is a slice of a public trace: kvlab makes them, so tests and notebooks can replay a trace
offline. The public traces they imitate are the Azure LLM inference trace 2023
(github.com/Azure/AzurePublicDataset) and Mooncake's traces (github.com/kvcache-ai/Mooncake);
data/README.md says where to put a downloaded one.

**azure_conv_sample.csv** (Azure LLM trace format: TIMESTAMP, ContextTokens, GeneratedTokens) follows
the shape of the public 2023 "conversation" trace (Azure/AzurePublicDataset, from the Splitwise
paper; 19,366 requests in one hour): about 5.5 requests/s, prompt median ~1,020 tokens (p99
~4,100), output median ~129 (p99 ~600). Lengths are lognormal with those medians and p99s; gaps
are Gamma-distributed with burstiness 0.5 (somewhat burstier than Poisson). No prefix sharing:
the format cannot say which prompts share one.

**mooncake_sample.jsonl** (Mooncake trace format, kvcache-ai/Mooncake FAST'25 release: timestamp
in ms, input_length, output_length, hash_ids of 512-token blocks) is made of *sessions* that share
prefixes the way production traffic does:

- chat sessions (60%): one of three system prompts (700-2,200 tokens, the shortest in most
  sessions; 10% of sessions have none), then turns. Each turn's prompt is the previous prompt,
  the model's answer and a new user message, so it extends the last one; a session ends after
  each turn with chance 0.35 (at most 8 turns), or when its context passes 14,000 tokens. User
  messages: median 400 tokens (p99 4,000); answers: median 350 (p99 1,500); 5-60 s between turns.
- agent sessions (15%): one of two long tool-description prompts (2,700 and 4,600 tokens), a
  task (median 200 tokens), then 2-8 steps, each appending a short tool call (the output, median
  60) and the tool's result (median 500), up to 14,000 tokens; 1-8 s between steps.
- one-off documents (25%): a single request about a pasted document (median 2,500 tokens, p99
  12,000), sharing nothing.

Sessions start as a Poisson process, so that requests arrive at about 3 per second; they start
five minutes before the trace does, so it opens on traffic in full swing (some conversations
already under way, their earlier turns not in the trace), as a window of production does. Block ids
are given by content, as Mooncake's are: blocks inside a system prompt get the same id in every
session using it; a session's later blocks get ids of their own, the same in each of its turns
while they are full; a partial last block gets a new id once it grows. Ids are numbered in order
of first appearance.

    python scripts/make_sample_trace.py [--format azure|mooncake|all] [--n N] [--seed 0] [--rate R] [--out PATH]

A bigger trace of the same kind, e.g. one hour of ~20,000 requests for timing the simulator:

    python scripts/make_sample_trace.py --format mooncake --n 20000 --rate 5.5 --out results/mooncake_20k.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

Z99 = 2.326  # standard normal 99th percentile: p99 = median * exp(Z99 * sigma)
START = pd.Timestamp("2023-11-16 18:00:00")
TRACES = Path(__file__).resolve().parent.parent / "kvlab" / "data" / "traces"
OUT = {"azure": TRACES / "azure_conv_sample.csv", "mooncake": TRACES / "mooncake_sample.jsonl"}
DEFAULT_N = {"azure": 200, "mooncake": 300}

BLOCK = 512  # tokens per hash id, as in the Mooncake traces
# system prompt: (tokens, share of sessions)
CHAT_SYSTEMS = {"assistant": (700, 0.6), "coder": (2_200, 0.15), "support": (1_200, 0.15), None: (0, 0.1)}
AGENT_SYSTEMS = {"tools": (4_600, 0.6), "search": (2_700, 0.4)}
MAX_CONTEXT = 14_000  # a session ends before its prompt passes this: at lengths / 16 all fit 1024 tokens
CHAT_END_P = 0.35  # chance a conversation ends after each turn
USER_TOKENS = (400, 4_000)  # median, p99
DOCUMENT_TOKENS = (2_500, 12_000)
SESSION_MIX = {"chat": 0.6, "agent": 0.15, "document": 0.25}
REQUESTS_PER_SESSION = 2.65  # the mean of the models below: 0.6 x 2.74 chat turns + 0.15 x 5.03 agent steps + 0.25
WARM_UP_S = 300.0


def lognormal_lengths(rng: np.random.Generator, n: int, median: float, p99: float) -> np.ndarray:
    sigma = math.log(p99 / median) / Z99
    return np.maximum(1, np.round(rng.lognormal(math.log(median), sigma, size=n))).astype(int)


# -- Azure format ---------------------------------------------------------------------------------
def make_trace(n: int = 200, seed: int = 0, rate: float = 5.5, burstiness: float = 0.5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    stamps = START + pd.to_timedelta(np.cumsum(gaps), unit="s")
    return pd.DataFrame({
        # Azure writes 7 fractional digits: 2023-11-16 18:15:46.6805900
        "TIMESTAMP": [t.strftime("%Y-%m-%d %H:%M:%S.%f") + "0" for t in stamps],
        "ContextTokens": lognormal_lengths(rng, n, median=1020, p99=4100),
        "GeneratedTokens": lognormal_lengths(rng, n, median=129, p99=600),
    })


# -- Mooncake format --------------------------------------------------------------------------------
def _chat_session(rng: np.random.Generator, start_s: float) -> tuple[str | None, list[tuple[float, int, int]]]:
    """(system prompt, [(arrival s, prompt tokens, output tokens)]) of one chat session."""
    names = list(CHAT_SYSTEMS)
    system = names[rng.choice(len(names), p=[w for _, w in CHAT_SYSTEMS.values()])]
    context, t, turns = CHAT_SYSTEMS[system][0], start_s, []
    for _ in range(min(8, int(rng.geometric(CHAT_END_P)))):
        context += int(lognormal_lengths(rng, 1, *USER_TOKENS)[0])  # the user's message
        if context > MAX_CONTEXT:
            break
        answer = int(lognormal_lengths(rng, 1, 350, 1_500)[0])
        turns.append((t, context, answer))
        context += answer  # the next prompt carries the answer
        t += float(rng.uniform(5, 60))
    return system, turns


def _agent_session(rng: np.random.Generator, start_s: float) -> tuple[str, list[tuple[float, int, int]]]:
    names = list(AGENT_SYSTEMS)
    system = names[rng.choice(len(names), p=[w for _, w in AGENT_SYSTEMS.values()])]
    context = AGENT_SYSTEMS[system][0] + int(lognormal_lengths(rng, 1, 200, 1_500)[0])  # tools + the task
    t, steps = start_s, []
    for _ in range(int(rng.integers(2, 9))):
        if context > MAX_CONTEXT:
            break
        call = int(lognormal_lengths(rng, 1, 60, 300)[0])
        steps.append((t, context, call))
        context += call + int(lognormal_lengths(rng, 1, 500, 4_000)[0])  # the call and the tool's result
        t += float(rng.uniform(1, 8))
    return system, steps


def block_ids(requests: list[tuple[float, int, int, str | None, int, int]]) -> list[list[int]]:
    """Mooncake-style hash_ids by content, numbered in order of first appearance.

    A prompt is its system prompt's tokens, then its session's (append-only) tokens. A block lying
    inside the system prompt is keyed by (system, index): shared by every session using it; any
    other block by (session, index, length): shared by the session's turns while it is full.
    """
    ids: dict[tuple, int] = {}
    out = []
    for _, prompt, _, system, system_tokens, session in requests:
        row = []
        for j in range(-(-prompt // BLOCK)):
            end = min(prompt, (j + 1) * BLOCK)
            key = ("system", system, j) if end <= system_tokens else ("session", session, j, end - j * BLOCK)
            row.append(ids.setdefault(key, len(ids)))
        out.append(row)
    return out


def _document_request(rng: np.random.Generator, start_s: float) -> tuple[None, list[tuple[float, int, int]]]:
    """A one-off question about a pasted document: no system prompt, nothing shared."""
    prompt = min(MAX_CONTEXT, int(lognormal_lengths(rng, 1, *DOCUMENT_TOKENS)[0]))
    return None, [(start_s, prompt, int(lognormal_lengths(rng, 1, 350, 1_500)[0]))]


SESSIONS = {"chat": (_chat_session, CHAT_SYSTEMS), "agent": (_agent_session, AGENT_SYSTEMS),
            "document": (_document_request, {None: (0, 1.0)})}


def make_mooncake_trace(n: int = 300, seed: int = 0, rate: float = 3.0) -> list[dict]:
    """The first ``n`` requests (by arrival) of seeded chat and agent sessions, as Mooncake trace lines."""
    rng = np.random.default_rng(seed)
    requests, t, session = [], -WARM_UP_S, 0
    session_rate = rate / REQUESTS_PER_SESSION
    # Sessions start WARM_UP_S before the trace does, so it opens on traffic in full swing (some
    # conversations already under way, their earlier turns not in the trace), as a production window does.
    while len(requests) < 2 * n + WARM_UP_S * rate:  # enough sessions that the first n requests are all there
        t += float(rng.exponential(1.0 / session_rate))
        make, systems = SESSIONS[str(rng.choice(list(SESSION_MIX), p=list(SESSION_MIX.values())))]
        system, turns = make(rng, t)
        tokens = systems[system][0]
        requests += [(at, p, o, system, tokens, session) for at, p, o in turns]
        session += 1
    requests = sorted((r for r in requests if r[0] >= 0), key=lambda r: r[0])[:n]
    t0 = requests[0][0]
    return [{"timestamp": int(round((at - t0) * 1000)), "input_length": p, "output_length": o, "hash_ids": h}
            for (at, p, o, *_), h in zip(requests, block_ids(requests))]


def write_mooncake(lines: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("azure", "mooncake", "all"), default="all")
    ap.add_argument("--n", type=int, default=None, help="requests (default: 200 azure, 300 mooncake)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=None, help="requests/s (default: 5.5 azure, 3 mooncake)")
    ap.add_argument("--out", type=Path, default=None, help="where to write (only with one --format)")
    args = ap.parse_args()
    formats = ["azure", "mooncake"] if args.format == "all" else [args.format]
    if args.out is not None and len(formats) > 1:
        ap.error("--out needs one --format (azure or mooncake)")
    for fmt in formats:
        out = args.out or OUT[fmt]
        out.parent.mkdir(parents=True, exist_ok=True)
        n = args.n or DEFAULT_N[fmt]
        if fmt == "azure":
            trace = make_trace(n, args.seed, **({"rate": args.rate} if args.rate else {}))
            trace.to_csv(out, index=False)
            summary = trace[["ContextTokens", "GeneratedTokens"]]
        else:
            lines = make_mooncake_trace(n, args.seed, **({"rate": args.rate} if args.rate else {}))
            write_mooncake(lines, out)
            summary = pd.DataFrame(lines)[["input_length", "output_length"]]
        print(f"wrote {out} ({n} requests, {out.stat().st_size} bytes)")
        print(summary.describe(percentiles=[0.5, 0.99]).round(0).to_string())


if __name__ == "__main__":
    main()
