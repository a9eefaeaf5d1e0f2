"""``python -m kvlab``: every command comes from one table (words -> module, help) in kvlab/cli.py."""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import kvlab
from kvlab.cli import COMMANDS, build_parser


def test_help_lists_the_commands_and_version_prints():
    out = subprocess.run([sys.executable, "-m", "kvlab", "--help"], capture_output=True, text=True, check=True).stdout
    for words in COMMANDS:
        assert words[0] in out
    version = subprocess.run([sys.executable, "-m", "kvlab", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"kvlab {kvlab.__version__}"


@pytest.mark.parametrize("words", list(COMMANDS), ids=[" ".join(w) for w in COMMANDS])
def test_every_registered_command_is_a_real_module(words):
    module = importlib.import_module(COMMANDS[words].module)
    assert callable(module.add_arguments) and callable(module.main)
    assert module.__doc__ and COMMANDS[words].help  # the module says what it holds; the table, what it does
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)  # its options build without clashing
    assert build_parser(list(words)).format_help()


def test_the_readme_says_where_every_command_lives():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Command line"):]
    for words, command in COMMANDS.items():
        assert f"`{' '.join(words)}`" in layout, f"README's command line section does not list `{' '.join(words)}`"
        assert f"{command.module.rsplit('.', 1)[-1]}.py" in layout, f"README does not say {command.module} runs it"


def test_bench_decode_dispatches_to_its_module():
    args = build_parser(["bench", "decode"]).parse_args(["bench", "decode", "--new", "4"])
    assert args.module == "kvlab.benchmarks.decode" and args.new == 4 and args.prompt == 256


def test_bench_decode_help_shows_its_options(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser(["bench", "decode"]).parse_args(["bench", "decode", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for option in ("--json", "--prompt", "--new", "--config", "--repeats", "--threads"):
        assert option in out


def test_a_missing_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser(["nope"]).parse_args(["nope"])
    assert done.value.code == 2
