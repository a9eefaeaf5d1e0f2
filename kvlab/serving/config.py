"""An engine's settings, described once and passed whole (nano-vllm's ``Config``, vLLM's ``EngineArgs``).

``EngineSpec`` is everything an engine is built from besides its model. It is checked where it is made, so a bad
value fails before any weight is loaded, and it travels whole: ``Engine(model, spec)`` runs the decoder,
``Engine(cost_model, spec)`` the simulator, ``python -m kvlab serve`` reads one from its options
(``add_engine_arguments``, ``spec_from_args``; ``engine_args`` writes it back for a peer's process), the server's
settings hold it and the engine's own process builds from it.

Presets: ``SERVE_SPEC``, what ``python -m kvlab serve`` runs (a queue of 64: beyond it the server answers 429).
The lessons' spec is kvlab's lesson preset (``kvlab.experiments.presets.LESSON_SPEC``): a bounded queue and a
1,024-token context, so overload shows up as failures in a small pool.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.cache.paged import ATTENTION_BACKENDS, BLOCK_SIZE, check_attention, check_pool_geometry
from kvlab.model.config import ModelConfig
from kvlab.serving.compiled_decode import COMPILE_SIZES
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.serving.scheduler_cli import (OPTION_FIELDS, add_scheduler_arguments, scheduler_args,
                                         scheduler_config_from_args)

SCHEDULER_FIELDS = frozenset(f.name for f in dataclasses.fields(SchedulerConfig))


@dataclass(frozen=True)
class EngineSpec:
    """The KV pool, the scheduler and the seed of one engine (its model comes beside it).

    - ``block_size``: tokens per KV block (vLLM's default on CUDA, 16);
    - ``kv_budget_bytes``: the pool's size (None: room for ``scheduler.max_seqs`` requests of full length, so
      nothing is ever preempted);
    - ``enable_prefix_caching``: reuse the blocks of a prompt prefix computed before;
    - ``kv_dtype``: what the pool stores (None: the model's dtype);
    - ``scheduler``: how requests are batched (``SchedulerConfig``);
    - ``seed``: each request's sampling seed is derived from it and the request's id;
    - ``compile_sizes``: decode batches whose step ``torch.compile`` builds at start (``kvlab.serving.compiled_decode``,
      vLLM's capture sizes; () none, the default; ``serve --compile-decode``: ``COMPILE_SIZES``);
    - ``attention``: how decoding sequences attend over their blocks, "gather" (copied out, torch's attention) or
      "in_place" (read in the pool by kvlab's CPU kernel, ``kvlab.cache.in_place_attention``);
    - ``compile_mixed``: the steps that hold a prompt chunk run one program ``torch.compile`` builds at start for any
      token count, attention an operator it calls (``kvlab.serving.compiled_step``; ``serve --compile-mixed``).

    The last three change how fast a step runs, not what it computes (up to float rounding: tests compare the greedy
    tokens); ``Engine(model, spec)`` hands them to its ``ModelExecutor``.
    """

    block_size: int = BLOCK_SIZE
    kv_budget_bytes: int | None = None
    enable_prefix_caching: bool = True
    kv_dtype: torch.dtype | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 0
    compile_sizes: tuple[int, ...] = ()
    attention: str = "gather"
    compile_mixed: bool = False

    def __post_init__(self) -> None:
        check_pool_geometry(self.block_size)
        sizes = self.compile_sizes
        if not isinstance(sizes, tuple) or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise ValueError(f"compile_sizes must be a tuple of positive batch sizes, e.g. {COMPILE_SIZES}; got "
                             f"{sizes!r}")
        check_attention(self.attention)
        if not isinstance(self.compile_mixed, bool):
            raise ValueError(f"compile_mixed must be True or False, got {self.compile_mixed!r}")
        budget = self.kv_budget_bytes
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"kv_budget_bytes must be a whole number of bytes >= 1, or None (room for max_seqs "
                             f"full-length requests); got {budget!r}")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise TypeError(f"scheduler= takes a SchedulerConfig, got {type(self.scheduler).__name__}")
        if self.kv_dtype is not None and not isinstance(self.kv_dtype, torch.dtype):
            raise TypeError(f"kv_dtype= takes a torch.dtype or None (the model's), got {self.kv_dtype!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    def block_bytes(self, config: ModelConfig, dtype: torch.dtype | None = None) -> int:
        """K and V of one block of ``config``'s tokens across all layers: block_size x config.kv_bytes_per_token,
        at ``dtype`` (default: ``kv_dtype``, else float32)."""
        elem = torch.tensor([], dtype=dtype or self.kv_dtype or torch.float32).element_size()
        return self.block_size * config.kv_bytes_per_token(elem)

    def num_blocks(self, config: ModelConfig, kv_budget_bytes: int, dtype: torch.dtype | None = None) -> int:
        """How many whole blocks of ``config`` fit in ``kv_budget_bytes``; raises if not even one does."""
        per_block = self.block_bytes(config, dtype)
        if kv_budget_bytes < per_block:
            raise ValueError(
                f"kv_budget_bytes={kv_budget_bytes:,} holds no block: one block of {self.block_size} tokens of "
                f"{config.name} takes {per_block:,} B; raise kv_budget_bytes to at least {per_block:,} "
                f"or lower block_size")
        return kv_budget_bytes // per_block

    def with_blocks(self, config: ModelConfig, num_blocks: int, dtype: torch.dtype | None = None) -> EngineSpec:
        """A copy whose KV budget holds exactly ``num_blocks`` blocks of ``config`` at ``dtype``."""
        return self.replace(kv_budget_bytes=int(num_blocks) * self.block_bytes(config, dtype))

    def replace(self, **changes: Any) -> EngineSpec:
        """A copy with fields changed, the scheduler's by their own names: ``spec.replace(max_seqs=4, seed=1)``."""
        unknown = set(changes) - SCHEDULER_FIELDS - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"EngineSpec and SchedulerConfig have no field {', '.join(sorted(unknown))}")
        scheduling = {k: changes.pop(k) for k in list(changes) if k in SCHEDULER_FIELDS}
        if scheduling:
            changes["scheduler"] = dataclasses.replace(changes.get("scheduler", self.scheduler), **scheduling)
        return dataclasses.replace(self, **changes)


SERVE_SPEC = EngineSpec(scheduler=SchedulerConfig(max_waiting=64))


def add_engine_arguments(group: argparse.ArgumentParser | argparse._ArgumentGroup,
                         defaults: EngineSpec = SERVE_SPEC, help: dict[str, str] | None = None) -> None:
    """The spec's options on a command line (``--seed`` is the command's own: it seeds the weights too): every
    scheduler field, then ``--block-size``, ``--kv-budget-mb``, ``--no-prefix-caching``, ``--compile-decode``,
    ``--attention`` and ``--compile-mixed``, defaulting to ``defaults``. ``spec_from_args`` reads them back."""
    sched = defaults.scheduler
    changed = {f: getattr(sched, f) for f in OPTION_FIELDS if getattr(sched, f) != getattr(SchedulerConfig, f)}
    add_scheduler_arguments(group, help=help, **changed)
    group.add_argument("--block-size", type=int, default=defaults.block_size)
    group.add_argument("--kv-budget-mb", type=float, default=None, help="KV pool size (default: max-seqs full requests)")
    group.add_argument("--no-prefix-caching", action="store_true")
    group.add_argument("--compile-decode", action="store_true", default=bool(defaults.compile_sizes),
                       help="compile the decode step for batches of " + ", ".join(map(str, COMPILE_SIZES)) + " with "
                            "torch.compile at start (about 15 s each the first time, a few once inductor's cache holds "
                            "them; kvlab.serving.compiled_decode): steps where every sequence decodes replay it")
    group.add_argument("--attention", choices=ATTENTION_BACKENDS, default=defaults.attention,
                       help="how decoding sequences attend: gather (their blocks copied out, torch's attention) or "
                            "in_place (read in the pool by kvlab's CPU kernel, built once per machine: about a minute "
                            "the first time; float32 pools on the CPU, any other keeps gather; "
                            "kvlab.cache.in_place_attention)")
    group.add_argument("--compile-mixed", action="store_true", default=defaults.compile_mixed,
                       help="compile the steps that hold a prompt chunk too, once for any number of tokens, attention "
                            "an operator the program calls (about 20 s at start; kvlab.serving.compiled_step)")


def spec_from_args(args: argparse.Namespace) -> EngineSpec:
    """The EngineSpec the parsed options of ``add_engine_arguments`` (and the command's ``--seed``) describe,
    checked as it is made."""
    budget = int(args.kv_budget_mb * 2**20) if args.kv_budget_mb else None
    return EngineSpec(block_size=args.block_size, kv_budget_bytes=budget, enable_prefix_caching=not args.no_prefix_caching,
                      scheduler=scheduler_config_from_args(args), seed=args.seed,
                      compile_sizes=COMPILE_SIZES if args.compile_decode else (), attention=args.attention,
                      compile_mixed=args.compile_mixed)


def engine_args(spec: EngineSpec, defaults: EngineSpec = SERVE_SPEC) -> list[str]:
    """The options of ``add_engine_arguments(parser, defaults)`` that spell ``spec`` (its KV budget, in MiB, too),
    and ``--seed``: ``python -m kvlab serve`` started with them builds its engine from this very spec."""
    if spec.kv_dtype is not None:
        raise ValueError("kv_dtype has no command-line option: the server's pool holds the model's dtype")
    if spec.compile_sizes not in ((), COMPILE_SIZES) or (defaults.compile_sizes and not spec.compile_sizes):
        raise ValueError(f"compile_sizes={spec.compile_sizes} has no command-line option: --compile-decode compiles "
                         f"{COMPILE_SIZES}, its absence none")
    args = scheduler_args(spec.scheduler, defaults.scheduler) + ["--block-size", str(spec.block_size)]
    if spec.compile_sizes and not defaults.compile_sizes:
        args.append("--compile-decode")
    if spec.attention != defaults.attention:
        args += ["--attention", spec.attention]
    if spec.compile_mixed != defaults.compile_mixed:
        if not spec.compile_mixed:
            raise ValueError("compile_mixed=False has no command-line option where the defaults compile: "
                             "--compile-mixed only turns it on")
        args.append("--compile-mixed")
    if spec.kv_budget_bytes is not None:
        args += ["--kv-budget-mb", repr(spec.kv_budget_bytes / 2**20)]
    return args + (["--no-prefix-caching"] if not spec.enable_prefix_caching else []) + ["--seed", str(spec.seed)]


__all__ = ["EngineSpec", "SERVE_SPEC", "add_engine_arguments", "engine_args", "spec_from_args"]
