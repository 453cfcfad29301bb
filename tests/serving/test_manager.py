"""gradacc/serving/manager.py: the run queue, its slots and limits, stop and delete by owner, crash recovery."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gradacc import events as ev
from gradacc.config import ConfigErrors, RunConfig, ValidConfig
from gradacc.errors import GradaccError
from gradacc.serving.manager import RunManager, RunState, limit_reason
from gradacc.serving.store import INTERRUPTED_REASON, RunStore
from support import ROOT, wait_for

STEPS = 5


def started_event(config, steps: int) -> dict:
    return ev.run_started(config=config.to_dict(), effective_batch=config.effective_batch, total_steps=steps,
                          steps_per_epoch=steps, train_examples=100, eval_examples=20,
                          static_memory={"parameters": 4, "gradients": 4, "optimizer_state": 8, "total": 16},
                          device="cpu")


def step_event(config, step: int, elapsed_s: float) -> dict:
    return ev.step(step=step, epoch=0, samples_seen=step * config.effective_batch, tokens_seen=step * 100,
                   micro_batches=step * config.grad_accum_steps, loss=1.0 / step, grad_norm=1.0, lr=1e-3,
                   elapsed_s=elapsed_s, memory={"activation_bytes": 10, "rss_bytes": 20, "cuda_peak_bytes": None})


def fake_train(config, on_event, stop, *, steps: int = STEPS, step_seconds: float = 0.01, gate=None,
               fail_at: int | None = None):
    """Behaves like the engine: run_started, steps that honour ``stop``, an eval, run_ended."""
    started = time.monotonic()
    on_event(started_event(config, steps))
    for step in range(1, steps + 1):
        if gate is not None:
            gate.wait(10)
        if stop.is_set():
            return _end(on_event, "stopped", "stop requested", step - 1, started)
        if fail_at == step:
            raise RuntimeError(f"boom at step {step}\nsecond line of the traceback-ish message")
        time.sleep(step_seconds)
        on_event(step_event(config, step, elapsed_s=time.monotonic() - started))
    on_event(ev.eval_(epoch=0, step=steps, eval_loss=0.4, eval_accuracy=0.8, eval_f1=0.75))
    return _end(on_event, "completed", None, steps, started)


def _end(on_event, status, reason, steps, started):
    ended = ev.run_ended(status=status, reason=reason, steps=steps, wall_s=time.monotonic() - started)
    on_event(ended)
    return ended


@pytest.fixture
def make_manager(make_manager):
    """conftest's make_manager, training with ``fake_train`` unless told otherwise."""
    return lambda train_fn=fake_train, **options: make_manager(train_fn=train_fn, **options)


def gated_train(gate: threading.Event):
    return lambda config, on_event, stop: fake_train(config, on_event, stop, gate=gate)


def test_a_run_completes_with_every_event_in_memory_and_in_the_store(make_manager, store):
    manager = make_manager()
    run_id = manager.submit(RunConfig(micro_batch_size=2, grad_accum_steps=3), owner="alice", label="first")
    assert manager.wait(run_id, timeout=5)
    state = manager.get(run_id)
    assert (state.status, state.reason, state.label, state.owner) == ("completed", None, "first", "alice")
    assert [e["event"] for e in state.events] == ["run_started"] + ["step"] * STEPS + ["eval", "run_ended"]
    assert state.events == store.events(run_id)
    assert store.get_run(run_id)["status"] == "completed"
    assert state.config["micro_batch_size"] == 2
    assert state.progress() == (STEPS, STEPS)
    assert [e["loss"] for e in state.of(ev.STEP)] == [1.0 / s for s in range(1, STEPS + 1)]
    assert [e["eval_f1"] for e in state.of(ev.EVAL)] == [0.75]
    assert RunState("x", "bob", None, {}, "queued").of(ev.STEP) == []
    assert state.started["effective_batch"] == 6 and state.ended["status"] == "completed"
    assert state.eta_seconds() is None  # over


def test_bad_config_is_refused_at_submit_with_the_field_named(make_manager, store):
    manager = make_manager()
    with pytest.raises(GradaccError) as raised:
        manager.submit({"micro_batch_size": 0}, owner="alice")
    assert raised.value.field == "micro_batch_size"
    assert store.list_runs() == []


