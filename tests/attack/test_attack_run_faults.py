"""Faults during a run, seen from the app (engine-level NaN, OOM and exceptions are in test_attack_faults.py):
a NaN loss, an exception in a backend thread while another visitor waits, and Stop pressed in the middle of
an accumulation window (here for the three backends at engine level too).
"""

import threading

import pytest
from app_support import alerts, chart, open_app, points, run_until
from attack_support import nan_loss, sabotage
from support import wait_for

from gradacc.config import RunConfig
from gradacc.training.run.engine import train
from gradacc.events import Recorder

RUN_TIMEOUT_S = 120
BACKENDS = ["pytorch", "accelerate", "trainer"]
# 96 examples in micro-batches of 8, windows of 2: 6 optimizer steps per epoch.
SMALL = dict(train_samples=96, eval_samples=16, epochs=2, micro_batch_size=8, grad_accum_steps=2, max_seq_length=32)
# 400 examples in micro-batches of 4, windows of 8: the 11th training forward is the 3rd of window 2.
WINDOWED = dict(train_samples=400, eval_samples=16, epochs=1, micro_batch_size=4, grad_accum_steps=8,
                max_seq_length=32, dropout=0.0)
PAUSE_AT_FORWARD = 11


def settle(at, values: dict, backend: str | None = None):
    for field, value in values.items():
        at.number_input(key=f"form.train.{field}").set_value(value)
    if backend:
        at.radio(key="form.train.backend").set_value(backend)
    at.run()
    assert not at.button(key="start").disabled, alerts(at)
    return at


def start(at):
    at.button(key="start").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def status(at) -> str:
    return " | ".join(alerts(at))


def test_nan_loss_names_the_step_and_keeps_the_earlier_points_on_the_chart(app_home, monkeypatch, one_torch_thread):
    sabotage(monkeypatch, nan_loss, after_forwards=6)  # micro-batch 7 opens the 4th window
    at = start(settle(open_app(), SMALL))
    run_until(at, lambda at: bool(at.error), RUN_TIMEOUT_S, "the run to fail")
    assert at.error[0].value == "Failed: loss became NaN at step 4"
    assert points(chart(at, "Training loss")) == 3  # steps 1-3, logged before the NaN, are all drawn
    assert not at.button(key="start").disabled


def test_an_exception_in_a_backend_thread_fails_that_run_only(app_home, monkeypatch, one_torch_thread):
    """Visitor A's Accelerate run raises mid-training while visitor B's Trainer run waits behind it: A's run
    fails with a one-line reason, B's run (which needs the same Accelerate state lock) still completes."""
    def boom(output):
        raise RuntimeError("boom in the backend\nsecond line that must not reach the status")

    sabotage(monkeypatch, boom, after_forwards=3, seed=13)
    first, second = open_app(), open_app()
    start(settle(first, {**SMALL, "epochs": 1, "seed": 13}, backend="accelerate"))
    start(settle(second, {**SMALL, "epochs": 1, "train_samples": 48}, backend="trainer"))
    run_until(first, lambda at: bool(at.error), RUN_TIMEOUT_S, "A's run to fail")
    assert first.error[0].value == "Failed: RuntimeError: boom in the backend"
    # Completed (in yellow when its 3 steps taught the model nothing: the run warns).
    run_until(second, lambda at: bool(at.success or at.warning), RUN_TIMEOUT_S, "B's run to complete")
    assert "Completed: 3 optimizer steps" in [*second.success, *second.warning][0].value  # ceil(ceil(48/8)/2)
    # A is not stuck: a new run of theirs (another seed, not sabotaged) completes.
    start(settle(first, {"seed": 14, "train_samples": 48}))
    run_until(first, lambda at: bool(at.success or at.warning), RUN_TIMEOUT_S, "A's second run to complete")


@pytest.fixture
def pause_mid_window(monkeypatch):
    """The run blocks inside its 11th training forward (mid-window 2) until the test releases it."""
    reached, release, counter = threading.Event(), threading.Event(), {}

    def pause(output):
        if counter["n"] == PAUSE_AT_FORWARD:
            reached.set()
            release.wait(60)
        return output

    sabotage(monkeypatch, pause, counter=counter)
    yield reached, release, counter
    release.set()


def test_stop_pressed_mid_window_stops_within_the_micro_batch(app_home, pause_mid_window, one_torch_thread):
    reached, release, counter = pause_mid_window
    at = start(settle(open_app(), WINDOWED))
    wait_for(reached.is_set, RUN_TIMEOUT_S, "the 3rd micro-batch of window 2")
    at.run()
    at.button(key="stop").click().run()
    release.set()
    run_until(at, lambda at: bool(at.warning), 30, "the run to stop")
    assert at.warning[0].value.startswith("Stopped after 1 optimizer steps")
    assert at.warning[0].value.endswith("stopped by its owner.")
    assert counter["n"] == PAUSE_AT_FORWARD, "no micro-batch may start after Stop"
    assert points(chart(at, "Training loss")) == 1
    assert not at.button(key="start").disabled


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_stop_mid_window_ends_stopped_after_the_current_micro_batch(backend, pause_mid_window,
                                                                           one_torch_thread):
    reached, release, counter = pause_mid_window
    stop, recorder, result = threading.Event(), Recorder(), {}
    worker = threading.Thread(target=lambda: result.update(train(RunConfig(backend=backend, **WINDOWED), recorder,
                                                                 stop)))
    worker.start()
    wait_for(reached.is_set, RUN_TIMEOUT_S, "the 3rd micro-batch of window 2")
    stop.set()
    release.set()
    worker.join(60)
    assert not worker.is_alive()
    assert (result["status"], result["reason"], result["steps"]) == ("stopped", "stopped on request", 1)
    assert counter["n"] == PAUSE_AT_FORWARD
    assert [e["step"] for e in recorder.of("step")] == [1]
    assert not recorder.of("eval"), "a stopped run does not evaluate a half epoch"
