"""Runs training in background threads, one ``RunManager`` per server.

The Streamlit script only submits, stops and reads; the threads here never call ``st.*``. Every
event goes to the in-memory ``RunState`` (what the live page polls) and to the ``RunStore`` (what a
reload, a second tab or the next server start reads).

Importing this module must stay cheap: torch and transformers are imported by the worker thread
(or by ``gradacc.serving.warmup``), never at import time.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import weakref
from typing import Callable

from gradacc import env as env_numbers
from gradacc import events as ev
from gradacc.serving import warmup
from gradacc.config import RunConfig
from gradacc.errors import GradaccError, RunStopped
from gradacc.serving.store import LIVE_STATUSES, RunStore

log = logging.getLogger(__name__)

TrainFn = Callable[[RunConfig, ev.EventSink, threading.Event], dict]

DEFAULT_MAX_CONCURRENT = 1
DEFAULT_MAX_RUN_SECONDS = 600.0
# Finished runs kept in memory so the page does not re-read the store on every rerun.
FINISHED_CACHE_SIZE = 32

STOPPED_BY_OWNER = "stopped by its owner"
STOPPED_BEFORE_START = "stopped before it started"
SHUTDOWN_BEFORE_START = "the server shut down before this run started"
SHUTDOWN_WHILE_RUNNING = "the server shut down while this run was running"
NO_RUN_ENDED = "the training function returned without ending the run"


def limit_reason(seconds: float) -> str:
    return f"reached the deployment's limit of {seconds:g} s"


def one_line_error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0] if text else type(error).__name__


class RunState:
    """One run as the app sees it. Safe to read from any thread while a worker appends."""

    def __init__(self, run_id: str, owner: str, label: str | None, config: dict, status: str,
                 reason: str | None = None, created: float | None = None, events: list[dict] | None = None,
                 load_events: Callable[[], list[dict]] | None = None):
        self.run_id = run_id
        self.owner = owner
        self.label = label
        self.config = config
        self.status = status
        self.reason = reason
        self.created = created if created is not None else time.time()
        self._lock = threading.Lock()
        self._events: list[dict] = list(events or [])
        # A run read from the store loads its events on first use: the run list needs none of them.
        self._load_events = load_events
        self._stop_reason: str | None = None

    def __repr__(self) -> str:
        return f"RunState({self.run_id!r}, status={self.status!r}, events={len(self.events)})"

    @property
    def name(self) -> str:
        return self.label or self.run_id

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def events(self) -> list[dict]:
        """A copy, so a caller can iterate while the worker appends."""
        with self._lock:
            if self._load_events is not None:
                self._events, self._load_events = self._load_events(), None
            return list(self._events)

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    def snapshot(self) -> "RunState":
        """This run frozen now: a page that draws its status and its charts from one snapshot shows the same
        step in both (the worker keeps appending to the live state meanwhile)."""
        with self._lock:
            status, reason = self.status, self.reason
        return RunState(self.run_id, self.owner, self.label, self.config, status, reason, self.created,
                        events=self.events)

    @property
    def started(self) -> dict | None:
        found = self.of(ev.RUN_STARTED)
        return found[0] if found else None

    @property
    def ended(self) -> dict | None:
        found = self.of(ev.RUN_ENDED)
        return found[-1] if found else None

    def steps(self):
        """Step events as a pandas DataFrame, one row per optimizer step (columns even when empty)."""
        return _frame(self.of(ev.STEP), STEP_COLUMNS)

    def evals(self):
        """Eval events as a pandas DataFrame, one row per epoch."""
        return _frame(self.of(ev.EVAL), EVAL_COLUMNS)

    def progress(self) -> tuple[int, int | None]:
        """(optimizer steps done, total steps or None before run_started)."""
        events = self.events
        steps = [e for e in events if e.get("event") == ev.STEP]
        started = next((e for e in events if e.get("event") == ev.RUN_STARTED), None)
        done = steps[-1]["step"] if steps else 0
        return done, (started or {}).get("total_steps")

    def eta_seconds(self) -> float | None:
        """Seconds left at the pace so far; None until a step is done or once the run is over."""
        if self.status != "running":
            return None
        steps = self.of(ev.STEP)
        done, total = self.progress()
        if not steps or not total or done <= 0:
            return None
        elapsed = steps[-1].get("elapsed_s") or 0.0
        return max(0.0, elapsed / done * (total - done))

    # --- written by the manager only ---------------------------------------------------------

    def _apply(self, event: dict) -> None:
        with self._lock:
            self._events.append(event)
            kind = event.get("event")
            if kind == ev.RUN_STARTED:
                self.status = "running"
            elif kind == ev.RUN_ENDED:
                self.status, self.reason = event.get("status") or ev.FAILED, event.get("reason")

    def _request_stop(self, reason: str) -> None:
        with self._lock:
            # The first cause wins: a run stopped by its owner that then hits the limit was stopped by its owner.
            self._stop_reason = self._stop_reason or reason


STEP_COLUMNS = ("time", "step", "epoch", "samples_seen", "tokens_seen", "micro_batches", "loss", "grad_norm", "lr",
                "elapsed_s", "samples_per_s", "activation_bytes", "rss_bytes", "cuda_peak_bytes")
EVAL_COLUMNS = ("time", "epoch", "step", "eval_loss", "eval_accuracy", "eval_f1")


def _frame(rows: list[dict], columns: tuple[str, ...]):
    import pandas as pd  # lazy: the runner module stays cheap to import

    frame = pd.DataFrame(rows)
    return frame if rows else pd.DataFrame(columns=list(columns))


class _Worker:
    """The thread of one running run, the event that asks it to stop, and its wall-clock limit."""

    def __init__(self, run_id: str, target: Callable[["_Worker"], None]):
        self.stop = threading.Event()
        self.started = time.monotonic()
        # daemon: a run stuck in C code must not keep the server process from exiting
        self.thread = threading.Thread(target=target, args=(self,), name=f"gradacc-run-{run_id}", daemon=True)
        self.timer: threading.Timer | None = None


class RunManager:
    def __init__(self, store: RunStore, max_concurrent: int | None = None, train_fn: TrainFn | None = None,
                 max_run_seconds: float | None = None, recover: bool = True):
        """``max_concurrent``: default env GRADACC_MAX_CONCURRENT_RUNS or 1. ``max_run_seconds``: default env
        GRADACC_MAX_RUN_SECONDS or 600; 0 means no limit. ``train_fn``: default ``gradacc.training.engine.train``.
        ``recover``: mark runs a previous server left queued or running as interrupted (first manager of
        this process on this store file only)."""
        self.store = store
        self.max_concurrent = max_concurrent if max_concurrent is not None else _env_max_concurrent()
        if self.max_concurrent < 1:
            raise GradaccError(f"max concurrent runs must be at least 1; got {self.max_concurrent}.")
        self.max_run_seconds = max_run_seconds if max_run_seconds is not None else _env_max_run_seconds()
        self._train_fn = train_fn
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified whenever a run starts or ends
        self._live: dict[str, RunState] = {}  # queued and running
        self._queue: collections.deque[str] = collections.deque()
        self._workers: dict[str, _Worker] = {}
        self._ended_threads: list[threading.Thread] = []
        self._finished: collections.OrderedDict[str, RunState] = collections.OrderedDict()
        self._closed = False
        if recover:
            _recover_once(store)
        _open_managers.add(self)

    # --- submitting and stopping -----------------------------------------------------------

    def submit(self, config: RunConfig | dict, owner: str, label: str | None = None) -> str:
        """Queue a run (FIFO); it starts as soon as a slot is free. Raises GradaccError for a bad config."""
        if isinstance(config, dict):
            config = RunConfig.from_dict(config)
        # A copy, validated now so a bad value is reported next to its widget instead of after the queue.
        config = RunConfig.from_dict(config.to_dict()).validate()
        run_id = ev.new_run_id()
        with self._lock:
            if self._closed:
                raise GradaccError("The server is shutting down; no new runs are accepted.")
            self.store.create_run(run_id, owner, config.to_dict(), label, status="queued")
            self._live[run_id] = RunState(run_id, owner, label, config.to_dict(), "queued")
            self._queue.append(run_id)
            self._schedule()
        return run_id

    def stop(self, run_id: str, owner: str) -> bool:
        """Stop a queued or running run; only its owner may. False when not live or not theirs."""
        with self._lock:
            state = self._live.get(run_id)
            if state is None or state.owner != owner:
                return False
            if run_id in self._queue:
                self._queue.remove(run_id)
                self._end_unstarted(state, STOPPED_BEFORE_START)
                return True
            worker = self._workers[run_id]
        state._request_stop(STOPPED_BY_OWNER)
        worker.stop.set()
        return True

    def delete(self, run_id: str, owner: str) -> bool:
        """Delete a finished run of ``owner`` and its events; a live run must be stopped first."""
        with self._lock:
            if run_id in self._live:
                return False
            run = self.store.get_run(run_id)
            if run is None or run["owner"] != owner:
                return False
            self._finished.pop(run_id, None)
            return self.store.delete_run(run_id)

    # --- reading ---------------------------------------------------------------------------

    def get(self, run_id: str) -> RunState | None:
        with self._lock:
            state = self._live.get(run_id) or self._finished.get(run_id)
            if state is not None:
                return state
        run = self.store.get_run(run_id)
        if run is None:
            return None
        state = self._stored_state(run)
        if not state.is_live:  # a run live in another process keeps changing: never cache it
            self._remember_finished(state)
        return state

    def runs(self) -> list[RunState]:
        """Every run, newest first: this server's live runs and everything in the store."""
        with self._lock:
            known = {**self._finished, **self._live}
        return [known.get(run["run_id"]) or self._stored_state(run) for run in self.store.list_runs()]

    def queue_position(self, run_id: str) -> int | None:
        """1 for the next run to start; None when the run is not waiting."""
        with self._lock:
            return self._queue.index(run_id) + 1 if run_id in self._queue else None

    def ahead_of(self, run_id: str) -> tuple[list[RunState], list[RunState]]:
        """(runs holding a slot now, queued runs that start before ``run_id``): what a queued run waits for."""
        with self._lock:
            running = [state for rid, state in self._live.items() if rid not in self._queue]
            ahead = list(self._queue)[:self._queue.index(run_id)] if run_id in self._queue else []
            return running, [self._live[rid] for rid in ahead]

    def recent_wall_seconds(self) -> list[float]:
        """How long this server's recently finished runs took (completed ones), newest last."""
        with self._lock:
            finished = list(self._finished.values())
        return [state.ended["wall_s"] for state in finished
                if state.status == "completed" and state.ended and state.ended.get("wall_s")]

    def is_live(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._live

    def any_live(self, owner: str | None = None) -> bool:
        with self._lock:
            return any(owner is None or s.owner == owner for s in self._live.values())

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Block until the run is no longer live; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: run_id not in self._live, timeout)

    # --- lifecycle -------------------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop every run and join every thread; True when all threads ended within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            for run_id in list(self._queue):
                self._end_unstarted(self._live[run_id], SHUTDOWN_BEFORE_START)
            self._queue.clear()
            running = [(self._live[run_id], worker) for run_id, worker in self._workers.items()]
        for state, worker in running:
            state._request_stop(SHUTDOWN_WHILE_RUNNING)
            worker.stop.set()
        for _, worker in running:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._reap()
            stuck = [worker.thread.name for _, worker in running if worker.thread.is_alive()]
        if stuck:
            log.warning("threads still running after shutdown: %s", ", ".join(stuck))
        return not stuck

    # --- internals (call with self._lock held) ------------------------------------------------

    def _schedule(self) -> None:
        self._reap()
        while self._queue and len(self._workers) < self.max_concurrent and not self._closed:
            self._start(self._live[self._queue.popleft()])

    def _start(self, state: RunState) -> None:
        worker = _Worker(state.run_id, lambda worker: self._work(state, worker))
        if self.max_run_seconds and self.max_run_seconds > 0:
            worker.timer = threading.Timer(self.max_run_seconds, _hit_limit,
                                           args=(state, worker.stop, limit_reason(self.max_run_seconds)))
            worker.timer.name, worker.timer.daemon = f"gradacc-limit-{state.run_id}", True
        self._workers[state.run_id] = worker
        state.status = "running"  # before run_started arrives: loading the model can take seconds
        self.store.set_status(state.run_id, "running")
        if worker.timer:
            worker.timer.start()  # before the thread: a run that ends at once must find it started to cancel it
        worker.thread.start()
        self._changed.notify_all()

    def _end_unstarted(self, state: RunState, reason: str) -> None:
        self._record(state, ev.run_ended(status=ev.STOPPED, reason=reason, steps=0, wall_s=0.0))
        del self._live[state.run_id]
        self._remember_finished(state)
        self._changed.notify_all()

    def _reap(self) -> None:
        """Join the threads of runs that have ended (their last act was to hand back the slot)."""
        still_running = []
        for thread in self._ended_threads:
            if thread.is_alive():
                still_running.append(thread)
            else:
                thread.join()
        self._ended_threads = still_running

    def _remember_finished(self, state: RunState) -> None:
        with self._lock:
            self._finished[state.run_id] = state
            self._finished.move_to_end(state.run_id)
            while len(self._finished) > FINISHED_CACHE_SIZE:
                self._finished.popitem(last=False)

    def _stored_state(self, run: dict) -> RunState:
        run_id = run["run_id"]
        return RunState(run_id, run["owner"], run["label"], run["config"], run["status"], run["reason"],
                        run["created"], load_events=lambda: self.store.events(run_id))

    # --- the worker thread -----------------------------------------------------------------

    def _work(self, state: RunState, worker: _Worker) -> None:
        try:
            config = RunConfig.from_dict(state.config)
            # While the app's warm-up imports torch, this thread must not import (see gradacc.serving.warmup); the
            # status meanwhile says "loading the model and data", and Stop still works.
            while not warmup.wait_until_warm(timeout=0.2) and not worker.stop.is_set():
                pass
            train = self._train_fn or _engine_train(config)
            result = train(config, lambda event: self._record(state, event), worker.stop)
            if state.ended is None:
                ended = result if isinstance(result, dict) and result.get("event") == ev.RUN_ENDED else None
                self._record(state, ended or self._ended_event(state, worker, ev.FAILED, NO_RUN_ENDED))
        except RunStopped:  # a backend's way out of its loop, leaked: still a stop, not a failure
            if state.ended is None:
                self._record(state, self._ended_event(state, worker, ev.STOPPED, state._stop_reason))
        except Exception as error:  # the engine should not raise, but a run must never die silently
            log.exception("run %s failed", state.run_id)
            if state.ended is None:
                self._record(state, self._ended_event(state, worker, ev.FAILED, one_line_error(error)))
        finally:
            try:
                if worker.timer:
                    worker.timer.cancel()
                    worker.timer.join()
            finally:
                self._finish(state)  # always hand the slot back, or the queue would stall

    def _record(self, state: RunState, event: dict) -> None:
        """The engine's ``on_event``: into memory first (the live page), then into the store."""
        if event.get("event") == ev.RUN_ENDED and event.get("status") == ev.STOPPED and state._stop_reason:
            # The engine only knows it was asked to stop; the manager knows why.
            event = {**event, "reason": state._stop_reason}
        state._apply(event)
        try:
            self.store.append_event(state.run_id, event)
        except Exception:  # a full disk must not kill the training; the page still has the event
            log.exception("could not store an event of run %s", state.run_id)

    def _ended_event(self, state: RunState, worker: _Worker, status: str, reason: str | None) -> dict:
        return ev.run_ended(status=status, reason=reason, steps=state.progress()[0],
                            wall_s=time.monotonic() - worker.started)

    def _finish(self, state: RunState) -> None:
        with self._lock:
            worker = self._workers.pop(state.run_id)
            self._live.pop(state.run_id, None)
            self._remember_finished(state)
            self._ended_threads.append(worker.thread)
            self._schedule()
            self._changed.notify_all()


