"""Run one training: prepare, announce, let the chosen backend train, and always say how it ended.

``train`` never raises for bad input or a fault during training: it emits ``run_ended`` with status
``failed`` and a one-line reason, keeping every event emitted before.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from gradacc import events
from gradacc.config import RunConfig, ValidConfig
from gradacc.errors import GradaccError, RunFailed, RunStopped, one_line
from gradacc.events import EventSink
from gradacc.export.trackers import open_trackers, parse_report_to
from gradacc.training import distributed, process_state
from gradacc.training.backends import train_function
from gradacc.training.memory import budget
from gradacc.training.run.health import run_warnings
from gradacc.training.run.job import prepare
from gradacc.training.run.options import RunOptions

# torch, transformers and the training modules that import them at their top are imported inside the functions that
# train or measure: the app (through gradacc.analysis), and `gradacc --help`, imports this module before torch loads
# (tests/core/test_layout.py).


def quiet_libraries() -> None:
    """transformers' load reports and progress bars are noise in a CLI, a log and a demo."""
    import transformers  # here: the app and `gradacc --help` import this module before transformers loads

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def flush_denormals(on: bool) -> None:
    """Subnormal floats (below ~1.2e-38) as zero on this thread (and the threads it starts) while it trains.

    x86 CPUs compute subnormals in microcode, many times slower, and tiny-bert's training passes through them:
    unflushed, the same run's speed swings from one window to the next (see docs/bench/watchers.md, linked from
    BENCHMARKS.md's watchers row). No figure gradacc shows comes near 1e-38.
    """
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    torch.set_flush_denormal(on)


def train(config: RunConfig, on_event: EventSink | None = None, stop: threading.Event | None = None,
          options: RunOptions | None = None, **keywords) -> dict:
    """Train ``config``; emit events to ``on_event``; return the ``run_ended`` event.

    ``options`` (``RunOptions``) is what the equivalence check, the benchmarks, the CLI and the app ask of a run
    beyond its config; each may also be given as a keyword (``train(config, on_event, report_to="tensorboard")``),
    which overrides ``options``. A misspelt one is a TypeError, not a silent no-op. A tracker that cannot start
    fails the run before training, with ``field`` ``report_to`` or ``log_dir``.
    """
    options = dataclasses.replace(options or RunOptions(), **keywords)
    on_event = on_event or (lambda event: None)
    stop = stop or threading.Event()
    started = time.perf_counter()
    steps_done = 0
    bad_field = None
    out_of_memory = None
    job = None  # with its memory guard, if any: released at the end, consulted on a real out-of-memory
    emitted: list[dict] = []  # what the warnings at the end are computed from
    trackers = None
    flush_denormals(True)  # and off again at the end: a caller's thread is left as threads start

    def emit(event: dict) -> None:
        nonlocal steps_done
        if event["event"] == events.STEP:
            steps_done = event["step"]
        emitted.append(event)
        on_event(event)
        if trackers is not None:
            trackers(event)

    try:
        config = config.check()  # where a run enters the engine: all its errors at once; a ValidConfig is itself
        trackers = _open_trackers(config, options)
        job = _prepare(config, emit, stop, options)  # measures the run's memory and refuses it past its cap
        emit(announce(job))
        job.check_stop()
        _run_backend(job)
        status, reason = events.COMPLETED, None
    except budget.OutOfMemory as error:
        status, reason, out_of_memory = events.FAILED, str(error), error.details
    except RunStopped:
        status, reason = events.STOPPED, "stopped on request"
    except GradaccError as error:
        status, reason, bad_field = events.FAILED, error.message, error.field or "config"
    except RunFailed as error:
        status, reason = events.FAILED, str(error)
    except Exception as error:  # noqa: BLE001 - a demo shows a reason, never a traceback
        status, reason = events.FAILED, describe_failure(error, config)
        guard = job.memory_guard if job is not None else None
        if guard is not None and is_out_of_memory(error):  # a real allocator failure under a budget (CUDA)
            failure = guard.real_out_of_memory()
            reason, out_of_memory = str(failure), failure.details
    except BaseException:  # Ctrl-C and the like: what the trackers got so far is still written out
        if trackers is not None:
            trackers.close()
        raise
    finally:
        if job is not None and job.memory_guard is not None:
            job.memory_guard.release_device()
        flush_denormals(False)
    ended = events.run_ended(status=status, reason=reason, steps=steps_done, wall_s=time.perf_counter() - started,
                             field=bad_field, warnings=_warnings(emitted, config) if status == events.COMPLETED else [],
                             out_of_memory=out_of_memory)
    on_event(ended)
    if trackers is not None:
        trackers.close()
    return ended


def _warnings(emitted: list[dict], config: ValidConfig) -> list[str]:
    """A run that completed badly says so (see gradacc.training.run.health); a bug there never fails the run."""
    try:
        return run_warnings(emitted, config)
    except Exception as error:  # noqa: BLE001 - the run itself succeeded; keep its result
        return [f"could not check the run for warnings ({type(error).__name__}: {error})"]


def _open_trackers(config: ValidConfig, options: RunOptions):
    """The run's trackers (rank 0 only: one process writes), opened before anything slow so a bad one fails fast."""
    if not parse_report_to(options.report_to) or not distributed.is_main_process():
        return None
    return open_trackers(options.report_to, options.log_dir, options.run_id or events.new_run_id(),
                                  config.to_dict())


def _prepare(config, emit, stop, options: RunOptions):
    quiet_libraries()
    return prepare(config, emit, stop, options)


def _run_backend(job) -> None:
    backend_train = train_function(job.config.backend)
    # Accelerate's state is the process's (Trainer's too): two such runs would step each other's accumulation
    # counters, and an audit's Trainer would reset them. They take turns for the whole training. Every run's steps
    # draw from torch's generator: side by side with other runs, never while an audit replays its window.
    with process_state.guard(accelerate=job.config.backend != "pytorch", training=process_state.SIDE_BY_SIDE):
        backend_train(job)


def announce(job) -> dict:
    config = job.config
    guard = job.memory_guard
    static = guard.need.static if guard else budget.static_need(job.model, config, job.device)
    started = events.run_started(config=config.to_dict(), effective_batch=config.effective_batch,
                                 total_steps=job.total_steps, steps_per_epoch=job.steps_per_epoch,
                                 train_examples=len(job.train_examples), eval_examples=len(job.eval_examples),
                                 static_memory=static, device=str(job.device), notes=job.notes,
                                 memory_need=guard.need.to_dict() | {"cap_bytes": guard.cap.bytes,
                                                                     "cap_source": guard.cap.source} if guard else None)
    return started


def describe_failure(error: Exception, config: RunConfig) -> str:
    """One line for an unexpected fault; out-of-memory gets a hint of what to change."""
    if is_out_of_memory(error):
        return (f"out of memory at micro-batch size {config.micro_batch_size}: lower the micro-batch size and "
                "raise accumulation steps (the Memory planner page shows what fits)")
    return one_line(error)


def is_out_of_memory(error: Exception) -> bool:
    if type(error).__name__ == "OutOfMemoryError":
        return True
    message = str(error).lower()
    return isinstance(error, (RuntimeError, MemoryError)) and (
        "out of memory" in message or "can't allocate memory" in message or isinstance(error, MemoryError))
