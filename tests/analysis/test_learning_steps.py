"""The optimizer steps a planned setting gives on the run's data, and the epochs (or the smaller target) its model
needs to learn: counted by hand here, against the recipe's measured minimum."""

import math

import pytest

from gradacc.analysis.learning_steps import advise
from gradacc.recipes import RECIPES, recipe_for

TINY_BERT = RECIPES["tiny-bert"]


def test_the_planner_defaults_give_too_few_steps_and_the_advice_gives_enough():
    # The run: 2,000 examples at 256 a step (m = 64, k = 4): ceil(ceil(2000 / 64) / 4) = ceil(32 / 4) = 8.
    found = advise("tiny-bert", 2000, 64, 4)
    minimum = TINY_BERT.min_optimizer_steps
    assert minimum is not None and 8 * TINY_BERT.epochs < minimum  # the recipe's 2 epochs: 16 steps, too few
    assert (found["steps_per_epoch"], found["asked_epochs"], found["asked_steps"]) == (8, 2, 16)
    assert found["epochs"] == math.ceil(minimum / 8) and found["steps"] == 8 * found["epochs"] >= minimum
    assert 8 * (found["epochs"] - 1) < minimum  # no more epochs than needed
    # Or keep 2 epochs with a smaller power-of-two target: the largest that gives the minimum.
    smaller = found["smaller_target"]
    assert smaller & (smaller - 1) == 0
    assert math.ceil(2000 / smaller) * 2 >= minimum > math.ceil(2000 / (2 * smaller)) * 2
    assert found["text"] == (
        f"2,000 training examples at 256 a step: 8 optimizer steps an epoch, 16 in the 2 epochs of tiny-bert's recipe, "
        f"too few: tiny-bert learns from {minimum} steps at its recipe's learning rate (measured). Train "
        f"{found['epochs']} epochs ({found['steps']} steps), or an effective batch of {smaller} in 2 epochs.")


def test_enough_steps_keep_the_runs_epochs():
    found = advise("tiny-bert", 2000, 8, 4, epochs=3)  # ceil(250 / 4) = 63 an epoch, 189 in 3
    assert (found["steps_per_epoch"], found["epochs"], found["steps"]) == (63, 3, 189)
    assert found["enough"] and found["smaller_target"] is None and found["text"].endswith(": enough.")
    assert "189 in the 3 epochs of the run" in found["text"]


def test_a_deployments_epoch_limit_is_kept_and_the_smaller_target_said():
    found = advise("tiny-bert", 2000, 64, 4, max_epochs=2)
    assert found["epochs"] == 2 and found["enough"] is False
    assert found["text"].endswith(f"this deployment allows at most 2 epochs (16 steps): use an effective batch of "
                                  f"{found['smaller_target']} in 2 epochs.")


def test_several_processes_count_each_ones_share():
    # 2 processes × m 32 × k 4 = 256: each sees 1,000 examples, ceil(ceil(1000 / 32) / 4) = 8 steps an epoch.
    found = advise("tiny-bert", 2000, 32, 4, num_processes=2)
    assert (found["effective_batch"], found["steps_per_epoch"]) == (256, 8)
    assert found["smaller_target"] % 2 == 0 and found["smaller_target"] < 256


@pytest.mark.parametrize("model", ["tiny-gpt", "/models/my-bert"])
def test_a_model_without_a_measured_minimum_keeps_its_epochs_and_says_so(model):
    found = advise(model, 2000, 64, 4)
    assert found["epochs"] == recipe_for(model).epochs and found["enough"] is None
    assert "No minimum of optimizer steps is measured for" in found["text"]


def test_every_built_in_classifier_has_a_measured_minimum():
    for model in ("tiny-bert", "all-MiniLM-L6-v2", "bow-batchnorm", "bow-layernorm"):
        assert RECIPES[model].min_optimizer_steps, model
