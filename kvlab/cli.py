"""The command line: ``python -m kvlab <command> [<subcommand>] [options]``.

``COMMANDS`` below is the whole command line in one table: the words typed, the module that runs them (it exposes
``add_arguments(parser)`` and ``main(args) -> int``) and one line of help. The parser is built from it; adding a
command is one row. Only the module of the command being run is imported, so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
from typing import NamedTuple, Sequence

from kvlab.version import __version__


class Command(NamedTuple):
    """One row of the command line: the module holding ``add_arguments`` and ``main``, and its help."""

    module: str
    help: str


# words typed -> where the command lives and what it does. Two words: a group ("bench") and its subcommand.
COMMANDS: dict[tuple[str, ...], Command] = {
    ("serve",): Command("kvlab.http.server", "an OpenAI-compatible streaming server over the kvlab engine"),
    ("loadtest",): Command("kvlab.http.loadtest",
                           "the four clocks of any OpenAI-compatible server, measured at the client"),
    ("sweep",): Command("kvlab.experiments.sweep_cli",
                        "service curves under load, real or simulated on the calibrated cost model"),
    ("calibrate",): Command("kvlab.serving.calibrate",
                            "fit the cost model to this machine's step times (and validate it)"),
    ("room",): Command("kvlab.room.collector",
                       "the teacher's collector: every learner's run, stored in SQLite, for the room view"),
    ("notebooks",): Command("kvlab.authoring", "rebuild the notebooks from their sources, notebooks/NN_*.py"),
    ("bench", "decode"): Command("kvlab.benchmarks.decode",
                                 "one prompt through every kvlab cache and transformers' generate"),
    ("bench", "step"): Command("kvlab.benchmarks.step_budget",
                               "where a decode step's time goes: the step with one part left out at a time"),
    ("bench", "strategies"): Command("kvlab.benchmarks.strategies",
                                     "every KV cache's memory, latency and quality on the recall model"),
    ("bench", "batching"): Command("kvlab.benchmarks.batching",
                                   "static vs continuous batching in kvlab and in transformers"),
    ("bench", "loadgen"): Command("kvlab.benchmarks.loadgen",
                                  "how many streamed requests per second the load generator alone drives"),
    ("bench", "http"): Command("kvlab.benchmarks.http_overhead",
                               "what HTTP and streaming add to TTFT, client vs engine clocks"),
    ("bench", "serve"): Command("kvlab.benchmarks.serve",
                                "kvlab serve, transformers serve and vLLM: same weights, workload, client"),
    ("peer", "vllm"): Command("kvlab.http.vllm",
                              "set vLLM up in its own venv and serve the lesson model with it on loopback"),
}
GROUPS = {"bench": "benchmarks, each writing JSON with its settings and machine",
          "peer": "other engines beside kvlab serve, on the same weights (each in its own environment)"}


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for every command; only the command named in ``argv`` gets its module's arguments."""
    parser = argparse.ArgumentParser(prog="kvlab", description="kvlab: KV caches, batching and the four clocks.")
    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, command in COMMANDS.items():
        where = commands
        if len(words) == 2:  # a group such as "bench" holding subcommands such as "decode"
            if words[0] not in groups:
                about = GROUPS.get(words[0], f"{words[0]} commands")
                group = commands.add_parser(words[0], help=about, description=about)
                groups[words[0]] = group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
            where = groups[words[0]]
        leaf = where.add_parser(words[-1], help=command.help, description=command.help)
        leaf.set_defaults(module=command.module)
        if tuple(argv[:len(words)]) == words:
            importlib.import_module(command.module).add_arguments(leaf)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]) and run the command; returns its exit status."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    return int(importlib.import_module(args.module).main(args) or 0)
