"""Run an engine until every request it was given has finished: the tokens each request got, in order."""
from __future__ import annotations

from collections.abc import Iterable

from kvlab.serving import Engine
from kvlab.workload import Request


def tokens_of(engine: Engine, requests: Iterable[Request]) -> dict[int, list[int]]:
    """Every request added at once, then steps until none is running or waiting: {request id: its tokens}."""
    for r in requests:
        engine.add_request(r)
    tokens: dict[int, list[int]] = {}
    while engine.scheduler.running or engine.scheduler.waiting:
        for o in engine.step():
            tokens.setdefault(o.request_id, []).append(o.token_id)
    return tokens
