"""A command's options: how every ``python -m kvlab`` module reads its words when it runs on its own.

Each command module has ``add_arguments(parser)`` and ``main(args)``; ``kvlab/cli.py`` parses once
for all of them, while a test or ``python -m kvlab.http.server`` hands ``main`` a list of words.
"""
from __future__ import annotations

import argparse
from typing import Callable, Sequence


def command_args(args: argparse.Namespace | Sequence[str] | None, prog: str, doc: str | None,
                 add_arguments: Callable[[argparse.ArgumentParser], None]) -> argparse.Namespace:
    """``args`` as parsed options: returned as is when already parsed, else parsed with the command's own parser."""
    if isinstance(args, argparse.Namespace):
        return args
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0] if doc else None)
    add_arguments(parser)
    return parser.parse_args(args)
