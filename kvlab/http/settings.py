"""`ServerSettings`: every setting of `python -m kvlab serve` in one object, the engine's as one `EngineSpec`.

The command line fills it (`ServerSettings.from_args`, checked before the model loads), `create_app` hands it to
the routes' shared state, the engine is built from its `engine` spec, and the engine loop and `run_server` read
their fields from it: a new setting is one field here (or in `EngineSpec`) and one option.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from kvlab.serving.config import SERVE_SPEC, EngineSpec, spec_from_args
from kvlab.http.engine_loop import MAX_FAILED_STEPS, STEP_TIMEOUT_S
from kvlab.http.guard import MAX_BODY_BYTES, READ_TIMEOUT_S, api_key_from_env


@dataclass(frozen=True)
class ServerSettings:
    """How the server answers, guards and gives up, and the spec its engine is built from."""

    engine: EngineSpec = SERVE_SPEC  # the KV pool, the scheduler, the seed (frozen, so one preset is shared safely)

    retry_after_s: int = 1  # Retry-After seconds sent with 429 and 503
    keep_records: int = 10_000  # recent requests' engine-side records kept for /kvlab/requests
    api_key: str | None = None  # when set, /v1/*, /metrics and /kvlab/requests need `Authorization: Bearer <key>`
    max_body_bytes: int = MAX_BODY_BYTES  # larger request bodies get 413
    read_timeout_s: float = READ_TIMEOUT_S  # seconds to send the request headers, and again the body (408)
    max_failed_steps: int = MAX_FAILED_STEPS  # failing engine steps in a row after which the engine stops for good
    step_timeout_s: float = STEP_TIMEOUT_S  # a step running longer means the engine is stuck: it is stopped
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    drain_timeout_s: int = 10  # seconds open requests get to finish at shutdown

    def __post_init__(self) -> None:
        if not (isinstance(self.max_failed_steps, int) and self.max_failed_steps >= 1):
            raise ValueError(f"max_failed_steps={self.max_failed_steps!r} must be an integer >= 1")
        for name in ("step_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0 seconds")
        if not self.max_body_bytes > 0:
            raise ValueError(f"max_body_bytes={self.max_body_bytes!r} must be > 0")

    def replace(self, **changes) -> "ServerSettings":
        """A copy with `changes`; an unknown name raises TypeError naming the fields there are."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown server setting(s) {unknown}; the settings are "
                            f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ServerSettings":
        """The settings `python -m kvlab serve`'s options name (the API key from $KVLAB_API_KEY when not given)."""
        return cls(engine=spec_from_args(args), retry_after_s=args.retry_after, api_key=api_key_from_env(args.api_key),
                   max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout,
                   max_failed_steps=args.max_failed_steps, step_timeout_s=args.step_timeout, host=args.host,
                   port=args.port, log_level=args.log_level, drain_timeout_s=args.drain_timeout)


__all__ = ["ServerSettings"]
