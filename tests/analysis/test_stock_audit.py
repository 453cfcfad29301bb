"""The Audit page's stock Trainer beside a visitor's run, in one process as on the server: neither changes the other.

The audit builds a model and a Trainer (Trainer's ``set_seed`` reseeds torch's generator; its Accelerator rewrites
Accelerate's process-wide accumulation state) on the server's audit thread while runs train on others. Here the
audit is made to start while the run is paused, between two of its steps or between its model's build and its
training, so the two meet every time, not by luck. Without ``gradacc.training.process_state``'s guard the run's
third loss differed (0.391 against 0.768 on Accelerate, 0.7668 against 0.7566 on Trainer); without the audit
keeping the generators, the run that waited for its training to start drew other dropout masks.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

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


def verdict() -> dict:
    """The audit's verdict without its clock (``*_seconds`` differ from one audit to the next)."""
    found = audit_stock_trainer(AUDIT).as_dict()
    return {key: value for key, value in found.items() if not key.endswith("_seconds")}


def waits_in_the_guard(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked taking ``process_state.guard`` (its innermost Python frame is the guard's)."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "guard" and frame.f_code.co_filename == process_state.__file__


@pytest.mark.parametrize("backend,pause", [("accelerate", MID_TRAINING), ("trainer", MID_TRAINING),
                                           ("accelerate", BEFORE_TRAINING)], ids=["accelerate-mid-training",
                                                                                  "trainer-mid-training",
                                                                                  "accelerate-before-training"])
def test_an_audit_started_mid_run_changes_neither_the_runs_losses_nor_its_own_verdict(backend, pause):
    config = RunConfig(backend=backend, **RUN).check()
    losses_alone, verdict_alone = run_losses(config), verdict()

    beside: dict = {}

    def audit() -> None:
        try:
            beside["verdict"] = verdict()
        except BaseException as error:  # noqa: BLE001 - reported by the assertions below
            beside["error"] = error

    auditor = threading.Thread(target=audit, name="audit", daemon=True)

    def start_the_audit_mid_run(event: dict) -> None:
        """The run pauses until the audit has either finished (all it did, it did while the run was mid-way) or
        waits for its turn."""
        kind, step = pause
        if event["event"] != kind or event.get("step") != step:
            return
        auditor.start()
        deadline = time.monotonic() + WAIT_S
        while auditor.is_alive() and not waits_in_the_guard(auditor):
            assert time.monotonic() < deadline, "the audit neither finished nor waited for its turn"
            time.sleep(0.02)

    losses_beside = run_losses(config, start_the_audit_mid_run)
    auditor.join(WAIT_S)
    assert not auditor.is_alive()
    assert "error" not in beside, beside.get("error")
    assert losses_beside == losses_alone
    assert beside["verdict"] == verdict_alone