def test_fifo_queue_with_one_slot(make_manager):
    gate = threading.Event()
    manager = make_manager(train_fn=gated_train(gate), max_concurrent=1)
    first = manager.submit(RunConfig(), owner="alice")
    second = manager.submit(RunConfig(), owner="bob")
    third = manager.submit(RunConfig(), owner="bob")
    assert manager.get(first).status == "running"
    assert manager.get(second).status == "queued"
    assert (manager.queue_position(first), manager.queue_position(second), manager.queue_position(third)) == \
        (None, 1, 2)
    assert manager.any_live("bob") and not manager.any_live("carol")
    gate.set()
    assert manager.wait(third, timeout=5)
    runs = [manager.get(r) for r in (first, second, third)]
    assert [r.status for r in runs] == ["completed"] * 3
    # Each started only after the one before it ended.
    assert runs[0].ended["time"] <= runs[1].started["time"]
    assert runs[1].ended["time"] <= runs[2].started["time"]
    assert not manager.any_live()


def test_two_slots_run_two_at_once(make_manager):
    gate = threading.Event()
    manager = make_manager(train_fn=gated_train(gate), max_concurrent=2)
    ids = [manager.submit(RunConfig(), owner="alice") for _ in range(3)]
    wait_for(lambda: manager.get(ids[1]).started is not None, 5, "second run to start", every=0.005)
    assert [manager.get(r).status for r in ids] == ["running", "running", "queued"]
    gate.set()
    assert manager.wait(ids[2], timeout=5)


def test_only_the_owner_may_stop_a_running_run(make_manager):
    gate = threading.Event()
    manager = make_manager(train_fn=gated_train(gate))
    run_id = manager.submit(RunConfig(), owner="alice")
    wait_for(lambda: manager.get(run_id).started is not None, 5, "run_started", every=0.005)
    assert manager.stop(run_id, owner="mallory") is False
    assert manager.is_live(run_id)
    assert manager.stop(run_id, owner="alice") is True
    gate.set()
    assert manager.wait(run_id, timeout=5)
    state = manager.get(run_id)
    assert (state.status, state.reason) == ("stopped", "stopped by its owner")
    assert manager.stop(run_id, owner="alice") is False  # no longer live


def test_stopping_a_queued_run_ends_it_at_once(make_manager, store):
    gate = threading.Event()
    manager = make_manager(train_fn=gated_train(gate))
    first = manager.submit(RunConfig(), owner="alice")
    queued = manager.submit(RunConfig(), owner="bob")
    last = manager.submit(RunConfig(), owner="bob")
    assert manager.stop(queued, owner="alice") is False
    assert manager.stop(queued, owner="bob") is True
    assert not manager.is_live(queued)
    assert manager.queue_position(last) == 1
    state = manager.get(queued)
    assert state.status == "stopped" and state.started is None
    assert store.get_run(queued)["status"] == "stopped"
    gate.set()
    assert manager.wait(last, timeout=5)
    assert manager.get(first).status == manager.get(last).status == "completed"
    assert manager.get(queued).status == "stopped"  # never started later


def test_run_seconds_limit_stops_the_run_with_the_deployment_reason(make_manager, store):
    manager = make_manager(train_fn=lambda c, on_event, stop: fake_train(c, on_event, stop, steps=10_000,
                                                                        step_seconds=0.002),
                           max_run_seconds=0.2)
    run_id = manager.submit(RunConfig(), owner="alice")
    assert manager.wait(run_id, timeout=5)
    state = manager.get(run_id)
    assert (state.status, state.reason) == ("stopped", limit_reason(0.2))
    assert state.reason == "reached the deployment's limit of 0.2 s"
    assert 0 < state.progress()[0] < 10_000
    assert store.get_run(run_id)["reason"] == state.reason


def test_an_exception_in_train_fn_fails_the_run_and_keeps_earlier_events(make_manager, store):
    manager = make_manager(train_fn=lambda c, on_event, stop: fake_train(c, on_event, stop, fail_at=3))
    run_id = manager.submit(RunConfig(), owner="alice")
    assert manager.wait(run_id, timeout=5)
    state = manager.get(run_id)
    assert state.status == "failed"
    assert state.reason == "RuntimeError: boom at step 3"  # one line
    assert [e["step"] for e in state.of("step")] == [1, 2]
    assert state.ended["steps"] == 2
    stored = store.get_run(run_id)
    assert (stored["status"], stored["reason"]) == ("failed", "RuntimeError: boom at step 3")
    assert [e["event"] for e in store.events(run_id)] == ["run_started", "step", "step", "run_ended"]
    # The slot is freed: the next run still runs.
    manager._train_fn = fake_train
    assert manager.wait(manager.submit(RunConfig(), owner="alice"), timeout=5)


