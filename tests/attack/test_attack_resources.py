"""Resources a public server must get back: wall-clock time (the deployment's max run seconds, cold start
included), threads, and memory after many runs.

Figures (printed with ``-s``): RSS before and after 10 runs in a row, and how long a run past its limit
took to end.
"""

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import psutil
from attack_support import TINY
from support import ROOT, wait_for

from gradacc.training.sources import data as data_module
from gradacc.training.run import engine
from gradacc.training.sources import models
from gradacc.config import RunConfig
from gradacc.serving.manager import FINISHED_CACHE_SIZE, limit_reason

RUN_TIMEOUT_S = 120
SLOW_PHASE_S = 1.0
LIMIT_S = 0.5
TRAINING_LIMIT_S = 4
BACKENDS = ["pytorch", "accelerate", "trainer"]


def run_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("gradacc-run-", "gradacc-limit-"))]


def test_a_slow_prepare_is_cut_at_the_limit_not_after_preparing_everything(make_manager, monkeypatch,
                                                                           one_torch_thread):
    """Loading the model and tokenising each take a second here (a download, a big file); the limit is half
    a second. The run must end at the first phase boundary after the limit: before tokenising at all."""
    slow_load, slow_tokenize = models.load, data_module.tokenize
    tokenized = []

    def load(*args, **kwargs):
        time.sleep(SLOW_PHASE_S)
        return slow_load(*args, **kwargs)

    def tokenize(*args, **kwargs):
        tokenized.append(1)
        time.sleep(SLOW_PHASE_S)
        return slow_tokenize(*args, **kwargs)

    # Warm up first (no limit): the slow phases below are the only slow thing in the measured run.
    warm = make_manager(max_run_seconds=0)
    warm.wait(warm.submit(RunConfig(**TINY), owner="visitor"), timeout=RUN_TIMEOUT_S)
    manager = make_manager(max_run_seconds=LIMIT_S)
    monkeypatch.setattr(models, "load", load)
    monkeypatch.setattr(data_module, "tokenize", tokenize)
    started = time.monotonic()
    run_id = manager.submit(RunConfig(**TINY), owner="visitor")
    assert manager.wait(run_id, timeout=RUN_TIMEOUT_S)
    took = time.monotonic() - started
    state = manager.get(run_id)
    assert (state.status, state.reason) == ("stopped", limit_reason(LIMIT_S))
    assert state.started is None and state.progress()[0] == 0, "nothing may train after the limit"
    assert not tokenized, "the limit passed while the model loaded: tokenising must not start"
    # What ended it is the boundary after the model's load, not a time: how long it took is printed only.
    print(f"limit {LIMIT_S} s, slow phase {SLOW_PHASE_S} s: the run ended after {took:.2f} s")


def test_a_run_is_stopped_at_the_limit_while_training(make_manager, monkeypatch, one_torch_thread):
    """The limit stops the run within its micro-batch: at most the one training forward that was starting when
    the limit passed may begin after it (the engine checks for a stop between micro-batches)."""
    stops, late_forwards = [], []
    original = models.load

    def counted_load(*args, **kwargs):
        loaded = original(*args, **kwargs)

        def before_forward(module, inputs):
            if module.training and stops[-1].is_set():
                late_forwards.append(1)

        loaded.model.register_forward_pre_hook(before_forward)
        return loaded

    def train(config, on_event, stop):
        stops.append(stop)  # the run's own stop event, which the limit sets
        return engine.train(config, on_event, stop)

    monkeypatch.setattr(models, "load", counted_load)
    manager = make_manager(train_fn=train, max_run_seconds=TRAINING_LIMIT_S)
    # Warm up first, so the limit passes while training and not while importing.
    manager.wait(manager.submit(RunConfig(**TINY), owner="visitor"), timeout=RUN_TIMEOUT_S)
    started = time.monotonic()
    run_id = manager.submit(RunConfig(**{**TINY, "train_samples": 400, "epochs": 1000, "micro_batch_size": 4,
                                         "grad_accum_steps": 1}), owner="visitor")
    assert manager.wait(run_id, timeout=RUN_TIMEOUT_S)
    took = time.monotonic() - started
    state = manager.get(run_id)
    assert (state.status, state.reason) == ("stopped", limit_reason(TRAINING_LIMIT_S))
    assert 0 < state.progress()[0] < state.started["total_steps"]
    assert stops[-1].is_set() and len(late_forwards) <= 1, f"{len(late_forwards)} micro-batches began after the limit"
    completed_epochs = state.progress()[0] // state.started["steps_per_epoch"]
    assert len(state.of("eval")) == completed_epochs, "no evaluation of the epoch the limit cut short"
    print(f"limit {TRAINING_LIMIT_S} s while training: the run ended after {took:.2f} s")


