"""Runs training in background threads, one ``RunManager`` per server: a FIFO queue with a fixed number of
slots, each run stopped by its owner, by the deployment's time limit, or by the server shutting down.

The Streamlit script only submits, stops and reads; the threads here never call ``st.*``. Every
event goes to the in-memory ``RunState`` (what the live page polls; ``run_state``) and to the ``RunStore``
(what a reload, a second tab or the next server start reads). What happens at server start and exit is
in ``recovery``.

Importing this module must stay cheap: torch and transformers are imported by the worker thread
(or by ``gradacc.serving.warmup``), never at import time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from gradacc import events as ev
from gradacc.config import RunConfig, ValidConfig
from gradacc.errors import GradaccError, RunStopped, one_line
from gradacc.serving import recovery, warmup
from gradacc.serving.limits import Limits
from gradacc.serving.run_state import (NO_RUN_ENDED, SHUTDOWN_BEFORE_START, SHUTDOWN_WHILE_RUNNING,
                                       STOPPED_BEFORE_START, STOPPED_BY_OWNER, RunState, limit_reason)
from gradacc.serving.store import RunStore
from gradacc.training.run.launch import train_for

log = logging.getLogger(__name__)

TrainFn = Callable[[ValidConfig, ev.EventSink, threading.Event], dict]

# Finished runs kept in memory so the page does not re-read the store on every rerun.
FINISHED_CACHE_SIZE = 32


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
                 max_run_seconds: float | None = None, recover: bool = True, max_run_memory_mb: float | None = None):
        """``max_concurrent`` and ``max_run_seconds`` (0: no limit): by default the deployment's ``Limits``
        (GRADACC_MAX_CONCURRENT_RUNS, GRADACC_MAX_RUN_SECONDS, GRADACC_MAX_RUN_MEMORY_MB). ``train_fn``: by default
        ``training.launch.train_for(config)`` (the engine, or a launch on several processes).
        ``recover``: mark runs a previous server left queued or running as interrupted (first manager of
        this process on this store file only). ``max_run_memory_mb``: the deployment's memory limit per run
        (``Limits.max_run_memory_mb``), handed to the engine, which refuses a run that needs more before it starts."""
        self.store = store
        if max_concurrent is None or max_run_seconds is None or max_run_memory_mb is None:
            limits = Limits.from_env()
            max_concurrent = limits.max_concurrent_runs if max_concurrent is None else max_concurrent
            max_run_seconds = (limits.max_run_seconds or 0) if max_run_seconds is None else max_run_seconds
            max_run_memory_mb = limits.max_run_memory_mb if max_run_memory_mb is None else max_run_memory_mb
        self.max_concurrent = max_concurrent
        if self.max_concurrent < 1:
            raise GradaccError(f"max concurrent runs must be at least 1; got {self.max_concurrent}.")
        self.max_run_seconds = max_run_seconds
        self._train_fn = train_fn
        self.max_run_memory_mb = max_run_memory_mb
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified whenever a run starts or ends
        self._live: dict[str, RunState] = {}  # queued and running
        self._queue: collections.deque[str] = collections.deque()
        # Each queued run's config as submit() checked it: the run thread trains that object, not a copy of it.
        self._configs: dict[str, ValidConfig] = {}
        self._workers: dict[str, _Worker] = {}
        self._ended_threads: list[threading.Thread] = []
        self._finished: collections.OrderedDict[str, RunState] = collections.OrderedDict()
        self._closed = False
        if recover:
            recovery.recover_once(store)
        recovery.shut_down_at_exit(self)

    # --- submitting and stopping -----------------------------------------------------------

    def submit(self, config: RunConfig | dict, owner: str, label: str | None = None) -> str:
        """Queue a run (FIFO); it starts as soon as a slot is free. Raises ConfigErrors (every bad field) for a bad
        config."""
        if isinstance(config, dict):
            config = RunConfig.from_dict(config)
        # Checked now (the page's ValidConfig is itself), so a bad value is reported next to its
        # widget instead of after the queue.
        config = config.check()
        run_id = ev.new_run_id()
        with self._lock:
            if self._closed:
                raise GradaccError("The server is shutting down; no new runs are accepted.")
            self.store.create_run(run_id, owner, config.to_dict(), label, status="queued")
            self._live[run_id] = RunState(run_id, owner, label, config.to_dict(), "queued")
            self._queue.append(run_id)
            self._configs[run_id] = config
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
        state.request_stop(STOPPED_BY_OWNER)
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
            state.request_stop(SHUTDOWN_WHILE_RUNNING)
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
            run_id = self._queue.popleft()
            self._start(self._live[run_id], self._configs.pop(run_id))

    def _start(self, state: RunState, config: ValidConfig) -> None:
        worker = _Worker(state.run_id, lambda worker: self._work(state, worker, config))
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
        self._configs.pop(state.run_id, None)
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

    def _work(self, state: RunState, worker: _Worker, config: ValidConfig) -> None:
        try:
            # While the app's warm-up imports torch, this thread must not import (see gradacc.serving.warmup); the
            # status meanwhile says "loading the model and data", and Stop still works.
            state.set_phase("importing the training libraries")
            while not warmup.wait_until_warm(timeout=0.2) and not worker.stop.is_set():
                pass
            state.set_phase("starting")
            train = self._train_fn or train_for(config)
            limit = {"max_run_memory_mb": self.max_run_memory_mb} if self.max_run_memory_mb else {}
            if self._train_fn is None:  # the engine (or a launch) says each phase of its preparing
                limit["on_phase"] = state.set_phase
            result = train(config, lambda event: self._record(state, event), worker.stop, **limit)
            if state.ended is None:
                ended = result if isinstance(result, dict) and result.get("event") == ev.RUN_ENDED else None
                self._record(state, ended or self._ended_event(state, worker, ev.FAILED, NO_RUN_ENDED))
        except RunStopped:  # a backend's way out of its loop, leaked: still a stop, not a failure
            if state.ended is None:
                self._record(state, self._ended_event(state, worker, ev.STOPPED, state.stop_reason))
        except Exception as error:  # the engine should not raise, but a run must never die silently
            log.exception("run %s failed", state.run_id)
            if state.ended is None:
                self._record(state, self._ended_event(state, worker, ev.FAILED, one_line(error)))
        finally:
            try:
                if worker.timer:
                    worker.timer.cancel()
                    worker.timer.join()
            finally:
                self._finish(state)  # always hand the slot back, or the queue would stall

    def _record(self, state: RunState, event: dict) -> None:
        """The engine's ``on_event``: into memory first (the live page), then into the store."""
        event = state.record(event)
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


def _hit_limit(state: RunState, stop: threading.Event, reason: str) -> None:
    state.request_stop(reason)
    stop.set()