def test_a_train_fn_that_returns_without_run_ended_is_marked_failed(make_manager, store):
    manager = make_manager(train_fn=lambda config, on_event, stop: None)
    run_id = manager.submit(RunConfig(), owner="alice")
    assert manager.wait(run_id, timeout=5)
    reason = "the training function returned without ending the run"
    assert (manager.get(run_id).status, manager.get(run_id).reason) == ("failed", reason)
    assert (store.get_run(run_id)["status"], store.get_run(run_id)["reason"]) == ("failed", reason)


def test_a_new_manager_on_the_same_db_marks_a_crashed_run_interrupted(store, tmp_path):
    # A real crash: a child process runs a manager and is killed mid-run with os._exit.
    child = textwrap.dedent(f"""
        import os, threading, time
        from gradacc import events as ev
        from gradacc.config import RunConfig
        from gradacc.serving.manager import RunManager
        from gradacc.serving.store import RunStore

        def train(config, on_event, stop):
            on_event(ev.run_started(config=config.to_dict(), effective_batch=32, total_steps=100,
                                    steps_per_epoch=100, train_examples=1, eval_examples=1,
                                    static_memory={{}}, device="cpu"))
            for step in (1, 2, 3):
                on_event(ev.step(step=step, epoch=0, samples_seen=step, tokens_seen=step, micro_batches=step,
                                 loss=0.5, grad_norm=1.0, lr=0.1, elapsed_s=0.1, memory={{}}))
            stepped.set()
            stop.wait(30)

        stepped = threading.Event()
        manager = RunManager(RunStore({str(store.path)!r}), train_fn=train)
        run_id = manager.submit(RunConfig(), owner="alice")
        queued = manager.submit(RunConfig(), owner="alice")
        stepped.wait(30)
        print(run_id, queued, flush=True)
        time.sleep(30)
    """)
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        run_id, queued = process.stdout.readline().split()  # printed once three steps are stored
        assert store.get_run(run_id)["status"] == "running"
    finally:
        process.kill()
        process.wait(10)

    manager = RunManager(RunStore(store.path), train_fn=fake_train)
    for crashed in (run_id, queued):
        state = manager.get(crashed)
        assert (state.status, state.reason) == ("interrupted", INTERRUPTED_REASON)
        assert not manager.is_live(crashed)
    assert [e["step"] for e in manager.get(run_id).of("step")] == [1, 2, 3]
    assert {s.run_id: s.status for s in manager.runs()} == {run_id: "interrupted", queued: "interrupted"}


def test_a_second_manager_in_the_same_process_leaves_live_runs_alone(make_manager, store):
    gate = threading.Event()
    first = make_manager(train_fn=gated_train(gate))
    run_id = first.submit(RunConfig(), owner="alice")
    second = make_manager()  # e.g. Streamlit re-creating its cached resource
    assert second.get(run_id).status == "running"
    gate.set()
    assert first.wait(run_id, timeout=5)
    assert store.get_run(run_id)["status"] == "completed"


def test_runs_lists_live_and_stored_runs_newest_first(make_manager, store):
    store.create_run("20000101-000000-old", "carol", {"backend": "pytorch"}, "from the store")
    store.set_status("20000101-000000-old", "completed")
    gate = threading.Event()
    manager = make_manager(train_fn=gated_train(gate))
    live = manager.submit(RunConfig(), owner="alice")
    runs = manager.runs()
    assert [r.run_id for r in runs] == [live, "20000101-000000-old"]
    assert runs[0] is manager.get(live)  # the live object, not a stale copy
    assert runs[1].label == "from the store" and runs[1].events == []
    gate.set()


def test_shutdown_stops_everything_and_joins_every_thread(make_manager):
    threads = []

    def train(config, on_event, stop):
        threads.append(threading.current_thread())
        return fake_train(config, on_event, stop, steps=10_000)

    manager = make_manager(train_fn=train, max_concurrent=2, max_run_seconds=60)
    running = [manager.submit(RunConfig(), owner="alice") for _ in range(2)]
    queued = manager.submit(RunConfig(), owner="alice")
    wait_for(lambda: len(threads) == 2, 5, "two workers", every=0.005)
    assert manager.shutdown(timeout=5) is True
    assert threads and not any(t.is_alive() for t in threads)
    assert not [t for t in threading.enumerate() if t.name.startswith(("gradacc-run-", "gradacc-limit-"))]
    assert [manager.get(r).status for r in running] == ["stopped", "stopped"]
    assert manager.get(running[0]).reason == "the server shut down while this run was running"
    assert manager.get(queued).status == "stopped"
    with pytest.raises(GradaccError):
        manager.submit(RunConfig(), owner="alice")


