"""A run manager's life around the server process: what a previous server left, and what this one leaves.

At start, runs a previous server left queued or running are marked interrupted (once per process and store
file). At exit, every open manager stops its runs and records how they ended.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Protocol

from gradacc.serving.store import RunStore

log = logging.getLogger(__name__)

# At interpreter exit (SIGTERM from docker stop or a Space restart included), stop every run within its
# micro-batch and record it: a daemon thread still inside torch while Python finalises aborts the process
# ("terminate called without an active exception") and leaves its run to be found interrupted.
EXIT_SHUTDOWN_SECONDS = 5.0


class Stoppable(Protocol):
    """What exit asks of a run manager (``gradacc.serving.manager.RunManager``, which imports this module)."""

    def shutdown(self, timeout: float) -> bool: ...


_open_managers: "weakref.WeakSet[Stoppable]" = weakref.WeakSet()


def shut_down_at_exit(manager: Stoppable) -> None:
    """Stop ``manager``'s runs when the interpreter exits (if it is still open then)."""
    _open_managers.add(manager)


@atexit.register
def _shutdown_at_exit() -> None:
    for manager in list(_open_managers):
        try:
            manager.shutdown(timeout=EXIT_SHUTDOWN_SECONDS)
        except Exception:  # exiting anyway; one manager must not keep the others from stopping
            log.exception("could not shut a run manager down at exit")


_recover_lock = threading.Lock()
_recovered_stores: set[str] = set()


def recover_once(store: RunStore) -> None:
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
