"""The plain loop's deliberate wrong lines: each does what its upstream report says, and the run measures it.

Every run here trains tiny-bert on 40 examples, m=4, k=4 (dropout 0): two full windows of 16 and a short one of 8,
3 optimizer steps. The right loop runs once; each pitfall's run starts from the same weights on the same data,
so its probe's "right loop" figures can be checked against the right run's own events.
"""

import math
import warnings

import pytest

from gradacc import events as ev
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig
from gradacc.errors import GradaccError

SIZE = dict(train_samples=40, eval_samples=16, epochs=1, micro_batch_size=4, grad_accum_steps=4, dropout=0.0,
            max_seq_length=32, instrument=False)
# tiny-bert's gradient norms here are about 0.1 to 0.6: a tighter limit makes clipping engage.
TIGHT = 0.05


def run(**changes) -> tuple[dict, list[dict]]:
    from gradacc.training.run.engine import train

    recorder = ev.Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about the scheduler stepping before the optimizer, rightly
        ended = train(RunConfig(**SIZE, **changes), recorder)
    assert ended["status"] == ev.COMPLETED, ended
    return ended, recorder.of(ev.STEP)


@pytest.fixture(scope="module")
def right():
    return run()


@pytest.fixture(scope="module")
def right_tight():
    return run(max_grad_norm=TIGHT)


def effect(ended: dict, name: str) -> str:
    found = [w for w in ended["warnings"] if w.startswith(f"Pitfall {name} ({PITFALLS[name]}): ")]
    assert len(found) == 1, ended["warnings"]
    return found[0]


def test_the_right_loop_has_no_probe_and_no_pitfall_warning(right):
    ended, steps = right
    assert len(steps) == 3 and all("pitfall" not in s for s in steps)
    assert not any(w.startswith("Pitfall") for w in ended["warnings"])


def test_scheduler_per_micro_batch_runs_the_schedule_k_times_too_fast(right):
    ended, steps = run(pitfalls=["scheduler-per-micro-batch"])
    _, right_steps = right
    # The planned schedule the probe measures against is the right run's own learning rate, step by step.
    assert [s["pitfall"]["planned_lr"] for s in steps] == [s["lr"] for s in right_steps]
    # 4 schedule steps per optimizer step: the schedule planned for 3 steps is over after the first.
    zero = next(s["step"] for s in steps if s["lr"] == 0 and s["pitfall"]["planned_lr"] > 0)
    assert zero == 2 and all(s["lr"] == 0 for s in steps[zero - 1:]) and all(s["lr"] > 0 for s in right_steps[1:])
    assert f"the learning rate reached 0 at optimizer step {zero} of 3" in effect(ended, "scheduler-per-micro-batch")


def test_clip_per_micro_batch_steps_with_another_gradient_than_clipping_once(right_tight):
    ended, steps = run(pitfalls=["clip-per-micro-batch"], max_grad_norm=TIGHT)
    _, right_steps = right_tight
    # Step 1 starts from the same weights: the probe's right gradient is the right run's, clipped once.
    assert math.isclose(steps[0]["pitfall"]["grad_norm_right"], min(right_steps[0]["grad_norm"], TIGHT), rel_tol=1e-4)
    first = steps[0]["pitfall"]
    angle = math.degrees(math.acos(min(1.0, first["grad_cosine"])))
    assert angle > 1  # clipping the partial sums turned the gradient
    sentence = effect(ended, "clip-per-micro-batch")
    assert "gradients clipped every micro-batch" in sentence and "° away from it" in sentence


def test_a_clip_that_never_engages_is_said_to_have_no_effect():
    ended, _ = run(pitfalls=["clip-per-micro-batch"], max_grad_norm=100.0)
    assert "clipping never engaged" in effect(ended, "clip-per-micro-batch")


def test_zero_grad_per_micro_batch_steps_with_one_micro_batch(right):
    ended, steps = run(pitfalls=["zero-grad-per-micro-batch"])
    _, right_steps = right
    assert [s["pitfall"]["examples_stepped"] for s in steps] == [4, 4, 4]
    assert [s["pitfall"]["examples_seen"] for s in steps] == [16, 16, 8]
    assert math.isclose(steps[0]["pitfall"]["grad_norm_right"], min(right_steps[0]["grad_norm"], 1.0), rel_tol=1e-4)
    assert "each optimizer step used 4 examples, not 16" in effect(ended, "zero-grad-per-micro-batch")


