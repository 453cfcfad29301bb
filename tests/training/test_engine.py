"""The engine end to end: step counts, the three backends agreeing, and the F1 claim. (Stop mid-window on each
backend: test_attack_run_faults.py.)"""

import math

import pytest

from gradacc.config import RunConfig
from gradacc.steps import optimizer_steps_per_epoch, total_optimizer_steps
from gradacc.training.run.engine import train
from gradacc.events import Recorder

SMALL = dict(train_samples=90, eval_samples=30, epochs=1, micro_batch_size=8, dropout=0.0, max_seq_length=32)
BACKENDS = ["pytorch", "accelerate", "trainer"]


def run(**overrides):
    recorder = Recorder()
    ended = train(RunConfig(**{**SMALL, **overrides}), recorder)
    return recorder, ended


@pytest.mark.parametrize("n,m,k,expected", [(90, 8, 4, 3), (96, 8, 4, 3), (97, 8, 4, 4), (8, 8, 4, 1), (90, 8, 1, 12)])
def test_optimizer_steps_per_epoch_flushes_the_short_last_window(n, m, k, expected):
    assert optimizer_steps_per_epoch(n, m, k) == expected == math.ceil(math.ceil(n / m) / k)


def test_max_steps_caps_the_total():
    config = RunConfig(micro_batch_size=8, grad_accum_steps=4, epochs=3, max_steps=5).check()
    assert total_optimizer_steps(config, 2000) == 5


def subnormal_survives() -> bool:
    import torch

    return (torch.tensor([1e-39]) * 1.0).item() != 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_flushes_subnormal_floats_while_it_trains_and_not_after(backend):
    # Subnormals cost x86 many times a normal float: tiny-bert's speed swung by a third without this.
    seen = []
    ended = train(RunConfig(**{**SMALL, "backend": backend}),
                  lambda event: seen.append(subnormal_survives()) if event["event"] == "step" else None)
    assert ended["status"] == "completed", ended["reason"]
    assert seen and not any(seen), "a subnormal float survived a multiplication during training"
    assert subnormal_survives(), "the caller's thread is left flushing subnormals after the run"


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_takes_ceil_ceil_steps_and_reports_every_window(backend):
    recorder, ended = run(backend=backend, grad_accum_steps=4, epochs=2)
    assert ended["status"] == "completed", ended["reason"]
    steps = recorder.of("step")
    # 90 examples, m=8 → 12 micro-batches → windows of 4,4,4 → 3 steps per epoch.
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s["micro_batches"] for s in steps] == [4, 4, 4, 4, 4, 4]
    assert steps[-1]["samples_seen"] == 180
    assert [e["epoch"] for e in recorder.of("eval")] == [1, 2]
    started = recorder.of("run_started")[0]
    assert started["effective_batch"] == 32 and started["total_steps"] == 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_last_window_is_a_real_step(backend):
    recorder, ended = run(backend=backend, grad_accum_steps=5)
    steps = recorder.of("step")
    assert ended["status"] == "completed", ended["reason"]
    assert [s["micro_batches"] for s in steps] == [5, 5, 2]
    assert steps[-1]["samples_seen"] == 90


def test_three_backends_give_the_same_loss_curve_with_exact_normalization_and_no_dropout():
    curves = {}
    for backend in BACKENDS:
        recorder, ended = run(backend=backend, grad_accum_steps=3, epochs=2, loss_normalization="exact")
        assert ended["status"] == "completed", ended["reason"]
        curves[backend] = [s["loss"] for s in recorder.of("step")]
    assert len(curves["pytorch"]) == 8
    for backend in ("accelerate", "trainer"):
        for ours, theirs in zip(curves["pytorch"], curves[backend], strict=True):
            assert abs(ours - theirs) <= 1e-4 * abs(ours)


def test_default_run_learns_the_builtin_task():
    """The product's promise: the default config (tiny-bert's recipe, full default sizes) reaches the F1 goal
    of every built-in recipe, 0.85, with no warning. (It was 0.90 at the old default lr 1e-3, which left a
    one-epoch run at F1 0; the recipe's 5e-3 ends this run at 0.915 with the shipped tokenizer, measured.)"""
    recorder = Recorder()
    ended = train(RunConfig(), recorder)
    assert ended["status"] == "completed" and ended["warnings"] == [], ended
    assert len(recorder.of("step")) == 126
    assert recorder.of("eval")[-1]["eval_f1"] >= 0.85


def test_bad_input_is_a_failed_run_naming_its_first_field_never_an_exception():
    recorder = Recorder()
    ended = train(RunConfig(micro_batch_size=0, grad_accum_steps=2.5, optimizer="lion"), recorder)
    assert ended["status"] == "failed" and ended["field"] == "micro_batch_size"
    assert ended["reason"] == "Micro-batch size (m) must be a whole number from 1 to 4096; got 0."
    assert [event["event"] for event in recorder.events] == ["run_ended"]  # nothing started


def test_a_checked_config_is_trained_as_it_is_and_not_checked_again(monkeypatch):
    from gradacc import config as config_module
    from gradacc.training.run import engine

    checked = RunConfig(task="classification", **SMALL).check()
    prepared, checks = [], []
    prepare = engine._prepare
    monkeypatch.setattr(engine, "_prepare", lambda config, *rest: prepared.append(config) or prepare(config, *rest))
    check = config_module.checked_values
    monkeypatch.setattr(config_module, "checked_values", lambda config: checks.append(config) or check(config))
    ended = train(checked)
    assert ended["status"] == "completed", ended
    assert prepared == [checked] and prepared[0] is checked and checks == []


def test_a_misspelt_run_option_is_a_type_error_not_a_silent_attribute():
    # Options are keyword parameters of train, not names set onto the Job: a typo fails before anything runs.
    with pytest.raises(TypeError, match="sync_each_microbatch"):
        train(RunConfig(**SMALL), None, None, sync_each_microbatch=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_step_carries_the_training_threads_cpu_time_on_one_torch_thread(backend, one_torch_thread):
    # What the headline compares between runs made one after the other: the steps' own work, not the machine's load.
    recorder, ended = run(backend=backend, grad_accum_steps=2)
    assert ended["status"] == "completed", ended["reason"]
    steps = recorder.of("step")
    cpu = [step["cpu_s"] for step in steps]
    assert all(b > a for a, b in zip(cpu, cpu[1:])), cpu  # every step costs CPU time of the training thread
    assert all(0 < step["cpu_s"] <= step["elapsed_s"] * 1.01 for step in steps), steps  # one thread: never above wall


def test_several_torch_threads_leave_cpu_time_out(one_torch_thread):
    import torch

    torch.set_num_threads(2)  # the other threads' share of the work would be missing from the training thread's
    recorder, ended = run(grad_accum_steps=2)
    assert ended["status"] == "completed", ended["reason"]
    assert not any("cpu_s" in step for step in recorder.of("step"))
