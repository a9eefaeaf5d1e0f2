"""Write data/traces/azure_conv_sample.csv: a small *synthetic* trace in the Azure LLM trace format.

It is not a slice of the public Azure trace: kvlab makes it, seeded, so tests
and notebooks can replay a trace offline. Its shape follows the public 2023
"conversation" trace (shared/reference/traces.md): about 5.5 requests/s,
prompt median ~1,020 tokens (p99 ~4,100), output median ~129 (p99 ~600).
Lengths are lognormal with those medians and p99s; gaps are Gamma-distributed
with burstiness 0.5 (somewhat burstier than Poisson).

    python scripts/make_sample_trace.py [--n 200] [--seed 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

Z99 = 2.326  # standard normal 99th percentile: p99 = median * exp(Z99 * sigma)
START = pd.Timestamp("2023-11-16 18:00:00")


def lognormal_lengths(rng: np.random.Generator, n: int, median: float, p99: float) -> np.ndarray:
    sigma = math.log(p99 / median) / Z99
    return np.maximum(1, np.round(rng.lognormal(math.log(median), sigma, size=n))).astype(int)


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


def main() -> None:
    default_out = Path(__file__).resolve().parent.parent / "data" / "traces" / "azure_conv_sample.csv"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=default_out)
    args = ap.parse_args()
    trace = make_trace(args.n, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trace.to_csv(args.out, index=False)
    print(f"wrote {args.out} ({len(trace)} requests, {args.out.stat().st_size} bytes)")
    print(trace[["ContextTokens", "GeneratedTokens"]].describe(percentiles=[0.5, 0.99]).round(0).to_string())


if __name__ == "__main__":
    main()