def test_finished_threads_are_joined(make_manager):
    manager = make_manager()
    runs = [manager.submit(RunConfig(), owner="alice") for _ in range(2)]
    for run_id in runs:
        assert manager.wait(run_id, timeout=5)
    names = [f"gradacc-run-{run_id}" for run_id in runs]
    wait_for(lambda: not [t for t in threading.enumerate() if t.name in names], 5, "both run threads to end",
             every=0.005)
    with manager._lock:
        # The second run ended last: nothing has reaped its thread yet (the first one's went at the second's start,
        # or is still listed), and a reap joins every ended thread.
        assert f"gradacc-run-{runs[1]}" in [t.name for t in manager._ended_threads]
        manager._reap()
        assert manager._ended_threads == []


def test_eta_is_the_pace_so_far_times_the_steps_left(make_manager):
    """None before the first step and once the run is over; in between, elapsed / done × (total − done)."""
    go, release = threading.Event(), threading.Event()

    def train(config, on_event, stop):
        on_event(started_event(config, steps=4))
        go.wait(10)
        on_event(step_event(config, 1, elapsed_s=2.0))
        on_event(step_event(config, 2, elapsed_s=3.0))
        release.wait(10)
        return _end(on_event, "completed", None, 2, time.monotonic())

    manager = make_manager(train_fn=train)
    run_id = manager.submit(RunConfig(), owner="alice")
    state = manager.get(run_id)
    wait_for(lambda: state.started is not None, 5, "run_started", every=0.005)
    assert (state.status, state.progress(), state.eta_seconds()) == ("running", (0, 4), None)
    go.set()
    wait_for(lambda: state.progress()[0] == 2, 5, "two steps", every=0.005)
    assert state.eta_seconds() == 3.0  # 3.0 s for 2 steps, 2 steps left
    release.set()
    assert manager.wait(run_id, 5)
    assert state.eta_seconds() is None


def test_events_are_copied_on_read(make_manager):
    manager = make_manager()
    run_id = manager.submit(RunConfig(), owner="alice")
    manager.wait(run_id, 5)
    state = manager.get(run_id)
    state.events.clear()
    assert len(state.events) == STEPS + 3


def test_delete_only_by_owner_and_only_when_over(make_manager, store):
    manager = make_manager()
    run_id = manager.submit(RunConfig(), owner="alice")
    manager.wait(run_id, 5)
    assert manager.delete(run_id, owner="bob") is False
    assert manager.delete(run_id, owner="alice") is True
    assert manager.get(run_id) is None and store.events(run_id) == []


def test_slots_and_run_limit_come_from_the_environment(make_manager, monkeypatch):
    """Only that the values reach the manager; every bad value's sentence is tested in test_limits.py."""
    assert make_manager().max_run_seconds == 600  # unset: the default limit
    monkeypatch.setenv("GRADACC_MAX_CONCURRENT_RUNS", "3")
    monkeypatch.setenv("GRADACC_MAX_RUN_SECONDS", "0")  # 0: no limit
    manager = make_manager()
    assert (manager.max_concurrent, manager.max_run_seconds) == (3, 0)
    for name, raw in (("GRADACC_MAX_CONCURRENT_RUNS", "zero"), ("GRADACC_MAX_RUN_SECONDS", "soon")):
        monkeypatch.setenv(name, raw)
        with pytest.raises(GradaccError, match=f"^{name} must be"):
            make_manager()
        monkeypatch.delenv(name)


def test_the_run_trains_the_config_submit_checked_and_leaves_the_callers_as_it_was(make_manager):
    trained = []

    def recording_train(config, on_event, stop):
        trained.append(config)
        return fake_train(config, on_event, stop)

    manager = make_manager(recording_train)
    submitted = RunConfig(micro_batch_size=2, grad_accum_steps=3.0)
    run_id = manager.submit(submitted, owner="alice")
    assert manager.wait(run_id, timeout=5)
    assert submitted.epochs is None and type(submitted) is RunConfig  # the caller's config, untouched
    assert isinstance(trained[0], ValidConfig) and type(trained[0].grad_accum_steps) is int
    assert trained[0].epochs is not None
    # A ValidConfig (the Train page's) is trained as it is: the very object, not a copy checked again.
    checked = RunConfig(micro_batch_size=2).check()
    assert manager.wait(manager.submit(checked, owner="alice"), timeout=5)
    assert trained[1] is checked


def test_a_bad_config_is_refused_at_submit_with_every_field(make_manager):
    manager = make_manager(fake_train)
    with pytest.raises(ConfigErrors) as raised:
        manager.submit(RunConfig(micro_batch_size=0, grad_accum_steps=0), owner="alice")
    assert set(raised.value.by_field) == {"micro_batch_size", "grad_accum_steps"}
