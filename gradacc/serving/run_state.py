"""One run as the app sees it (``RunState``), and the reasons the run manager gives when it ends a run.

No torch here: the page reads these while a worker thread appends.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from gradacc import events as ev
from gradacc.serving.store import LIVE_STATUSES

STOPPED_BY_OWNER = "stopped by its owner"
STOPPED_BEFORE_START = "stopped before it started"
SHUTDOWN_BEFORE_START = "the server shut down before this run started"
SHUTDOWN_WHILE_RUNNING = "the server shut down while this run was running"
NO_RUN_ENDED = "the training function returned without ending the run"


# A session that took no snapshot for this long no longer counts as watching (longer than the slowest poll).
WATCHERS_WINDOW_S = 12.0


def limit_reason(seconds: float) -> str:
    return f"reached the deployment's limit of {seconds:g} s"


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
        self._shared_snapshot: tuple[float, RunState] | None = None  # (monotonic time taken, snapshot)
        self._by_kind: dict[str, tuple[int, list[dict]]] = {}  # kind -> (events scanned, those of the kind)
        self._viewers: dict[str, float] = {}  # session id -> monotonic time of its latest snapshot
        self.clock = time.monotonic  # what "lately" and a snapshot's age are measured with (tests step their own)
        # What the run is getting ready with before its first event (``RunOptions.on_phase``), and since when.
        self.phase: tuple[str, float] | None = None

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
            self._load()
            return list(self._events)

    def _load(self) -> None:
        if self._load_events is not None:
            self._events, self._load_events = self._load_events(), None
            self._by_kind = {}

    def of(self, kind: str) -> list[dict]:
        """The events of one kind, in order (a copy). Kept per kind and extended with what came since: every
        watching page asks for the steps each poll, and a long run has tens of thousands of events."""
        with self._lock:
            self._load()
            seen, found = self._by_kind.get(kind, (0, []))
            found.extend(e for e in self._events[seen:] if e.get("event") == kind)
            self._by_kind[kind] = (len(self._events), found)
            return list(found)

    def watchers(self, within: float = WATCHERS_WINDOW_S) -> int:
        """How many sessions took a snapshot of this run in the last ``within`` seconds."""
        now = self.clock()
        since, forget_before = now - within, now - max(within, WATCHERS_WINDOW_S)
        with self._lock:
            # Forget sessions gone for longer than the window: a run watched by a talk's room for an hour would
            # otherwise keep every visitor it ever had.
            self._viewers = {viewer: seen for viewer, seen in self._viewers.items() if seen >= forget_before}
            return sum(1 for seen in self._viewers.values() if seen >= since)

    def snapshot(self, reuse_for: float = 0.0, viewer: str | None = None) -> "RunState":
        """This run frozen now: a page that draws its status and its charts from one snapshot shows the same
        step in both (the worker keeps appending to the live state meanwhile).

        ``reuse_for`` seconds: hand out the same snapshot again while it is younger than that and the status has
        not changed. Every page watching a live run then draws the same events in that time, so their figures
        are built once for all of them (the figure cache is keyed by the event count), however fast steps come.
        """
        now = self.clock()
        with self._lock:
            if viewer is not None:  # a watching page: counted by ``watchers``
                self._viewers[viewer] = now
            shared = self._shared_snapshot
            if shared is not None and now - shared[0] < reuse_for and shared[1].status == self.status:
                return shared[1]
            status, reason = self.status, self.reason
        fresh = RunState(self.run_id, self.owner, self.label, self.config, status, reason, self.created,
                         events=self.events)
        fresh.phase, fresh.clock = self.phase, self.clock
        with self._lock:
            self._shared_snapshot = (now, fresh)
        return fresh

    @property
    def started(self) -> dict | None:
        found = self.of(ev.RUN_STARTED)
        return found[0] if found else None

    @property
    def ended(self) -> dict | None:
        found = self.of(ev.RUN_ENDED)
        return found[-1] if found else None

    def progress(self) -> tuple[int, int | None]:
        """(optimizer steps done, total steps or None before run_started)."""
        steps = self.of(ev.STEP)
        done = steps[-1]["step"] if steps else 0
        return done, (self.started or {}).get("total_steps")

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

    def phase_text(self) -> str | None:
        """'tokenising 32,000 texts… 2 s' while the run prepares (it has no run_started yet); else None."""
        if self.phase is None or self.started is not None or not self.is_live:
            return None
        text, since = self.phase
        return f"{text}… {max(0.0, self.clock() - since):.0f} s"

    # --- written by the run manager only -------------------------------------------------------

    def set_phase(self, text: str) -> None:
        self.phase = (text, self.clock())

    def record(self, event: dict) -> dict:
        """Append ``event`` and update the status; return it as recorded.

        A ``run_ended`` with status stopped gets the reason the run was asked to stop for: the engine only
        knows that it was asked, the manager knows why.
        """
        with self._lock:
            if event.get("event") == ev.RUN_ENDED and event.get("status") == ev.STOPPED and self._stop_reason:
                event = {**event, "reason": self._stop_reason}
            self._events.append(event)
            kind = event.get("event")
            if kind == ev.RUN_STARTED:
                self.status = "running"
            elif kind == ev.RUN_ENDED:
                self.status, self.reason = event.get("status") or ev.FAILED, event.get("reason")
        return event

    def request_stop(self, reason: str) -> None:
        """Remember why the run is being stopped; the first cause wins (a run stopped by its owner that then
        hits the time limit was stopped by its owner)."""
        with self._lock:
            self._stop_reason = self._stop_reason or reason

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason
