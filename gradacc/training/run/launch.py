"""A data-parallel run from the app: ``train(config, on_event, stop)`` for ``config.num_processes > 1``.

The same signature and the same events as ``gradacc.training.run.engine.train``, but the training runs in
``config.num_processes`` processes started by ``accelerate launch``:

    accelerate launch --multi_gpu --num_processes P -m gradacc.training.run.rank run.json

(``--multi_gpu`` is Accelerate's torchrun launcher; on a machine without GPUs the ranks train on the CPU
with gloo. ``--cpu`` would start a single process: Accelerate runs several CPU processes only through MPI.)

- Rank 0 prints the run's JSON events on its stdout; they go to ``on_event`` as they come.
- Stop ends every rank: SIGTERM to the launcher's process group, SIGKILL after a grace period.
- A rank that fails fails the run with its reason: the first ``error:`` line of stderr (the other ranks
  fail after it, of its absence).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gradacc import events
from gradacc.config import ValidConfig
from gradacc.env import MAX_RUN_MEMORY_MB
from gradacc.errors import one_line
from gradacc.events import EventSink
from gradacc.training.run.engine import train as train_here

STOP_GRACE_S = 3.0
STDERR_LINES_KEPT = 200
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds gradacc/


def train(config: ValidConfig, on_event: EventSink | None = None, stop: threading.Event | None = None,
          max_run_memory_mb: float | None = None, on_phase: Callable[[str], None] | None = None) -> dict:
    """Run ``config`` on ``config.num_processes`` processes; emit rank 0's events; return ``run_ended``.

    ``max_run_memory_mb``: the deployment's cap on each process's memory (each rank reads it back).
    ``on_phase``: told that the processes are starting (what they prepare is theirs)."""
    on_event = on_event or (lambda event: None)
    if on_phase is not None:
        on_phase(f"starting {config.num_processes} processes")
    stop = stop or threading.Event()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradacc-launch-") as folder:
        config_file = Path(folder) / "config.json"
        config_file.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        try:
            process = subprocess.Popen(command(str(config_file), config.num_processes, free_port()),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                       env=_environment(max_run_memory_mb),
                                       start_new_session=True)  # its own process group: Stop reaches every rank
        except OSError as error:
            ended = events.run_ended(status=events.FAILED, reason=f"could not start the launcher: {error}", steps=0,
                                     wall_s=time.perf_counter() - started)
            on_event(ended)
            return ended
        errors = _StderrTail(process.stderr)
        watcher = threading.Thread(target=_stop_when_asked, args=(process, stop), daemon=True,
                                   name="gradacc-launch-stop")
        watcher.start()
        rank0_ended, steps, sink_failure = None, 0, None
        for line in process.stdout:
            event = _event(line)
            if event is None or sink_failure:
                continue
            if event["event"] == events.RUN_ENDED:
                rank0_ended = event  # the run's end is decided once every rank has exited
                continue
            if event["event"] == events.STEP:
                steps = event["step"]
            try:
                on_event(event)
            except Exception as error:  # noqa: BLE001 - a broken sink fails the run, as in the engine
                sink_failure = one_line(error)
                _kill_group(process, signal.SIGKILL)
        returncode = process.wait()
        errors.join()
        if stop.is_set() or returncode != 0:
            _kill_group(process, signal.SIGKILL)  # no rank may outlive the run
    wall_s = time.perf_counter() - started
    if sink_failure:
        ended = events.run_ended(status=events.FAILED, reason=sink_failure, steps=steps, wall_s=wall_s)
    else:
        ended = _outcome(rank0_ended, returncode, stop.is_set(), errors, steps, wall_s)
    on_event(ended)
    return ended


def train_for(config: ValidConfig) -> Callable[..., dict]:
    """What trains ``config``: ``engine.train`` in this process, or ``train`` above (one process per rank,
    through accelerate launch) when it asks for several processes. Both take (config, on_event, stop)."""
    if config.num_processes > 1:
        return train
    return train_here


def command(config_file: str, num_processes: int, port: int) -> list[str]:
    """The launch command line (tests replace it with a stand-in)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port),
            "-m", "gradacc.training.run.rank", config_file]  # a visitor's run: rank.py confines its paths


def free_port() -> int:
    """A port nobody listens on now: two runs at once must not share a rendezvous port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment(max_run_memory_mb: float | None = None) -> dict:
    env = dict(os.environ)
    if max_run_memory_mb:
        env[MAX_RUN_MEMORY_MB] = f"{max_run_memory_mb:g}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"  # events arrive as they happen
    return env


def _event(line: str) -> dict | None:
    """A JSON event line of rank 0's stdout; None for anything else a library printed."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def _outcome(rank0_ended: dict | None, returncode: int, stopped: bool, errors: "_StderrTail", steps: int,
             wall_s: float) -> dict:
    if rank0_ended is not None and (returncode == 0 or rank0_ended.get("field")):
        return rank0_ended  # every rank finished, or every rank refused the same bad setting
    if stopped:
        return events.run_ended(status=events.STOPPED, reason="stopped on request", steps=steps, wall_s=wall_s)
    # The first rank to fail says why; the others fail after it, of its absence (a reset connection).
    reason = errors.first_error or (rank0_ended or {}).get("reason") or errors.fallback(returncode)
    return events.run_ended(status=events.FAILED, reason=reason, steps=steps, wall_s=wall_s)


def _stop_when_asked(process: subprocess.Popen, stop: threading.Event) -> None:
    while process.poll() is None:
        if stop.wait(0.2):
            _kill_group(process, signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)
            return


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # start_new_session: the group's id is the launcher's pid
    except (ProcessLookupError, PermissionError):
        pass


class _StderrTail:
    """Reads stderr as it comes (a full pipe would block the ranks), keeps its last lines and its first
    ``error:`` line (each failed rank's one line, from rank.py)."""

    def __init__(self, stream):
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)
        self.first_error: str | None = None
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True, name="gradacc-launch-stderr")
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            line = line.rstrip()
            if line:
                self.lines.append(line)
            if line.startswith("error: ") and self.first_error is None:
                self.first_error = line.removeprefix("error: ")

    def join(self) -> None:
        self._thread.join(5.0)

    def fallback(self, returncode: int) -> str:
        last = self.lines[-1] if self.lines else ""
        return f"a process of the run exited with code {returncode}" + (f": {last}" if last else "")