COLD_CHILD = textwrap.dedent("""
    import json, sys, time
    import gradacc.training.run.job as job
    import gradacc.serving.manager as runner  # light: torch is imported by the run's own thread
    from gradacc.config import RunConfig
    from gradacc.serving.store import RunStore

    assert "torch" not in sys.modules and "transformers" not in sys.modules
    prepare, entered = job.prepare, {}

    def timed_prepare(*args, **kwargs):
        entered["at"] = time.monotonic()  # transformers and torch are imported by now (if the limit let it run)
        return prepare(*args, **kwargs)

    job.prepare = timed_prepare
    manager = runner.RunManager(RunStore(), max_run_seconds=float(sys.argv[1]))
    started = time.monotonic()
    run_id = manager.submit(RunConfig(**json.loads(sys.argv[2])), owner="visitor")
    manager.wait(run_id, timeout=300)
    ended = time.monotonic()
    state = manager.get(run_id)
    print(json.dumps({"status": state.status, "reason": state.reason, "steps": state.progress()[0],
                      "announced": state.started is not None, "prepare_entered": "at" in entered,
                      "total_s": ended - started}))
""")


def test_a_cold_start_past_the_limit_never_announces_or_steps(tmp_path):
    """A fresh server: the run's thread imports transformers and torch (seconds) under a 1-second limit. An
    import cannot be interrupted, but nothing after it may run: no data, no model, no step."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADACC_HOME": str(tmp_path), "GRADACC_DEVICE": "cpu",
           "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", COLD_CHILD, "1.0", json.dumps({**TINY, "train_samples": 2000})],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print("cold start:", report)
    assert (report["status"], report["reason"]) == ("stopped", limit_reason(1.0))
    # Nothing past the limit got to run: no announcement, no step. (How long after the imports it ended is
    # printed, not asserted: wall-clock figures on a shared 2-core machine are noise.)
    assert report["steps"] == 0 and not report["announced"]


def test_finished_threads_are_joined_and_nothing_is_left_running(make_manager, one_torch_thread):
    manager = make_manager(max_run_seconds=60, max_concurrent=2)
    ids = [manager.submit(RunConfig(**{**TINY, "seed": seed}), owner="visitor") for seed in range(4)]
    for run_id in ids:
        assert manager.wait(run_id, timeout=RUN_TIMEOUT_S)
    assert [manager.get(r).status for r in ids] == ["completed"] * 4
    wait_for(lambda: not run_threads(), 10, "the run and limit threads to end")
    with manager._lock:
        manager._reap()
        assert manager._ended_threads == [] and manager._workers == {}


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 1e6


def test_memory_returns_to_its_baseline_after_ten_runs_in_a_row(make_manager, monkeypatch, record_property,
                                                                one_torch_thread):
    """Every backend once to warm up (imports, Trainer's first-use allocations), then 10 runs. No run's model may
    outlive it, and RSS after them stays within noise of the baseline."""
    alive = []
    original = models.load

    def tracked_load(*args, **kwargs):
        loaded = original(*args, **kwargs)
        alive.append(weakref.ref(loaded.model))
        return loaded

    monkeypatch.setattr(models, "load", tracked_load)
    manager = make_manager(max_run_seconds=0)

    def run(index):
        run_id = manager.submit(RunConfig(**{**TINY, "backend": BACKENDS[index % 3], "seed": index}), owner="v")
        assert manager.wait(run_id, timeout=RUN_TIMEOUT_S)
        assert manager.get(run_id).status == "completed", manager.get(run_id).reason

    for index in range(3):
        run(index)
    baseline = rss_mb()
    figures = []
    for index in range(10):
        run(index)
        figures.append(rss_mb())
    growth = figures[-1] - baseline
    report = {"baseline_mb": round(baseline, 1), "after_10_runs_mb": round(figures[-1], 1),
              "growth_mb": round(growth, 1), "peak_mb": round(max(figures), 1)}
    record_property("rss", json.dumps(report))
    print("RSS after gc:", report)
    gc.collect()
    assert [ref for ref in alive if ref() is not None] == [], "a finished run's model is still referenced"
    assert len(manager._finished) <= FINISHED_CACHE_SIZE
    assert growth < 25, report
