"""A real ``streamlit run app.py`` on a free port, and the polling helper it waits with.

Shared by the browser tests and the scripts that measure the page (scripts/watchers.py,
scripts/page_latency.py); it lives on the scripts' side because scripts never import tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 90


def wait_for(condition, timeout: float, what: str, every: float = 0.05):
    """Poll ``condition()`` until it returns something truthy (returned); AssertionError after ``timeout``.

    ``what`` names the awaited event in the failure; it may be a callable, called only then (for a log tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {described}")
        time.sleep(every)


def free_port() -> int:
    """A local port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StreamlitServer:
    """``streamlit run app.py`` on a free port, in its own process group, with its own GRADACC_HOME, on the CPU,
    offline and without hub ids; its output is appended to ``log_path``. Started (healthy) on construction."""

    def __init__(self, home: Path, log_path: Path, extra_env: dict | None = None,
                 start_timeout: float = SERVER_START_TIMEOUT_S, command: list[str] | None = None,
                 cwd: Path = ROOT):
        """``command``: what starts the server instead of ``streamlit run app.py`` (e.g. ``gradacc app``);
        the port and address flags are added to it."""
        self.home = home
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "GRADACC_HOME": str(home), "GRADACC_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
               "GRADACC_ALLOW_HUB": "0", "PYTHONUNBUFFERED": "1", **(extra_env or {}),
               # Also for a command that takes no flags (a shell line such as the README's).
               "STREAMLIT_SERVER_PORT": str(self.port), "STREAMLIT_SERVER_ADDRESS": "127.0.0.1"}
        if command is None:
            command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                       "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
        command = [*command, "--server.port", str(self.port), "--server.address", "127.0.0.1"]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # Own process group: stopping it ends the server and any child it started, and nothing else.
            self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for(self._healthy, start_timeout,
                     lambda: f"streamlit to answer /_stcore/health\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"streamlit exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            return self.health()[0] == 200
        except OSError:
            return False  # not listening yet

    def health(self, timeout: float = 5.0) -> tuple[int, float]:
        """(HTTP status, seconds) of one GET /_stcore/health."""
        started = time.perf_counter()
        with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=timeout) as response:
            response.read()
            return response.status, time.perf_counter() - started

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a pulled plug would: no shutdown code runs."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, as ``docker stop`` or a Space restart sends it; the exit code."""
        os.killpg(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
        except ProcessLookupError:
            pass
