"""Warnings on run_ended: a run that completes badly says so; a good one says nothing."""

import pytest

from gradacc import events as ev
from gradacc.training.run import health
from gradacc.config import RunConfig


def events_of(losses, f1=0.9, majority_f1=0.0):
    found = [ev.step(step=i, epoch=1, samples_seen=32 * i, tokens_seen=0, micro_batches=4, loss=loss, grad_norm=1.0,
                     lr=1e-3, elapsed_s=i, memory={}) for i, loss in enumerate(losses, 1)]
    return found + [ev.eval_(epoch=1, step=len(losses), eval_loss=0.3, eval_accuracy=0.9, eval_f1=f1,
                             majority_f1=majority_f1)]


GOOD = [0.70, 0.69, 0.66, 0.60, 0.50, 0.40, 0.30, 0.20, 0.12, 0.08, 0.05, 0.09, 0.04, 0.03]


def test_a_good_run_has_no_warnings():
    assert health.run_warnings(events_of(GOOD), RunConfig()) == []


def test_noise_at_a_tiny_loss_is_not_a_spike():
    noisy = GOOD + [0.01, 0.01, 0.05, 0.01, 0.01]  # 5× the median, but far below where it started
    assert health.run_warnings(events_of(noisy), RunConfig()) == []


def test_a_collapsed_pretrained_run_warns_and_names_the_learning_rate():
    diverged = [0.70, 0.60, 0.50, 0.40, 0.35, 0.30, 0.30, 2.50, 0.80, 0.72, 0.71, 0.70, 0.72]
    config = RunConfig(model="all-MiniLM-L6-v2", learning_rate=1e-3)
    warnings = health.run_warnings(events_of(diverged, f1=0.0, majority_f1=0.0), config)
    assert warnings[0].startswith("eval F1 0.000 is no better than always predicting the most frequent label")
    assert warnings[1] == "the loss ended higher than it started (0.71 against 0.6)."
    assert warnings[2] == "the loss spiked at step 8: 2.5, 6.2× the median of the steps before (0.4)."
    assert warnings[3] == ("Likely cause: learning rate 0.001 is high for a pretrained model; its recipe uses 0.0002.")


def test_a_warning_without_a_high_learning_rate_names_no_cause():
    warnings = health.run_warnings(events_of([0.5, 0.6, 0.7, 0.8]), RunConfig(learning_rate=5e-3))
    assert warnings == ["the loss ended higher than it started (0.8 against 0.5)."]


@pytest.mark.parametrize("losses", [[], [0.7]])
def test_too_short_to_judge_is_not_a_warning(losses):
    assert health.run_warnings(events_of(losses), RunConfig()) == []


def test_the_engine_puts_warnings_on_a_forced_divergence():
    """A real run, forced to diverge (learning rate 2, no clipping): it completes, and says it went wrong."""
    from gradacc.training.run.engine import train

    recorder = ev.Recorder()
    config = RunConfig(learning_rate=2.0, max_grad_norm=0.0, warmup_ratio=0.0, train_samples=96, eval_samples=64,
                       epochs=1, micro_batch_size=8, grad_accum_steps=1, dropout=0.0)
    ended = train(config, recorder)
    assert ended["status"] == ev.COMPLETED and ended["warnings"], ended
    assert any("Likely cause: learning rate 2" in w for w in ended["warnings"])


def test_the_learning_rate_warning_before_start_names_what_the_run_end_warnings_would():
    from gradacc.config import RunConfig
    from gradacc.recipes import RECIPES

    high = RunConfig(model="all-MiniLM-L6-v2", learning_rate=1e-3).check()
    assert health.likely_cause(high) == "Likely cause: learning rate 0.001 is high for a pretrained model; its recipe uses 0.0002."
    assert health.learning_rate_warning(high).startswith("The learning rate 0.001 is high for a pretrained model")
    assert health.learning_rate_warning(RunConfig(learning_rate=4e-3).check()) is None
    # A rate the recipe fills in is the run's own optimizer's: never warned about.
    for model, recipe in RECIPES.items():
        for optimizer in ("adamw", "adamw-fused", *recipe.optimizer_rates):
            assert health.learning_rate_warning(RunConfig(model=model, optimizer=optimizer).check()) is None
    # AdamW's rate typed in (a form keeps it) for an optimizer with a measured rate of its own: told which.
    own = RECIPES["tiny-bert"].learning_rate_for("adafactor")
    adafactor = health.learning_rate_warning(RunConfig(optimizer="adafactor", learning_rate=5e-3).check())
    assert adafactor == (f"Learning rate 0.005 is tiny-bert's recipe for AdamW, not adafactor's: its recipe's is "
                         f"{own:g}; set it before Start.")
    # ... and for one with none measured (the check refuses it unset): it needs one of its own.
    pretrained = RunConfig(model="org/name", optimizer="sgd", learning_rate=5e-5).check()
    assert health.learning_rate_warning(pretrained) == ("Learning rate 5e-05 is org/name's recipe for AdamW, not "
                                                        "sgd's: it needs a learning rate of its own; set it before Start.")
    assert health.learning_rate_warning(RunConfig(optimizer="sgd", learning_rate=0.05).check()) is None
    # A rate far above the optimizer's own measured one is high for it too.
    assert health.learning_rate_warning(RunConfig(optimizer="adafactor", learning_rate=own * 10).check()) \
        .startswith(f"The learning rate {own * 10:g} is high for tiny-bert with adafactor; its recipe uses {own:g}")


def one_label_events(labels_predicted=1, f1=0.642, accuracy=0.472, majority_f1=0.0, majority_accuracy=0.528):
    """The issue's run: 16 optimizer steps, every eval example called positive (the minority label)."""
    evaluation = ev.eval_(epoch=2, step=16, eval_loss=0.694, eval_accuracy=accuracy, eval_f1=f1,
                          majority_f1=majority_f1, majority_accuracy=majority_accuracy,
                          labels_predicted=labels_predicted)
    return events_of([0.695, 0.694, 0.696, 0.694])[:-1] + [evaluation]


def test_one_label_for_every_example_is_warned_whatever_its_f1():
    # F1 0.642 is far above the majority label's 0.000 (it is the negative one): only the labels say it collapsed.
    warnings = health.run_warnings(one_label_events(), RunConfig())
    assert warnings == ["the model predicted one label for every eval example (F1 0.642, accuracy 0.472): it learnt "
                        "nothing it can use; a run of too few optimizer steps often ends so (the Memory planner says "
                        "how many a model needs)."]
    assert not health.beats_majority(one_label_events()[-1])


def test_accuracy_no_better_than_the_most_frequent_label_is_warned_though_f1_clears_it():
    events = one_label_events(labels_predicted=2, f1=0.60, accuracy=0.52)
    assert health.run_warnings(events, RunConfig()) == [
        "eval accuracy 0.520 is no better than always predicting the most frequent label (0.528): the model learnt "
        "nothing it can use."]
    assert not health.beats_majority(events[-1])
    learnt = one_label_events(labels_predicted=2, f1=0.80, accuracy=0.81)
    assert health.run_warnings(learnt, RunConfig()) == [] and health.beats_majority(learnt[-1])


def test_an_event_recorded_before_the_labels_were_counted_is_judged_on_f1_alone():
    old = {"event": ev.EVAL, "eval_f1": 0.8, "eval_accuracy": 0.8, "majority_f1": 0.6}
    assert health.beats_majority(old) and not health.beats_majority(old | {"eval_f1": 0.6})
