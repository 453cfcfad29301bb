"""Helpers every kind of test uses: one polling helper, one free-port helper, one real Streamlit server.

Fixtures live in conftest.py (tests/ and tests/browser/); this module holds the plain functions and classes
they and the tests call. It imports neither torch nor streamlit.
"""

from __future__ import annotations

import base64
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"  # gitignored: logs and screenshots of a test session, never the source tree
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


def plotted(values) -> list:
    """A trace's x or y as the browser reads it from the figure's JSON: plotly sends a numpy array as a base64
    typed array ({"dtype": "f8", "bdata": ...}), where NaN is a gap (None here), and a list as a list."""
    if isinstance(values, dict) and "bdata" in values:
        import numpy as np

        decoded = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
        return [None if isinstance(v, float) and math.isnan(v) else v for v in decoded]
    return list(values or [])


def load_script(name: str):
    """A script of scripts/ as a module (its ``if __name__ == "__main__"`` part does not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_sentence_encoder(folder: Path) -> Path:
    """A tiny random BERT encoder written by save_pretrained (safetensors) with tiny-bert's tokenizer, in ``folder``:
    sentence-transformers loads it with mean pooling, for the contrastive task in seconds."""
    import torch
    from transformers import BertConfig, BertModel

    from gradacc.training.sources.models import tiny_bert_tokenizer

    tokenizer = tiny_bert_tokenizer()
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, pad_token_id=tokenizer.pad_token_id)).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
