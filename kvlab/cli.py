"""The command line: ``python -m kvlab <command> [<subcommand>] [options]``.

Each command lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``;
``COMMANDS`` maps the words typed to that module. Adding a command is one line here. Only the
module of the command being run is imported, so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
from pathlib import Path
from typing import Sequence

from . import __version__

# words typed -> module with add_arguments(parser) and main(args) -> int. Only modules that exist.
COMMANDS: dict[tuple[str, ...], str] = {
    ("bench", "decode"): "kvlab.benchmarks.decode",
    ("loadtest",): "kvlab.http.loadtest",
    ("bench", "loadgen"): "kvlab.benchmarks.loadgen",
    ("serve",): "kvlab.http.server",
    ("bench", "http"): "kvlab.benchmarks.http_overhead",
    ("calibrate",): "kvlab.serving.calibrate",
    ("sweep",): "kvlab.experiments.load",
    ("bench", "batching"): "kvlab.benchmarks.batching",
    ("bench", "strategies"): "kvlab.benchmarks.strategies",
}


def summary(module: str) -> str:
    """First line of a module's docstring, read from its source without importing it."""
    spec = importlib.util.find_spec(module)
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) if spec else None
    return doc.splitlines()[0] if doc else ""


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for every command; only the command named in ``argv`` gets its module's arguments."""
    parser = argparse.ArgumentParser(prog="kvlab", description="kvlab: KV caches, batching and the four clocks.")
    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module in COMMANDS.items():
        where = commands
        if len(words) == 2:  # a group such as "bench" holding subcommands such as "decode"
            if words[0] not in groups:
                group = commands.add_parser(words[0], help=f"{words[0]} commands")
                groups[words[0]] = group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
            where = groups[words[0]]
        about = summary(module)
        leaf = where.add_parser(words[-1], help=about, description=about)
        leaf.set_defaults(module=module)
        if tuple(argv[:len(words)]) == words:
            importlib.import_module(module).add_arguments(leaf)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]) and run the command; returns its exit status."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    return int(importlib.import_module(args.module).main(args) or 0)