def test_log_undivided_loss_logs_k_times_the_loss_and_trains_the_same(right):
    ended, steps = run(pitfalls=["log-undivided-loss"])
    _, right_steps = right
    for step, right_step in zip(steps, right_steps):
        assert math.isclose(step["pitfall"]["loss_right"], right_step["loss"], rel_tol=1e-5)
        assert step["grad_norm"] == pytest.approx(right_step["grad_norm"], rel=1e-5)  # training unchanged
    # Full windows log 4× their loss; the short last one (2 micro-batches) 2×.
    assert [round(s["loss"] / r["loss"], 3) for s, r in zip(steps, right_steps)] == [4.0, 4.0, 2.0]
    assert "the logged loss was 4.00× the right one" in effect(ended, "log-undivided-loss")


def test_drop_last_window_never_trains_the_short_window(right):
    ended, steps = run(pitfalls=["drop-last-window"])
    _, right_steps = right
    assert (len(steps), len(right_steps)) == (2, 3)
    assert steps[-1]["pitfall"]["examples_trained"] == 32
    assert ("8 examples never trained (32 of 40: the epoch's short last window never stepped); 2 optimizer steps "
            "instead of 3") in effect(ended, "drop-last-window")


@pytest.mark.parametrize("changes,words", [
    ({"pitfalls": ["nope"]}, "Pitfalls must be among scheduler-per-micro-batch,"),
    ({"pitfalls": ["drop-last-window"], "backend": "accelerate"}, "only the plain PyTorch loop has them"),
    ({"pitfalls": ["drop-last-window"], "backend": "trainer"}, "this run's backend is trainer"),
    ({"pitfalls": ["drop-last-window"], "num_processes": 2}, "one process only"),
    ({"pitfalls": "drop-last-window"}, "must be a list of names"),
])
def test_bad_pitfalls_are_refused_in_one_sentence_naming_the_field(changes, words):
    with pytest.raises(GradaccError) as raised:
        RunConfig(**changes).check()
    assert raised.value.field == "pitfalls" and words in raised.value.message
    assert "\n" not in raised.value.message


# ---- the command line --------------------------------------------------------------------------------------

CLI_SMALL = ["--train-samples", "40", "--eval-samples", "16", "--epochs", "1", "--max-seq-length", "32", "-m", "4",
             "-k", "4", "--no-instrument"]


@pytest.mark.parametrize("args,fragments", [
    (["--pitfall", "nope"], ["--pitfall must be among", "drop-last-window", "got 'nope'"]),
    (["--pitfall", "clip-per-micro-batch", "--backend", "accelerate"],
     ["--pitfall: only the plain PyTorch loop has them", "backend is accelerate"]),
])
def test_a_bad_pitfall_on_the_command_line_is_one_line_naming_the_flag_and_exit_2(args, fragments, capsys):
    from attack_support import assert_one_error_line, cli

    assert_one_error_line(*cli(capsys, "train", *args, *CLI_SMALL), 2, *fragments)


def test_several_pitfalls_on_the_command_line_each_say_what_they_broke(capsys):
    from attack_support import cli

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, out, err = cli(capsys, "train", "--pitfall", "log-undivided-loss", "--pitfall", "drop-last-window",
                             *CLI_SMALL)
    assert code == 0, err
    said = [line for line in out.splitlines() if line.startswith("warning: Pitfall")]
    assert len(said) == 2
    assert "log-undivided-loss (transformers #35204): the logged loss was 4.00×" in said[0]
    assert "drop-last-window (Lightning #19987): 8 examples never trained" in said[1]


def test_a_pitfall_run_announces_itself_and_names_the_pitfall_as_the_likely_cause():
    from gradacc.training.run.health import run_warnings
    from gradacc.training.run.engine import train

    recorder = ev.Recorder()
    train(RunConfig(**{**SIZE, "train_samples": 16}, pitfalls=["zero-grad-per-micro-batch"]), recorder)
    started = recorder.of(ev.RUN_STARTED)[0]
    assert any(note.startswith("Broken on purpose: zero-grad-per-micro-batch") for note in started["notes"])
    # Whatever else went badly, the deliberate wrong line is named as its likely cause.
    events_with_a_bad_f1 = recorder.events + [{"event": ev.EVAL, "eval_f1": 0.0, "majority_f1": 0.5}]
    warnings_ = run_warnings(events_with_a_bad_f1, started["config"])
    assert warnings_[-1] == "Likely cause: the wrong line run on purpose (zero-grad-per-micro-batch)."
    # A pitfall that only changes the log is never blamed for the training.
    config = {**started["config"], "pitfalls": ["log-undivided-loss"]}
    assert not any(w.startswith("Likely cause") for w in run_warnings(events_with_a_bad_f1, config))
