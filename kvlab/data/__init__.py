"""Files shipped inside kvlab: the trained recall checkpoint, cost-model calibrations and a sample trace.

They live in this folder, next to the code, and are found through ``importlib.resources``, so the
same call works whether kvlab is installed editable from a checkout (``pip install -e .``), from a
wheel or from git (``pip install "kvlab @ git+..."``, as Colab's setup cell does):

    recall-tiny/                 the tiny associative-recall model (lesson 03); scripts/train_recall.py
    calibration/<config>.json    step-time fits of the cost model (lesson 06); python -m kvlab calibrate
    traces/azure_conv_sample.csv a synthetic Azure-format trace; scripts/make_sample_trace.py
    traces/mooncake_sample.jsonl a synthetic Mooncake-format trace with shared prefixes; the same script
    texts/                       sample paragraphs in eleven languages, code and numbers, and a small English
                                 corpus to train a BPE tokenizer on (tokens are not words; written by hand)

Every loader that uses them (``load_recall_model``, ``load_calibration``, ``replay_trace``) still
takes an explicit path, and a missing file is an error that says how to make it, never a silent
stand-in.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

RECALL_TINY = "recall-tiny"
CALIBRATION = "calibration"
SAMPLE_TRACE = "traces/azure_conv_sample.csv"
MOONCAKE_SAMPLE_TRACE = "traces/mooncake_sample.jsonl"

# How to make each shipped item again (the scripts live in the repository, not in the wheel).
REMAKE = {
    RECALL_TINY: "retrain it with python scripts/train_recall.py (from a checkout of the repository)",
    CALIBRATION: "fit one on this machine with python -m kvlab calibrate --out PATH, then pass that path",
    "traces": "regenerate it with python scripts/make_sample_trace.py (from a checkout of the repository)",
    "texts": "restore kvlab/data/texts/ from the repository (the sample paragraphs and the small training corpus "
             "of the tokens-are-not-words lesson are written by hand)",
}


def data_dir() -> Path:
    """The folder holding kvlab's shipped data (this package's own folder, wherever kvlab is installed)."""
    root = resources.files(__name__)
    if not isinstance(root, Path):  # e.g. kvlab imported from a zip: its files have no path on disk
        raise RuntimeError(f"kvlab's data is at {root}, which is not a folder on disk; "
                           "install kvlab with pip (a wheel or pip install -e .) instead of importing it from a zip")
    return root


def data_path(relative: str) -> Path:
    """Where ``relative`` (e.g. "recall-tiny") sits in kvlab's shipped data, whether or not it exists."""
    return data_dir() / relative


def shipped(relative: str) -> Path:
    """The path of the shipped file or folder ``relative``; FileNotFoundError naming it and its fix if absent."""
    path = data_path(relative)
    if not path.exists():
        raise FileNotFoundError(missing_message(relative))
    return path


def missing_message(relative: str) -> str:
    """What to say when the shipped ``relative`` is missing: where it was looked for and how to get it back.

    The reinstall is said in words, not as the course's pip spec (kvlab.course.pip_spec): data sits below
    the course and does not import it.
    """
    remake = REMAKE.get(relative.split("/")[0], "pass the path of your own copy")
    return (f"kvlab's shipped {relative} is missing from {data_dir()} (kvlab/data/{relative} in the repository): "
            f"reinstall kvlab the way it was installed (pip install --force-reinstall --no-deps with the spec a "
            f"notebook's setup cell installs, or pip install -e . in a checkout), or {remake}")


__all__ = ["CALIBRATION", "MOONCAKE_SAMPLE_TRACE", "RECALL_TINY", "SAMPLE_TRACE", "data_dir", "data_path",
           "missing_message", "shipped"]
