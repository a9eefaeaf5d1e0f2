"""What every load sweep runs on (lessons 06 and 08, ``python -m kvlab sweep``): the SLO, the pool, the lesson's scheduler, the simulator, the sweep's options.

Lesson 06 sweeps workload profiles (``kvlab.lessons.l06_under_load.load``), lesson 08 replays a trace with
shared prefixes (``kvlab.lessons.l08_prefix_and_chunks.prefix_traces``); both price each step with the calibrated cost
model on the same simulator, with the same scheduler and SLO, and the ``sweep`` command reads the same
options for either. They import these from here, so neither imports the other.
"""
from __future__ import annotations

import argparse

from ..clocks import SLO
from ..model.config import ModelConfig, preset
from ..serving.cost_model import CostModel, CostModelExecutor, load_calibration
from ..serving.engine import Engine
from ..serving.scheduler import SchedulerConfig
from ..serving.scheduler_cli import scheduler_config_from_args

DEFAULT_SLO = SLO(ttft_s=2.0, tpot_s=0.3)  # for llama-30m on 2 CPU cores: ~0.5 s for a long prompt alone, ~0.1 s/token
MAX_MODEL_LEN = 1024  # every profile fits (longest: 512-token prompt + 32 out); a smaller pool than the 2048 context
MAX_WAITING = 64  # the lessons' bounded queue: overload shows up as failures (SchedulerConfig's queue is unbounded)


def scheduler_config(policy: str = SchedulerConfig.policy, priority: str = SchedulerConfig.priority, *,
                     max_waiting: int | None = MAX_WAITING, max_model_len: int | None = MAX_MODEL_LEN,
                     **fields) -> SchedulerConfig:
    """The lesson's scheduler: SchedulerConfig with two defaults that deliberately differ.

    ``max_waiting=MAX_WAITING`` (64; SchedulerConfig: unbounded): a bounded queue, so overload shows
    up as failures. ``max_model_len=MAX_MODEL_LEN`` (1024; SchedulerConfig: the model's context): every
    profile fits, in a smaller pool. Everything else (``max_seqs=``, ``max_batch_tokens=``, ...) is
    SchedulerConfig's, defaults included.
    """
    return SchedulerConfig(policy=policy, priority=priority, max_waiting=max_waiting, max_model_len=max_model_len,
                           **fields)


def simulator(cost_model: CostModel | None = None, scheduler: SchedulerConfig | None = None,
              block_size: int | None = None, kv_budget_bytes: int | None = None) -> Engine:
    """An Engine with no weights whose steps are priced by ``cost_model`` (default: the shipped llama-30m one)."""
    cost_model = load_calibration("llama-30m") if cost_model is None else cost_model
    config = ModelConfig(**cost_model.config)
    return Engine(config, block_size=block_size or cost_model.block_size, kv_budget_bytes=kv_budget_bytes,
                  scheduler=scheduler or scheduler_config(), executor=CostModelExecutor(cost_model))


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates {text!r}: give numbers separated by commas, e.g. 0.5,1,2,4") from None
    return rates


def sweep_settings(args: argparse.Namespace) -> tuple[ModelConfig, CostModel, SchedulerConfig, SLO]:
    """The model, its step prices, the scheduler and the SLO a sweep's options name (profiles or a trace)."""
    config = preset(args.config or ("llama-30m" if args.simulate else "tiny"))
    cost_model = CostModel.load(args.calibration) if args.calibration else load_calibration(config.name)
    # SchedulerConfig's token budget, raised to max_seqs if that is larger (every running sequence must decode)
    scheduler = scheduler_config_from_args(args, max_batch_tokens=max(SchedulerConfig.max_batch_tokens, args.max_seqs),
                                           max_model_len=MAX_MODEL_LEN)
    return config, cost_model, scheduler, SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)


__all__ = ["DEFAULT_SLO", "MAX_MODEL_LEN", "MAX_WAITING", "parse_rates", "scheduler_config", "simulator",
           "sweep_settings"]
