"""Over the wire: an OpenAI-compatible server for the kvlab engine and a load generator for any such server.

- `loadgen`: `run_loadtest(url, http_workload(...))` -> records with the client-side four clocks.
- `server`: `create_app(engine, name)` / `python -m kvlab serve` (imported on demand: it needs FastAPI).
- `compare`: client-side vs engine-side clocks of the same requests.
- `local`: run a server on loopback in a thread or a subprocess; `testing`: a scripted server.
"""
from __future__ import annotations

from .compare import compare_clocks, fetch_engine_records, measure_http_overhead, overhead_summary
from .loadgen import LoadTestResult, http_workload, loadtest, run_loadtest
from .local import ServerProcess, ServerThread, free_port
from .testing import Script, scripted_app

__all__ = ["LoadTestResult", "Script", "ServerProcess", "ServerThread", "compare_clocks", "fetch_engine_records",
           "free_port", "http_workload", "loadtest", "measure_http_overhead", "overhead_summary", "run_loadtest",
           "scripted_app"]
