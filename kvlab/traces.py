"""Trace files: the Azure and Mooncake request-trace formats, and replaying a trace's shared prefixes as token ids.

Two public formats (a downloaded trace goes in data/traces/; data/README.md says where to get one):

- **Azure** LLM inference trace 2023 (github.com/Azure/AzurePublicDataset, from the Splitwise paper; a "code" and a
  "conversation" file, one hour each): CSV with TIMESTAMP, ContextTokens, GeneratedTokens. Lengths and arrivals only;
  ``read_trace`` / ``replay_trace`` read it, and prompts get random token ids, so no two prompts share a prefix.
- **Mooncake** (github.com/kvcache-ai/Mooncake, FAST'25): JSON lines
  ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``. ``hash_ids[i]`` names the i-th block
  of 512 prompt tokens (the last block may be partial, so there are ceil(input_length / 512) ids); equal ids mean the
  same block after the same prefix. That is what a prefix cache reuses: system prompts, earlier turns, tool lists.

``replay_mooncake`` turns every request into prompt token ids that share exactly what the trace shares. The block with
id ``h`` is always the same tokens; different ids are different tokens *by construction*, not by luck: a block's first
tokens spell ``h`` in base ``vocab_size``. So the engine's prefix cache (chained block hashes,
``kvlab.serving.block_manager``) sees what production saw. Length scaling keeps the sharing: dividing lengths by
``length_scale`` divides the 512-token block by the same factor, so block i of a scaled prompt is still block i of the
original (``length_scale`` must divide the block size: 1, 2, 4, 8, 16, ...).

    frame = mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=16)   # the trace as replayed: one row a request
    requests = trace_requests(frame, vocab_size=4096)                # the same, as token ids
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.data import MOONCAKE_SAMPLE_TRACE as MOONCAKE_SAMPLE_FILE, SAMPLE_TRACE as SAMPLE_TRACE_FILE, data_path, \
    missing_message
from kvlab.workload import Request, _check_optional_int, _check_positive, _fit

SAMPLE_TRACE = data_path(SAMPLE_TRACE_FILE)  # kvlab/data/traces/azure_conv_sample.csv, shipped inside the package
MOONCAKE_SAMPLE_TRACE = data_path(MOONCAKE_SAMPLE_FILE)  # kvlab/data/traces/, shipped inside the package
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SAMPLE_TRACES = {"azure": SAMPLE_TRACE, "mooncake": MOONCAKE_SAMPLE_TRACE}
TRACE_FORMATS = tuple(SAMPLE_TRACES)
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in the published Mooncake traces
_EXAMPLE = '{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}'


# -- which format ------------------------------------------------------------------------------
def detect_format(path: str | Path) -> str:
    """"mooncake" for JSON lines, "azure" for CSV: by the file's first non-empty line (its suffix if empty)."""
    path = _existing(path)
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return "mooncake" if line.lstrip().startswith("{") else "azure"
    if path.suffix in (".jsonl", ".json"):
        return "mooncake"
    if path.suffix == ".csv":
        return "azure"
    raise ValueError(f"trace {path.name} is empty, so its format cannot be told; give trace_format= one of "
                     f"{', '.join(TRACE_FORMATS)}")


def _existing(path: str | Path, fix: str = f"a trace there, or use one of kvlab.traces.SAMPLE_TRACES "
                                          f"({', '.join(TRACE_FORMATS)})") -> Path:
    """The path of a file that exists; a missing shipped sample says how to get it back, any other the ``fix``."""
    path = Path(path)
    samples = {MOONCAKE_SAMPLE_TRACE: MOONCAKE_SAMPLE_FILE, SAMPLE_TRACE: SAMPLE_TRACE_FILE}
    if path in samples and not path.is_file():
        raise FileNotFoundError(missing_message(samples[path]))
    if not path.is_file():
        raise ValueError(f"trace file {str(path)!r} does not exist; download {fix}")
    return path


