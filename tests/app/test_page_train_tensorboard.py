"""The Train page offers a finished run's TensorBoard event files, built from the store (older runs too)."""

import io
import zipfile

import numpy as np
from app_support import APP, SCRIPT_TIMEOUT_S
from streamlit.testing.v1 import AppTest

from gradacc import events as ev
from gradacc.config import RunConfig
from gradacc.serving.store import RunStore

RUN_ID = "20250101-120000-0ld0ne"


def store_an_old_run(home) -> list[dict]:
    """A run as the store held it before any export existed: its events, nothing else."""
    config = RunConfig().to_dict()
    run_events = [ev.run_started(config=config, effective_batch=32, total_steps=2, steps_per_epoch=2,
                                 train_examples=64, eval_examples=16, static_memory={"total": 1}, device="cpu")]
    for step in (1, 2):
        run_events.append(ev.step(step=step, epoch=1, samples_seen=32 * step, tokens_seen=400 * step,
                                  micro_batches=4, loss=0.7 - 0.1 * step, grad_norm=1.5, lr=1e-3, elapsed_s=step,
                                  memory={"activation_bytes": 1000, "rss_bytes": 2000, "cuda_peak_bytes": None}))
    run_events.append(ev.eval_(epoch=1, step=2, eval_loss=0.6, eval_accuracy=0.75, eval_f1=0.7))
    run_events.append(ev.run_ended(status=ev.COMPLETED, reason=None, steps=2, wall_s=2.0))
    store = RunStore(home / "runs.sqlite3")
    store.create_run(RUN_ID, "someone-else", config, "an old run")
    for event in run_events:
        store.append_event(RUN_ID, event)
    store.close()
    return run_events


def test_a_finished_run_offers_its_tensorboard_files(app_home, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gradacc.app import runview
    from gradacc.app import server

    run_events = store_an_old_run(app_home)
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S)
    at.query_params["run"] = RUN_ID
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Completed: 2 optimizer steps" in " ".join(s.value for s in at.success)
    buttons = [b for b in at.get("download_button") if b.proto.label == "Download for TensorBoard"]
    assert len(buttons) == 1

    data = runview.tensorboard_zip(server.run_manager().get(RUN_ID))  # what the button serves when clicked
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(tmp_path)
    accumulator = EventAccumulator(str(tmp_path / RUN_ID))
    accumulator.Reload()
    assert [(s.step, round(s.value, 6)) for s in accumulator.Scalars("train/loss")] == [(1, 0.6), (2, 0.5)]
    assert [s.value for s in accumulator.Scalars("eval/f1")] == [np.float32(0.7)]  # TensorBoard keeps float32
    assert run_events[-1]["status"] == ev.COMPLETED


def test_no_download_before_a_run(app_home):
    at = AppTest.from_file(APP, default_timeout=SCRIPT_TIMEOUT_S).run()
    assert not at.exception
    assert not [b for b in at.get("download_button") if b.proto.label == "Download for TensorBoard"]
