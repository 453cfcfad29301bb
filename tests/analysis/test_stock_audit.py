"""The Audit page's stock Trainer beside a visitor's run, in one process as on the server: neither changes the other.

The audit builds a model and a Trainer (Trainer's ``set_seed`` reseeds torch's generator; its Accelerator rewrites
Accelerate's process-wide accumulation state) on the server's audit thread while runs train on others. Here the
audit is made to start while the run is paused, between two of its steps or between its model's build and its
training, and the audit waits inside its first forward until the run has moved, so the two meet every time, not
by luck. Without ``gradacc.training.process_state``'s guard the run's third loss differed (about 0.39 against 0.768
on Accelerate, about 0.766 against 0.7566 on Trainer, 0.7714 against 0.7683 on the plain PyTorch loop) and the
first of the run paused before training (0.695 against 0.6932); with the guard but without the audit training
alone, the plain PyTorch run's; without the audit keeping the generators, the first of the run paused before
training.
"""

from __future__ import annotations

import threading
import time

import pytest
from transformers import TrainerCallback

from gradacc import events
from gradacc.analysis.stock_audit import audit_stock_trainer
from gradacc.config import RunConfig
from gradacc.training import process_state
from gradacc.training.run.engine import train

RUN = dict(model="tiny-bert", train_samples=64, eval_samples=16, epochs=1, micro_batch_size=4, grad_accum_steps=2,
           max_seq_length=32)  # dropout stays the recipe's 0.1: the run draws from torch's generator as it trains
AUDIT = RunConfig(model="tiny-bert", micro_batch_size=2, grad_accum_steps=4, max_seq_length=32)
# Where the run pauses for the audit: its announcement (its model built, its training not begun), or a step (of 8).
BEFORE_TRAINING, MID_TRAINING = (events.RUN_STARTED, None), (events.STEP, 2)
WAIT_S = 120  # only against a hang: every wait ends on an outcome


def run_losses(config: RunConfig, on_event=None) -> list[float]:
    steps = []

    def record(event: dict) -> None:
        if event["event"] == events.STEP:
            steps.append(event["loss"])
        if on_event is not None:
            on_event(event)

    ended = train(config, record)
    assert ended["status"] == events.COMPLETED, ended["reason"]
    return steps


def verdict(callbacks=()) -> dict:
    """The audit's verdict without its clock (``*_seconds`` differ from one audit to the next)."""
    found = audit_stock_trainer(AUDIT, callbacks=callbacks).as_dict()
    return {key: value for key, value in found.items() if not key.endswith("_seconds")}


class PausedInItsFirstForward(TrainerCallback):
    """The audit, inside its model's first training forward (after the embeddings' dropout, before the layers'),
    says so and waits until the run has moved or waits for its turn (it runs on the test's main thread): what the
    run draws meanwhile lands between the audit's dropout masks, as it did by chance beside a run (3 of 6 audits
    "not judged")."""

    def __init__(self, inside: threading.Event, run_moved: threading.Event):
        self.inside, self.run_moved = inside, run_moved

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def pause(module, inputs, output):
            if module.training and not self.inside.is_set():
                self.inside.set()
                deadline = time.monotonic() + WAIT_S
                while not self.run_moved.is_set() and threading.main_thread().name not in process_state.waiting():
                    assert time.monotonic() < deadline, "the run neither moved nor waited for its turn"
                    time.sleep(0.02)

        model.base_model.embeddings.register_forward_hook(pause)


@pytest.mark.parametrize("backend,pause", [("accelerate", MID_TRAINING), ("trainer", MID_TRAINING),
                                           ("pytorch", MID_TRAINING), ("accelerate", BEFORE_TRAINING)],
                         ids=["accelerate-mid-training", "trainer-mid-training", "pytorch-mid-training",
                              "accelerate-before-training"])
def test_an_audit_started_mid_run_changes_neither_the_runs_losses_nor_its_own_verdict(backend, pause):
    config = RunConfig(backend=backend, **RUN).check()
    losses_alone, verdict_alone = run_losses(config), verdict()

    beside: dict = {}
    inside, run_moved = threading.Event(), threading.Event()

    def audit() -> None:
        try:
            beside["verdict"] = verdict([PausedInItsFirstForward(inside, run_moved)])
        except BaseException as error:  # noqa: BLE001 - reported by the assertions below
            beside["error"] = error

    auditor = threading.Thread(target=audit, name="audit", daemon=True)

    def start_the_audit_mid_run(event: dict) -> None:
        """The run pauses until the audit has finished (all it did, it did while the run was mid-way), waits for its
        turn, or waits inside its first forward for the run's next step."""
        if auditor.ident is not None and event["event"] == events.STEP:
            run_moved.set()
        kind, step = pause
        if event["event"] != kind or event.get("step") != step:
            return
        auditor.start()
        deadline = time.monotonic() + WAIT_S
        while auditor.is_alive() and auditor.name not in process_state.waiting() and not inside.is_set():
            assert time.monotonic() < deadline, "the audit neither finished nor waited for its turn"
            time.sleep(0.02)

    losses_beside = run_losses(config, start_the_audit_mid_run)
    run_moved.set()  # it has ended
    auditor.join(WAIT_S)
    assert not auditor.is_alive()
    assert "error" not in beside, beside.get("error")
    assert losses_beside == losses_alone
    assert beside["verdict"] == verdict_alone
