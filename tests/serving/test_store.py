import json
import sqlite3
import threading
import time

import pytest

from gradacc import events as ev
from gradacc.serving.store import INTERRUPTED_REASON, RunStore


def step_event(step: int, loss: float = 0.5) -> dict:
    return ev.step(step=step, epoch=0, samples_seen=8 * step, tokens_seen=512 * step, micro_batches=4 * step,
                   loss=loss, grad_norm=1.0, lr=1e-3, elapsed_s=0.1 * step,
                   memory={"activation_bytes": 1000, "rss_bytes": 2000, "cuda_peak_bytes": None})


def test_default_path_is_under_gradacc_home_and_uses_wal(store, tmp_path):
    assert store.path == tmp_path / "home" / "runs.sqlite3"
    assert store.path.exists()
    mode = sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_create_list_and_config_round_trip(store):
    store.create_run("a", "alice", {"backend": "pytorch", "micro_batch_size": 8}, "first")
    store.create_run("b", "bob", {"backend": "trainer"}, None)
    runs = store.list_runs()
    assert [r["run_id"] for r in runs] == ["b", "a"]  # newest first
    first = store.get_run("a")
    assert first["owner"] == "alice" and first["label"] == "first" and first["status"] == "queued"
    assert first["config"] == {"backend": "pytorch", "micro_batch_size": 8}
    assert store.get_run("missing") is None


def test_events_keep_order_and_drive_status(store):
    store.create_run("a", "alice", {}, None)
    store.append_event("a", {"event": ev.RUN_STARTED, "time": time.time(), "total_steps": 3})
    assert store.get_run("a")["status"] == "running"
    for step in (1, 2, 3):
        store.append_event("a", step_event(step))
    store.append_event("a", ev.run_ended(status="stopped", reason="enough", steps=3, wall_s=1.0))
    run = store.get_run("a")
    assert (run["status"], run["reason"]) == ("stopped", "enough")
    kinds = [e["event"] for e in store.events("a")]
    assert kinds == ["run_started", "step", "step", "step", "run_ended"]
    assert [e["step"] for e in store.events("a", after_seq=2)[:2]] == [2, 3]
    assert store.events("a")[1]["cuda_peak_bytes"] is None
    assert len(store.events("a")) == 5


def test_nan_loss_survives_the_round_trip(store):
    store.create_run("a", "alice", {}, None)
    store.append_event("a", step_event(1, loss=float("nan")))
    loss = store.events("a")[0]["loss"]
    assert loss != loss  # NaN


def test_set_status_and_delete(store):
    store.create_run("a", "alice", {}, None)
    store.append_event("a", step_event(1))
    store.set_status("a", "failed", "boom")
    assert store.get_run("a")["reason"] == "boom"
    assert store.delete_run("a") is True
    assert store.get_run("a") is None and store.events("a") == []
    assert store.delete_run("a") is False


def test_mark_interrupted_only_touches_live_runs_and_keeps_events(store):
    for run_id, status in (("q", "queued"), ("r", "running"), ("c", "completed")):
        store.create_run(run_id, "alice", {}, None)
        store.set_status(run_id, status)
    store.append_event("r", step_event(1))
    assert store.mark_interrupted() == 2
    status = {r["run_id"]: (r["status"], r["reason"]) for r in store.list_runs()}
    assert status == {"q": ("interrupted", INTERRUPTED_REASON), "r": ("interrupted", INTERRUPTED_REASON),
                      "c": ("completed", None)}
    assert len(store.events("r")) == 1


def test_survives_reopen(store):
    store.create_run("a", "alice", {"x": 1}, None)
    store.append_event("a", step_event(1))
    store.close()
    again = RunStore(store.path)
    assert again.get_run("a")["config"] == {"x": 1}
    assert again.events("a")[0]["step"] == 1
    again.close()


@pytest.mark.parametrize("shared_connection", [True, False], ids=["one-store", "store-per-thread"])
def test_concurrent_appends_from_five_threads_do_not_corrupt(store, shared_connection):
    threads_n, per_thread = 5, 100
    for t in range(threads_n):
        store.create_run(f"own-{t}", "alice", {}, None)
    store.create_run("shared", "alice", {}, None)
    errors = []

    def append(t: int):
        target = store if shared_connection else RunStore(store.path)
        try:
            for i in range(per_thread):
                target.append_event(f"own-{t}", step_event(i + 1))
                target.append_event("shared", {**step_event(i + 1), "writer": t})
        except Exception as error:  # reported below: an exception in a thread would pass silently
            errors.append(error)
        finally:
            if target is not store:
                target.close()

    threads = [threading.Thread(target=append, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    for t in range(threads_n):
        assert [e["step"] for e in store.events(f"own-{t}")] == list(range(1, per_thread + 1))
    shared = store.events("shared")
    assert len(shared) == threads_n * per_thread
    for t in range(threads_n):  # each writer's events stay in its own order
        assert [e["step"] for e in shared if e["writer"] == t] == list(range(1, per_thread + 1))
    seqs = [row[0] for row in sqlite3.connect(store.path).execute(
        "SELECT seq FROM events WHERE run_id = 'shared' ORDER BY seq")]
    assert seqs == list(range(1, threads_n * per_thread + 1))
    assert sqlite3.connect(store.path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_each_event_is_committed_at_its_append_in_wal_mode_with_synchronous_normal(store):
    """One event per optimizer step, each its own commit: another connection (another server, the CLI) reads each
    event right after its append, and nothing waits for the disk on a commit: WAL with synchronous=NORMAL, which
    fsyncs only at checkpoints (SQLite's documented behaviour; no timing here)."""
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    store.create_run("a", "alice", {}, None)
    reader = sqlite3.connect(store.path)
    try:
        for step in range(1, 6):
            seq = store.append_event("a", step_event(step))
            seen = reader.execute("SELECT seq, payload FROM events WHERE run_id = 'a' ORDER BY seq").fetchall()
            assert [row[0] for row in seen] == list(range(1, step + 1)) and seen[-1][0] == seq
            assert json.loads(seen[-1][1])["step"] == step
    finally:
        reader.close()