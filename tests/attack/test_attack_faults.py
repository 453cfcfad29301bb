"""Faults during a run: the run fails with one sentence and keeps every event logged before the fault."""

import pytest
import torch

from gradacc.config import RunConfig
from gradacc.training.run.engine import train
from gradacc.events import Recorder
from attack_support import nan_loss, sabotage

BACKENDS = ["pytorch", "accelerate", "trainer"]
SMALL = dict(train_samples=96, eval_samples=16, epochs=2, micro_batch_size=8, grad_accum_steps=2,
             max_seq_length=32, dropout=0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_loss_fails_the_run_naming_the_step_and_keeps_earlier_points(backend, monkeypatch):
    sabotage(monkeypatch, after_forwards=6, fault=nan_loss)  # micro-batch 7 = the 4th window
    recorder = Recorder()
    ended = train(RunConfig(backend=backend, **SMALL), recorder)
    assert ended["status"] == "failed"
    assert ended["reason"] == "loss became NaN at step 4"
    assert [s["step"] for s in recorder.of("step")] == [1, 2, 3]
    assert ended["field"] is None, "a fault in training is not bad input"


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_memory_in_forward_points_to_the_memory_planner(backend, monkeypatch):
    def out_of_memory(output):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    sabotage(monkeypatch, after_forwards=2, fault=out_of_memory)
    recorder = Recorder()
    ended = train(RunConfig(backend=backend, **SMALL), recorder)
    assert ended["status"] == "failed"
    assert ended["reason"].startswith("out of memory at micro-batch size 8: lower the micro-batch size")
    assert "Memory planner" in ended["reason"]
    assert len(recorder.of("step")) == 1


def test_cpu_allocation_failure_is_treated_as_out_of_memory(monkeypatch):
    def cpu_oom(output):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    sabotage(monkeypatch, after_forwards=0, fault=cpu_oom)
    ended = train(RunConfig(**SMALL))
    assert ended["reason"].startswith("out of memory at micro-batch size 8")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exception_in_a_backend_fails_the_run_with_a_one_line_reason(backend, monkeypatch):
    def boom(output):
        raise RuntimeError("boom\nsecond line that must not reach the status")

    sabotage(monkeypatch, after_forwards=3, fault=boom)
    recorder = Recorder()
    ended = train(RunConfig(backend=backend, **SMALL), recorder)
    assert ended["status"] == "failed"
    assert ended["reason"] == "RuntimeError: boom"
    assert len(recorder.of("step")) == 1 and recorder.of("run_started")


def test_a_failing_event_sink_does_not_hide_the_end_of_the_run():
    """An app whose store is broken still learns how the run ended."""
    seen = []

    def flaky_sink(event):
        seen.append(event["event"])
        if event["event"] == "step":
            raise OSError("disk full")

    ended = train(RunConfig(**SMALL), flaky_sink)
    assert ended["status"] == "failed" and "disk full" in ended["reason"]
    assert seen[-1] == "run_ended"