# At interpreter exit (SIGTERM from docker stop or a Space restart included), stop every run within its
# micro-batch and record it: a daemon thread still inside torch while Python finalises aborts the process
# ("terminate called without an active exception") and leaves its run to be found interrupted.
EXIT_SHUTDOWN_SECONDS = 5.0
_open_managers: "weakref.WeakSet[RunManager]" = weakref.WeakSet()


@atexit.register
def _shutdown_at_exit() -> None:
    for manager in list(_open_managers):
        try:
            manager.shutdown(timeout=EXIT_SHUTDOWN_SECONDS)
        except Exception:  # exiting anyway; one manager must not keep the others from stopping
            log.exception("could not shut a run manager down at exit")


_recover_lock = threading.Lock()
_recovered_stores: set[str] = set()


def _recover_once(store: RunStore) -> None:
    """Mark the runs a previous server left live as interrupted, once per process and store file.

    Once only: a second manager in the same process (Streamlit re-creating a cached resource) must not
    call the first one's live runs interrupted.
    """
    key = str(store.path.resolve())
    with _recover_lock:
        if key in _recovered_stores:
            return
        _recovered_stores.add(key)
    store.mark_interrupted()


def _hit_limit(state: RunState, stop: threading.Event, reason: str) -> None:
    state._request_stop(reason)
    stop.set()


def _engine_train(config: RunConfig | None = None) -> TrainFn:
    if config is not None and config.num_processes > 1:
        from gradacc.training.launch import train  # one process per rank, started through accelerate launch

        return train
    from gradacc.training.engine import train  # lazy: imports torch

    return train


def _env_max_concurrent() -> int:
    return env_numbers.whole_number(os.environ, "GRADACC_MAX_CONCURRENT_RUNS") or DEFAULT_MAX_CONCURRENT


def _env_max_run_seconds() -> float:
    """GRADACC_MAX_RUN_SECONDS; 0 turns the limit off."""
    return env_numbers.number(os.environ, "GRADACC_MAX_RUN_SECONDS", DEFAULT_MAX_RUN_SECONDS, allow_zero=True)
