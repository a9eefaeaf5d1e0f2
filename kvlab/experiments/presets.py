"""The course's presets: the engine, queue, context and SLO every load experiment (and ``python -m kvlab sweep``)
runs on. kvlab's choices for teaching, not the serving core's defaults (see ``scheduler_config``)."""
from __future__ import annotations

from kvlab.clocks import SLO
from kvlab.serving.config import EngineSpec
from kvlab.serving.scheduler import Policy, Priority, SchedulerConfig

DEFAULT_SLO = SLO(ttft_s=2.0, tpot_s=0.3)  # for llama-30m on 2 CPU cores: ~0.5 s for a long prompt alone, ~0.1 s/token
MAX_MODEL_LEN = 1024  # every profile fits (longest: 512-token prompt + 32 out); a smaller pool than the 2048 context
MAX_WAITING = 64  # the lessons' bounded queue: overload shows up as failures (SchedulerConfig's queue is unbounded)


def scheduler_config(policy: Policy = SchedulerConfig.policy, priority: Priority = SchedulerConfig.priority, *,
                     max_waiting: int | None = MAX_WAITING, max_model_len: int | None = MAX_MODEL_LEN,
                     **fields) -> SchedulerConfig:
    """The lesson's scheduler: SchedulerConfig with two defaults that deliberately differ (``MAX_WAITING`` and
    ``MAX_MODEL_LEN``, the constants above say why); everything else is SchedulerConfig's, defaults included."""
    return SchedulerConfig(policy=policy, priority=priority, max_waiting=max_waiting, max_model_len=max_model_len,
                           **fields)


LESSON_SPEC = EngineSpec(scheduler=scheduler_config())  # the lessons' engine: a bounded queue, a 1,024-token context


def lesson_spec(scheduler: SchedulerConfig | None = None) -> EngineSpec:
    """The lessons' engine spec, with ``scheduler`` if one is given."""
    return LESSON_SPEC if scheduler is None else LESSON_SPEC.replace(scheduler=scheduler)


__all__ = ["DEFAULT_SLO", "LESSON_SPEC", "MAX_MODEL_LEN", "MAX_WAITING", "lesson_spec", "scheduler_config"]
