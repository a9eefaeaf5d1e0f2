"""SchedulerConfig on a command line: one option per field, its name, type and default taken from the field.

``add_scheduler_arguments(parser)`` adds ``--policy``, ``--priority``, ``--max-seqs``, ``--max-batch-tokens``,
``--no-chunked-prefill``, ``--max-waiting``, ``--max-model-len`` and ``--batch-wait-s``;
``scheduler_config_from_args(args)`` builds the SchedulerConfig they describe, which checks the values
(``SchedulerConfig.__post_init__``), so a command never checks them itself. ``python -m kvlab serve`` and
``python -m kvlab sweep`` use both.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Sequence

from kvlab.serving.scheduler import POLICIES, PRIORITIES, SchedulerConfig

# What each field means on a command line (its docstring in SchedulerConfig says more).
HELP = {
    "policy": "continuous: the batch rebuilt every step; static: a batch runs until its longest member finishes",
    "priority": "decode_first: every running sequence decodes, prompts fill the rest; prefill_first: prompts first",
    "max_seqs": "sequences admitted at once",
    "max_batch_tokens": "tokens computed per step (prompt chunks + one per decode)",
    "chunked_prefill": "run each prompt whole, in one step, instead of splitting it to fit --max-batch-tokens",
    "max_waiting": "queue bound; 0 = unbounded",
    "max_model_len": "prompt + max_tokens allowed; 0 = the model's context",
    "batch_wait_s": "static batching: wait this long (s) to fill the batch",
}
CHOICES = {"policy": POLICIES, "priority": PRIORITIES}
TYPES = {"int": int, "float": float, "str": str, "Policy": str, "Priority": str}  # the Literals are strings
OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulerConfig) if f.name in HELP)  # not admission (code)


def _field(name: str) -> dataclasses.Field:
    if name not in OPTION_FIELDS:
        raise ValueError(f"SchedulerConfig has no command-line option for {name!r}; "
                         f"choose from {', '.join(OPTION_FIELDS)}")
    return next(f for f in dataclasses.fields(SchedulerConfig) if f.name == name)


def _flag(name: str, default) -> str:
    """``--max-seqs``; a switch that is on by default is turned off: ``--no-chunked-prefill``."""
    return ("--no-" if default is True else "--") + name.replace("_", "-")


def add_scheduler_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, fields: Sequence[str] = OPTION_FIELDS,
                            help: dict[str, str] | None = None, **defaults) -> None:
    """One option per SchedulerConfig field in ``fields`` (default: all) on ``parser`` or one of its groups.

    ``defaults`` replaces a field's default for this command (``max_waiting=64`` for the server's
    bounded queue); ``help`` adds a command's own words to a field's help. An optional whole
    number (``max_waiting``, ``max_model_len``) reads 0 as None, which a command line cannot spell.
    """
    unknown = set(defaults) - set(fields)
    if unknown:
        raise ValueError(f"defaults given for fields without an option here: {', '.join(sorted(unknown))}")
    for name in fields:
        f = _field(name)
        default = defaults.get(name, f.default)
        words = HELP[name] + (f"; {help[name]}" if help and name in help else "")
        if f.type == "bool":
            parser.add_argument(_flag(name, default), dest=name, action="store_false" if default else "store_true",
                                help=words)
            continue
        kind = TYPES[f.type.split("|")[0].strip()]
        parser.add_argument(_flag(name, default), dest=name, type=kind, default=default, choices=CHOICES.get(name),
                            help=f"{words} (default {0 if default is None else default})")  # None reads 0


def scheduler_config_from_args(args: argparse.Namespace, **fixed) -> SchedulerConfig:
    """The SchedulerConfig the parsed options describe; ``fixed`` sets fields the command has no option for.

    Fields with neither an option nor a ``fixed`` value keep SchedulerConfig's defaults; it checks every value.
    """
    values: dict[str, Any] = {name: getattr(args, name) for name in OPTION_FIELDS
                              if name not in fixed and hasattr(args, name)}
    # 0 on the command line: unbounded / the model's context
    values.update({k: None for k, v in values.items() if v == 0 and "None" in _field(k).type})
    return SchedulerConfig(**values, **fixed)


def scheduler_args(config: SchedulerConfig, defaults: SchedulerConfig) -> list[str]:
    """The options of ``add_scheduler_arguments`` (with ``defaults`` as the command's) that spell ``config``:
    what ``scheduler_config_from_args`` reads back as ``config``. A command line for another process."""
    if config.admission is not None:
        raise ValueError("an admission rule is code and has no command-line option; run the engine in this process")
    args: list[str] = []
    for name in OPTION_FIELDS:
        value, default = getattr(config, name), getattr(defaults, name)
        if _field(name).type == "bool":
            args += [_flag(name, default)] if value != default else []
        else:
            args += [_flag(name, default), str(0 if value is None else value)]
    return args


__all__ = ["add_scheduler_arguments", "scheduler_args", "scheduler_config_from_args"]
