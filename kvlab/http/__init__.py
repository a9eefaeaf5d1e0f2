"""Over the wire: an OpenAI-compatible server for the kvlab engine and a load generator for any such server."""
from __future__ import annotations

import importlib

# - loadgen: run_loadtest(url, http_workload(...)) -> records with the client-side four clocks (loadtest: its command
#   line; client: one streamed request and the connections).
# - server: create_app(engine, name, ServerSettings(...)) / python -m kvlab serve (settings: every setting beside the
#   engine, in one object; protocol: the OpenAI wire format; engine_loop: the thread stepping the engine, faults kept
#   in their requests; counts: where every request is; guard: API key, content type, body size and read time-outs
#   for a server in a room).
# - compare: client-side vs engine-side clocks of the same requests; local: run a server on loopback in a thread or a
#   subprocess; scripted: a server with chunk timings set by the caller, the load client's reference.
# Names are imported on first use (explicitly, from this table), so the load generator needs only httpx, the server
# fastapi and uvicorn (the "serve" extras), and python -m kvlab.http.<module> runs cleanly.
_EXPORTS = {
    "LoadTestResult": "loadgen", "http_workload": "loadgen", "loadtest": "loadgen", "run_loadtest": "loadgen",
    "compare_clocks": "compare", "fetch_engine_records": "compare", "measure_http_overhead": "compare",
    "overhead_summary": "compare", "ServerProcess": "local", "ServerThread": "local", "free_port": "local",
    "Script": "scripted", "scripted_app": "scripted", "create_app": "server", "ServerSettings": "settings",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvlab.http' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
