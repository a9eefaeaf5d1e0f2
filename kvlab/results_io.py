"""Results as files: every JSON kvlab writes goes through here, under one rule for what JSON cannot hold.

The rule: NaN and ±inf are written as ``null`` (strict JSON has neither, and ``null`` is what pandas, browsers and
``jq`` read as "no value"); numpy scalars and arrays become Python numbers and lists; an ``SLO`` becomes its targets;
anything else JSON has no type for (a path, a dtype, a device) is written as its ``str``. ``save_results`` adds the
kvlab version, the settings and the machine, so a number is never read without what produced it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from kvlab.clocks import SLO, Summary


def jsonable(x: Any) -> Any:
    """``x`` with NaN/±inf -> None, numpy -> Python, mappings -> dicts with str keys, recursively."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, SLO):
        return x.targets()
    return x


def to_json(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` under this module's rule (never NaN or Infinity)."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False, default=str)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as strict, indented JSON to ``path`` (folders made as needed); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json(obj) + "\n", encoding="utf-8")
    return path


def save_results(path: str | Path, results: pd.DataFrame | Summary, settings: Mapping) -> Path:
    """Write `results` with kvlab version, `settings` and machine to `path`.

    `.json`: `{"kvlab_version", "settings", "environment", "results"}`, results as a list of row dicts (NaN written as
    null). `.csv`: the table, preceded by `# key: <json>` metadata lines; read it back with `load_results`.
    """
    from kvlab.env import environment  # lazy: collecting versions may import torch

    path = Path(path)
    frame = results.to_frame() if isinstance(results, Summary) else results
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"save_results takes a DataFrame or a Summary, not {type(results).__name__}")
    if path.suffix not in (".json", ".csv"):
        raise ValueError(f"save_results writes .csv or .json, not {path.suffix!r} ({path}); change the extension")
    env = environment()
    meta = {"kvlab_version": env["versions"]["kvlab"], "settings": dict(settings), "environment": env}
    if path.suffix == ".json":
        return write_json(path, {**meta, "results": frame.to_dict(orient="records")})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        for k, v in meta.items():
            f.write(f"# {k}: {to_json(v, indent=None)}\n")
        frame.to_csv(f, index=False)
    return path


def load_results(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Read what `save_results` wrote: (results frame, metadata dict)."""
    path = Path(path)
    if path.suffix == ".json":
        doc = json.loads(path.read_text(encoding="utf-8"))
        return pd.DataFrame(doc.pop("results")), doc
    meta, skip = {}, 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.startswith("# "):
                break
            key, value = line[2:].split(": ", 1)
            meta[key] = json.loads(value)
            skip += 1
    return pd.read_csv(path, skiprows=skip), meta


__all__ = ["jsonable", "load_results", "save_results", "to_json", "write_json"]
