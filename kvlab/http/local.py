"""Running an ASGI server on loopback for tests, benchmarks and notebooks: a thread or a subprocess.

A thread shares this process's clock (`time.perf_counter`) and memory, so a test can inspect the engine behind the
server; a subprocess has its own core and event loop, so a benchmark measures the client, not the two fighting over one
loop. Both bind 127.0.0.1 on a free port by default.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Sequence

import httpx

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, timeout_s: float = 30.0, path: str = "/health",
                       process: subprocess.Popen | None = None) -> None:
    """Poll `url + path` until it answers 200; raise with the reason after `timeout_s`."""
    deadline = time.perf_counter() + timeout_s
    last = "no answer"
    while time.perf_counter() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server process exited with code {process.returncode} before {url} "
                               "was healthy; run its command by hand to see why")
        try:
            r = httpx.get(url + path, timeout=1.0, trust_env=False)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(0.05)
    raise TimeoutError(f"{url}{path} not healthy within {timeout_s} s (last: {last})")


class ServerThread:
    """uvicorn serving `app` in a background thread; a context manager.

    >>> with ServerThread(app) as server:  # doctest: +SKIP
    ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app, host: str = LOOPBACK, port: int | None = None, **uvicorn_options) -> None:
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        options = {"log_level": "warning", "access_log": False, "lifespan": "on", **uvicorn_options}
        self.server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=self.port, **options))
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.perf_counter() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.perf_counter() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url} within {timeout_s} s "
                                   "(port taken? see the log above)")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit (it finishes open responses up to its graceful timeout) and join."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout_s)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerProcess:
    """A server command in a subprocess on loopback, waited for at `/health`; a context manager.

    `args` are given after `python -m`, e.g. `["kvlab", "serve"]`; `--host`
    and `--port` are appended. Its output goes to `log_path` (or is discarded).
    """

    def __init__(self, args: Sequence[str], host: str = LOOPBACK, port: int | None = None,
                 log_path: str | Path | None = None, env: dict | None = None) -> None:
        self.host, self.port = host, port or free_port(host)
        self.cmd = [sys.executable, "-m", *args, "--host", self.host, "--port", str(self.port)]
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self._log: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "ServerProcess":
        self._log = open(self.log_path, "w") if self.log_path else None
        self.process = subprocess.Popen(self.cmd, stdout=self._log or subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, env=self.env)
        try:
            wait_until_healthy(self.url, timeout_s, process=self.process)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (the server drains or cancels, then exits); SIGKILL if it does not within `timeout_s`."""
        if self.process is None:
            return None
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            return self.process.returncode
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