# -- reading an Azure trace -----------------------------------------------------------------------
def read_trace(path: str | Path) -> pd.DataFrame:
    """Read an Azure LLM trace CSV into columns arrival_s, prompt_tokens, output_tokens.

    `TIMESTAMP` is a date-time (sub-second precision) or plain seconds;
    arrivals are made relative to the first (earliest) request, rows sorted by time.
    """
    path = _existing(path, "an Azure LLM trace CSV there, or use kvlab.traces.SAMPLE_TRACE")
    try:
        df = pd.read_csv(path, skipinitialspace=True, comment="#")
    except pd.errors.EmptyDataError:
        raise ValueError(f"trace {path.name} is empty; it needs a header {','.join(AZURE_COLUMNS)} "
                         "and one row per request") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in AZURE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"trace {path.name} lacks column(s) {missing}; the Azure format needs "
                         f"{list(AZURE_COLUMNS)}, found {list(df.columns)}")
    if df.empty:
        raise ValueError(f"trace {path.name} has a header but no requests")
    stamps = df["TIMESTAMP"]
    if pd.api.types.is_numeric_dtype(stamps):
        seconds = stamps.astype(float)
    else:
        try:
            t = pd.to_datetime(stamps, format="ISO8601")
        except (ValueError, TypeError) as e:
            raise ValueError(f"trace {path.name}: TIMESTAMP values must be date-times like "
                             f"'2023-11-16 18:15:46.6805900' or seconds ({e})") from None
        seconds = (t - t.min()).dt.total_seconds()
    for c in ("ContextTokens", "GeneratedTokens"):
        if not pd.api.types.is_numeric_dtype(df[c]) or df[c].isna().any() or (df[c] < 0).any():
            raise ValueError(f"trace {path.name}: column {c} must hold token counts >= 0")
    if seconds.isna().any():
        raise ValueError(f"trace {path.name}: TIMESTAMP has empty values")
    out = pd.DataFrame({"arrival_s": seconds - seconds.min(), "prompt_tokens": df["ContextTokens"].astype(int),
                        "output_tokens": df["GeneratedTokens"].astype(int)})
    return out.sort_values("arrival_s", kind="stable").reset_index(drop=True)


