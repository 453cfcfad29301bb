"""Every run and every event it emitted, in one SQLite file, so a reload, a second tab or a restart
sees what happened.

One connection per ``RunStore`` guarded by a lock: the writes are tiny (one row per optimizer step),
so serialising them costs nothing, and WAL mode lets other processes (the CLI, a second server)
read while a run writes. ``busy_timeout`` makes a writer wait instead of failing when another
process holds the write lock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from gradacc import events as ev
from gradacc.paths import home

STORE_FILENAME = "runs.sqlite3"
BUSY_TIMEOUT_MS = 10_000
INTERRUPTED_REASON = "the server stopped while this run was live"
# Statuses of a run that has not ended yet.
LIVE_STATUSES = ("queued", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id  TEXT PRIMARY KEY,
    owner   TEXT NOT NULL,
    created REAL NOT NULL,
    status  TEXT NOT NULL,
    reason  TEXT,
    config  JSON NOT NULL,
    label   TEXT
);
CREATE TABLE IF NOT EXISTS events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    payload JSON NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""


def default_path() -> Path:
    return home() / STORE_FILENAME


class RunStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE), so a
        # read-then-write never has to upgrade its lock, which is where SQLite deadlocks.
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                     check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL under WAL survives a process crash; only a power cut can lose the last commits.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        with self._write() as conn:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    @contextmanager
    def _write(self):
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _read(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- runs -------------------------------------------------------------------------------

    def create_run(self, run_id: str, owner: str, config: dict, label: str | None = None,
                   status: str = "queued") -> None:
        with self._write() as conn:
            conn.execute("INSERT INTO runs (run_id, owner, created, status, reason, config, label) "
                         "VALUES (?, ?, ?, ?, NULL, ?, ?)",
                         (run_id, owner, time.time(), status, ev.to_json(config), label))

    def set_status(self, run_id: str, status: str, reason: str | None = None) -> None:
        with self._write() as conn:
            conn.execute("UPDATE runs SET status = ?, reason = ? WHERE run_id = ?", (status, reason, run_id))

    def get_run(self, run_id: str) -> dict | None:
        rows = self._read("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        return _run_dict(rows[0]) if rows else None

    def list_runs(self) -> list[dict]:
        """Every run, newest first."""
        return [_run_dict(row) for row in self._read("SELECT * FROM runs ORDER BY created DESC, run_id DESC")]

    def delete_run(self, run_id: str) -> bool:
        with self._write() as conn:
            conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            return conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount > 0

    def mark_interrupted(self) -> int:
        """At server start: a run still queued or running was cut off by the last shutdown or crash.

        Its events stay, so its curves still show up to where it stopped. Returns how many runs changed.
        """
        with self._write() as conn:
            return conn.execute(
                f"UPDATE runs SET status = ?, reason = ? WHERE status IN ({','.join('?' * len(LIVE_STATUSES))})",
                (ev.INTERRUPTED, INTERRUPTED_REASON, *LIVE_STATUSES)).rowcount

    # --- events -----------------------------------------------------------------------------

    def append_event(self, run_id: str, event: dict) -> int:
        """Write one event now (one commit per event) and keep runs.status in step; returns its seq."""
        kind = event.get("event", "")
        with self._write() as conn:
            # seq is computed inside the write transaction, so two writers can never take the same one.
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?",
                               (run_id,)).fetchone()[0]
            conn.execute("INSERT INTO events (run_id, seq, kind, payload) VALUES (?, ?, ?, ?)",
                         (run_id, seq, kind, ev.to_json(event)))
            if kind == ev.RUN_STARTED:
                conn.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", (run_id,))
            elif kind == ev.RUN_ENDED:
                conn.execute("UPDATE runs SET status = ?, reason = ? WHERE run_id = ?",
                             (event.get("status") or ev.FAILED, event.get("reason"), run_id))
        return seq

    def events(self, run_id: str, after_seq: int = 0) -> list[dict]:
        """The run's events in the order they happened; ``after_seq`` reads only newer ones."""
        rows = self._read("SELECT payload FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
                          (run_id, after_seq))
        return [json.loads(row["payload"]) for row in rows]


def _run_dict(row: sqlite3.Row) -> dict:
    run = dict(row)
    run["config"] = json.loads(run["config"])
    return run