# -- reading a Mooncake trace ---------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_mooncake_trace(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> pd.DataFrame:
    """A Mooncake trace as columns arrival_s, prompt_tokens, output_tokens, hash_ids (a tuple per request).

    Arrivals are seconds after the first request. Every line is checked; an error names the line,
    the bad value and the fix: a line that is not a JSON object, a missing field, a negative or
    non-integer length, a timestamp earlier than the line before (the format lists requests in
    arrival order), a hash_ids list whose length is not ceil(input_length / block_tokens).
    """
    path = _existing(path)
    if not _is_int(block_tokens) or block_tokens < 1:
        raise ValueError(f"block_tokens={block_tokens!r}: need the trace's tokens per hash id, an integer >= 1 "
                         f"(the published Mooncake traces use {MOONCAKE_BLOCK_TOKENS})")
    rows: list[tuple] = []  # (timestamp in ms, prompt tokens, output tokens, hash ids)
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"trace {path.name}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} is not JSON ({e.msg}); a Mooncake trace has one JSON object per line, "
                                 f"like {_EXAMPLE}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where} holds {type(row).__name__} {line.strip()[:40]!r}, not an object; "
                                 f"each line is one request, like {_EXAMPLE}")
            missing = [k for k in MOONCAKE_FIELDS if k not in row]
            if missing:
                raise ValueError(f"{where} lacks {', '.join(missing)}; every line needs {', '.join(MOONCAKE_FIELDS)} "
                                 f"(timestamp in ms), like {_EXAMPLE}")
            t, n_in, n_out, h = (row[k] for k in MOONCAKE_FIELDS)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise ValueError(f"{where}: timestamp {t!r} must be a number of milliseconds >= 0")
            if rows and t < rows[-1][0]:
                raise ValueError(f"{where}: timestamp {t} ms is earlier than the line before ({rows[-1][0]} ms); "
                                 "requests must be listed in arrival order: sort the lines by timestamp")
            if not _is_int(n_in) or n_in < 1:
                raise ValueError(f"{where}: input_length {n_in!r} must be an integer >= 1 (prompt tokens)")
            if not _is_int(n_out) or n_out < 0:
                raise ValueError(f"{where}: output_length {n_out!r} must be an integer >= 0 (output tokens)")
            if not isinstance(h, list) or not all(_is_int(x) and x >= 0 for x in h):
                raise ValueError(f"{where}: hash_ids must be a list of integers >= 0, one per block of "
                                 f"{block_tokens} prompt tokens, got {str(h)[:60]}")
            expected = -(-n_in // block_tokens)
            if len(h) != expected:
                raise ValueError(f"{where}: input_length {n_in} needs ceil({n_in}/{block_tokens}) = {expected} "
                                 f"hash_ids, found {len(h)}; fix the line, or pass block_tokens= if this trace's "
                                 f"blocks are not {block_tokens} tokens")
            rows.append((t, n_in, n_out, tuple(h)))
    if not rows:
        raise ValueError(f"trace {path.name} has no requests; a Mooncake trace has one JSON object per line, "
                         f"like {_EXAMPLE}")
    ms = np.asarray([r[0] for r in rows], dtype=float)
    return pd.DataFrame({"arrival_s": (ms - ms[0]) / 1000.0, "prompt_tokens": [r[1] for r in rows],
                         "output_tokens": [r[2] for r in rows], "hash_ids": [r[3] for r in rows]})


def scaled_block_tokens(length_scale: float, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """The trace's block after dividing lengths by ``length_scale`` (which must divide it exactly)."""
    _check_positive("length_scale", length_scale)
    b = block_tokens / length_scale
    if b < 1 or b != int(b):
        divisors = [d for d in range(1, block_tokens + 1) if block_tokens % d == 0]
        raise ValueError(f"length_scale={length_scale} does not divide the trace's {block_tokens}-token blocks, so "
                         f"scaled prompts could not keep the trace's block sharing; use one of {divisors}")
    return int(b)


def mooncake_frame(path: str | Path = MOONCAKE_SAMPLE_TRACE, time_scale: float = 1.0, length_scale: float = 1.0,
                   max_requests: int | None = None, max_context: int | None = None,
                   block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> pd.DataFrame:
    """The Mooncake trace at ``path`` as it will be replayed: one row per request, scaled and clipped.

    Columns: request_id, arrival_s (gaps multiplied by ``time_scale``), prompt_tokens (divided by
    ``length_scale``, rounded up so a partial last block keeps at least one token), output_tokens
    (divided, rounded, at least 1), hash_ids (one per block of ``block_tokens``), block_tokens
    (512 / length_scale) and clipped (True where ``max_context`` cut the prompt: its trailing
    blocks are dropped, the output length is kept, as in ``replay_trace``).
    """
    _check_positive("time_scale", time_scale)
    _check_optional_int("max_requests", max_requests, 1)
    _check_optional_int("max_context", max_context, 2)
    b = scaled_block_tokens(length_scale, block_tokens)
    trace = read_mooncake_trace(path, block_tokens)
    if max_requests is not None:
        trace = trace.head(max_requests)
    rows = []
    for i, r in enumerate(trace.itertuples(index=False)):
        p = math.ceil(r.prompt_tokens / length_scale)  # = (blocks - 1) * b + ceil(last block / length_scale)
        o = max(1, round(r.output_tokens / length_scale))
        p_fit, o = _fit(p, o, max_context)
        rows.append((i, float(r.arrival_s) * time_scale, p_fit, o, r.hash_ids[:-(-p_fit // b)], b, p_fit < p))
    return pd.DataFrame(rows, columns=["request_id", "arrival_s", "prompt_tokens", "output_tokens", "hash_ids",
                                       "block_tokens", "clipped"])


# -- blocks as token ids -----------------------------------------------------------------------------
def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: scrambles uint64s so neighbouring inputs give unrelated outputs."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def id_digits(max_id: int, vocab_size: int) -> int:
    """How many base-``vocab_size`` digits spell every id up to ``max_id`` (at least 1)."""
    digits, reach = 1, vocab_size
    while reach <= max_id:
        digits, reach = digits + 1, reach * vocab_size
    return digits


def block_token_ids(hash_ids, block_tokens: int, vocab_size: int, digits: int, seed: int = 0) -> np.ndarray:
    """The tokens of each block: (len(hash_ids), block_tokens) ids in [0, vocab_size).

    Tokens 0..digits-1 spell the id in base ``vocab_size`` (least significant first), so two
    different ids differ there; the rest are a seeded hash of (id, position). Equal ids, equal rows.
    """
    h = np.asarray(hash_ids, dtype=np.uint64)[:, None]  # (n, 1)
    pos = np.arange(block_tokens, dtype=np.uint64)[None, :]  # (1, b)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        x = h * np.uint64(0x9E3779B97F4A7C15) + pos * np.uint64(0xD1B54A32D192ED03) + np.uint64(seed)
        tokens = _mix(_mix(x)) % np.uint64(vocab_size)  # (n, b)
    spell = min(digits, block_tokens)
    tokens[:, :spell] = (h // np.uint64(vocab_size) ** np.arange(spell, dtype=np.uint64)) % np.uint64(vocab_size)
    return tokens.astype(np.int64)


def trace_requests(frame: pd.DataFrame, vocab_size: int = 256, seed: int = 0,
                   profile: str = "mooncake") -> list[Request]:
    """Requests of a ``mooncake_frame`` with prompt token ids that share exactly what its hash_ids share.

    Request i's prompt is the token blocks of its hash_ids (``block_token_ids``), joined and cut to
    ``prompt_tokens``. Ids are in [0, ``vocab_size``): use the model's vocabulary size. Raises if a
    block is too short to spell every id of the trace (lower length_scale or raise vocab_size).
    """
    _check_optional_int("vocab_size", vocab_size, 2)
    if frame.empty:
        raise ValueError("the trace frame has no requests")
    b = int(frame["block_tokens"].iloc[0])
    max_id = max((max(h) for h in frame["hash_ids"] if h), default=0)
    digits = id_digits(max_id, vocab_size)
    if digits > b:
        raise ValueError(f"a block of {b} tokens cannot spell {max_id + 1} different ids in base {vocab_size} "
                         f"(that needs {digits} tokens), so different blocks could look the same; lower "
                         "length_scale or raise vocab_size")
    return [Request(int(r.request_id), int(r.prompt_tokens), int(r.output_tokens), float(r.arrival_s), profile,
                    block_token_ids(r.hash_ids, b, vocab_size, digits, seed).reshape(-1)[:r.prompt_tokens].tolist())
            for r in frame.itertuples(index=False)]


# -- replay: a trace file -> requests ------------------------------------------------------------------
def replay_trace(path: str | Path = SAMPLE_TRACE, time_scale: float = 1.0, length_scale: float = 1.0,
                 max_requests: int | None = None, vocab_size: int | None = None, max_context: int | None = None,
                 seed: int = 0, trace_format: str | None = None,
                 block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[Request]:
    """Requests from a trace of either format, scaled to fit a small model (``trace_format`` None: ``detect_format``).

    - `time_scale`: arrival gaps are *multiplied* by it (2.0 plays the trace at half its request rate).
    - `length_scale`: prompt and output lengths are *divided* by it (rounded, at least 1 token). Quote both factors
      next to every result.
    - `max_requests`: keep only the first requests (by arrival).
    - `vocab_size`, `max_context`, `seed`: as in `make_workload`.

    Azure traces get random prompt ids (``vocab_size`` None: none, the engine draws them); Mooncake
    traces get ids that share what the trace's hash_ids share (``vocab_size`` is required;
    ``block_tokens`` is the trace's block size, which ``length_scale`` must divide).
    """
    if _trace_format(path, trace_format) == "mooncake":
        if vocab_size is None:
            raise ValueError("a Mooncake replay needs vocab_size= (the model's vocabulary) to spell its shared blocks")
        frame = mooncake_frame(path, time_scale, length_scale, max_requests, max_context, block_tokens)
        return trace_requests(frame, vocab_size, seed)
    _check_positive("time_scale", time_scale)
    _check_positive("length_scale", length_scale)
    _check_optional_int("max_requests", max_requests, 1)
    _check_optional_int("vocab_size", vocab_size, 1)
    _check_optional_int("max_context", max_context, 2)
    trace = read_trace(path)
    if max_requests is not None:
        trace = trace.head(max_requests)
    token_rng = np.random.default_rng(seed)
    requests = []
    for i, row in enumerate(trace.itertuples(index=False)):
        p = max(1, round(row.prompt_tokens / length_scale))
        o = max(1, round(row.output_tokens / length_scale))
        p, o = _fit(p, o, max_context)
        ids = token_rng.integers(0, vocab_size, size=p).tolist() if vocab_size is not None else None
        requests.append(Request(i, p, o, float(row.arrival_s) * time_scale, "trace", ids))
    return requests


def replay_mooncake(path: str | Path = MOONCAKE_SAMPLE_TRACE, time_scale: float = 1.0, length_scale: float = 1.0,
                    max_requests: int | None = None, vocab_size: int = 256, max_context: int | None = None,
                    seed: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[Request]:
    """``replay_trace`` of a Mooncake trace (by default the shipped sample, with a 256-token vocabulary)."""
    return replay_trace(path, time_scale, length_scale, max_requests, vocab_size, max_context, seed, "mooncake",
                        block_tokens)


def replay_trace_file(path: str | Path, trace_format: str | None = None, time_scale: float = 1.0,
                      length_scale: float = 1.0, max_requests: int | None = None, vocab_size: int | None = 256,
                      max_context: int | None = None, seed: int = 0) -> list[Request]:
    """``replay_trace`` with the format second and a 256-token vocabulary by default."""
    return replay_trace(path, time_scale, length_scale, max_requests, vocab_size, max_context, seed, trace_format)


# -- the same requests, faster or slower -------------------------------------------------------------
def read_any_trace(path: str | Path, trace_format: str | None = None) -> pd.DataFrame:
    """Either format as arrival_s, prompt_tokens, output_tokens (and hash_ids for Mooncake)."""
    return read_trace(path) if _trace_format(path, trace_format) == "azure" else read_mooncake_trace(path)


def _trace_format(path: str | Path, trace_format: str | None) -> str:
    """``trace_format``, or the file's (``detect_format``); ValueError for a format kvlab does not read."""
    trace_format = detect_format(path) if trace_format is None else trace_format
    if trace_format not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {trace_format!r}; choose one of {', '.join(TRACE_FORMATS)}")
    return trace_format


__all__ = ["AZURE_COLUMNS", "MOONCAKE_BLOCK_TOKENS", "MOONCAKE_FIELDS", "MOONCAKE_SAMPLE_TRACE", "SAMPLE_TRACE",
           "SAMPLE_TRACES", "TRACE_FORMATS", "block_token_ids", "detect_format", "id_digits",
           "mooncake_frame", "read_any_trace", "read_mooncake_trace", "read_trace", "replay_mooncake",
           "replay_trace", "replay_trace_file", "scaled_block_tokens", "trace_requests"]
