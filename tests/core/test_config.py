"""Validation turns every bad value into one sentence naming the field; good values pass through."""

import math

import pytest

import dataclasses

from gradacc.config import ConfigErrors, RunConfig, ValidConfig
from gradacc.steps import effective_batch
from gradacc.labels import CLI_FLAGS, FIELD_LABELS, in_cli_words
from gradacc.errors import GradaccError


@pytest.mark.parametrize("field,value,message", [
    ("micro_batch_size", 0, "Micro-batch size (m) must be a whole number from 1 to 4096; got 0."),
    ("micro_batch_size", -3, "Micro-batch size (m) must be a whole number from 1 to 4096; got -3."),
    ("micro_batch_size", 2.5, "Micro-batch size (m) must be a whole number from 1 to 4096; got 2.5."),
    ("micro_batch_size", 10**9, "Micro-batch size (m) must be a whole number from 1 to 4096; got 1000000000."),
    ("grad_accum_steps", 0, "Accumulation steps (k) must be a whole number from 1 to 4096; got 0."),
    ("epochs", 0, "Epochs must be a whole number from 1 to 1000; got 0."),
    ("epochs", True, "Epochs must be a whole number from 1 to 1000; got True."),
    ("max_steps", 0, "Max optimizer steps must be a whole number from 1 to 10,000,000; got 0."),
    ("learning_rate", 0.0, "Learning rate must be greater than 0 and at most 10; got 0."),
    ("learning_rate", -1e-3, "Learning rate must be greater than 0 and at most 10; got -0.001."),
    ("learning_rate", math.nan, "Learning rate must be a finite number; got nan."),
    ("learning_rate", math.inf, "Learning rate must be a finite number; got inf."),
    ("learning_rate", "fast", "Learning rate must be a number; got 'fast'."),
    ("max_seq_length", 4, "Max sequence length (tokens) must be a whole number from 8 to 512; got 4."),
    ("max_seq_length", 100000, "Max sequence length (tokens) must be a whole number from 8 to 512; got 100000."),
    ("backend", "jax", "Backend must be one of pytorch, accelerate, trainer; got 'jax'."),
    ("loss_normalization", "mean", "Loss normalisation must be one of exact, naive; got 'mean'."),
    ("model", "  ", "Model must be a name or a path; got nothing."),
    ("dropout", 1.5, "Dropout must be at least 0 and at most 0.9; got 1.5."),
    ("seed", "x", "Seed must be a whole number from 0 to 4,294,967,295; got 'x'."),
])
def test_bad_values_give_one_sentence_naming_the_field(field, value, message):
    with pytest.raises(GradaccError) as raised:
        RunConfig(**{field: value}).check()
    assert raised.value.message == message
    assert raised.value.field == field


def test_every_field_has_a_page_label_and_a_cli_flag():
    """Adding a RunConfig field means one line in each table: its messages then read in the page's words."""
    for field in dataclasses.fields(RunConfig):
        assert FIELD_LABELS.get(field.name), f"{field.name} has no label in labels.FIELD_LABELS"
        assert field.name in CLI_FLAGS, f"{field.name} has no entry in labels.CLI_FLAGS (None if no flag)"


def test_the_cli_says_the_flag_where_the_page_says_the_label():
    with pytest.raises(GradaccError) as raised:
        RunConfig(micro_batch_size=0).check()
    assert in_cli_words(raised.value.message, raised.value.field) == \
        "--micro-batch-size must be a whole number from 1 to 4096; got 0."
    # A message that does not start with the label gets the flag in front; one with no field is left alone.
    assert in_cli_words("There is no label column 'x'.", "label_column") == \
        "--label-column: There is no label column 'x'."
    assert in_cli_words("The server is shutting down.", None) == "The server is shutting down."


def test_whole_floats_become_ints():
    config = RunConfig(micro_batch_size=8.0, grad_accum_steps=4.0).check()
    assert config.micro_batch_size == 8 and isinstance(config.micro_batch_size, int)


def test_effective_batch_is_m_times_k_times_processes():
    assert RunConfig(micro_batch_size=8, grad_accum_steps=4).effective_batch == 32
    assert RunConfig(micro_batch_size=8, grad_accum_steps=4, num_processes=2).effective_batch == 64
    assert effective_batch(3, 5, 2) == 30


def test_round_trip_through_a_dict_ignores_unknown_keys():
    config = RunConfig(backend="trainer", micro_batch_size=4)
    assert RunConfig.from_dict({**config.to_dict(), "unknown": 1}) == config


def test_check_returns_a_valid_config_and_leaves_its_input_as_it_was():
    config = RunConfig(grad_accum_steps=3.0)
    checked = config.check()
    assert type(config) is RunConfig and config.epochs is None and type(config.grad_accum_steps) is float
    assert isinstance(checked, ValidConfig) and checked.epochs == config.recipe.epochs
    assert type(checked.grad_accum_steps) is int
    assert checked.check() is checked  # its type says it was checked: the code after the entry takes it as it is
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.grad_accum_steps = 0  # a change is a new config...
    with pytest.raises(ConfigErrors, match="Accumulation steps"):
        checked.replace(grad_accum_steps=0)  # ...and a ValidConfig is never made with a bad value
    assert type(checked.replace(seed=3)) is ValidConfig and checked.replace(seed=3).seed == 3
    with pytest.raises(ConfigErrors, match="Micro-batch size"):
        ValidConfig(micro_batch_size=0)  # its constructor is the check


def test_every_bad_field_is_refused_at_once_and_the_first_is_the_one_line_message():
    with pytest.raises(ConfigErrors) as raised:
        RunConfig(micro_batch_size=0, learning_rate="fast", seed=-1).check()
    assert raised.value.by_field == {
        "micro_batch_size": "Micro-batch size (m) must be a whole number from 1 to 4096; got 0.",
        "learning_rate": "Learning rate must be a number; got 'fast'.",
        "seed": "Seed must be a whole number from 0 to 4,294,967,295; got -1."}
    # The first refusal is the error's own message and field: the CLI's and run_ended's one line stay as they were.
    assert (raised.value.field, raised.value.message) == ("micro_batch_size", raised.value.by_field["micro_batch_size"])
    assert isinstance(raised.value, GradaccError)
    # What passed is kept, normalised, for the checks that build on it (a form's deployment limits).
    assert raised.value.values["grad_accum_steps"] == 4 and raised.value.values["epochs"] == RunConfig().recipe.epochs


def test_settings_that_refuse_each_other_name_each_field_once():
    with pytest.raises(ConfigErrors) as raised:
        RunConfig(backend="trainer", pitfalls=["clip-per-micro-batch"], task="contrastive", model="all-MiniLM-L6-v2",
                  dataset="builtin-pairs", num_processes=2, memory_budget_mb=-1.0).check()
    errors = raised.value.by_field
    assert set(errors) == {"pitfalls", "num_processes", "memory_budget_mb"}
    assert errors["pitfalls"].startswith("Pitfalls: only the plain PyTorch loop has them")
    assert errors["memory_budget_mb"].startswith("Memory budget (MB) must be a number greater than 0")
    # A value refused on its own does not also count against another field's check.
    with pytest.raises(ConfigErrors) as raised:
        RunConfig(backend="jax", pitfalls=["clip-per-micro-batch"]).check()
    assert set(raised.value.by_field) == {"backend"}


def test_an_unset_learning_rate_is_the_recipes_rate_for_the_runs_own_optimizer():
    from gradacc.recipes import ADAMW_LIKE, RECIPES

    for model, recipe in RECIPES.items():
        for optimizer in ("adamw", "adamw-fused", "sgd", "adafactor"):
            config = RunConfig(model=model, optimizer=optimizer)
            own = recipe.learning_rate_for(optimizer)
            if own is None:  # none measured: refused, never AdamW's rate
                with pytest.raises(GradaccError, match="needs one of its own"):
                    config.check()
                continue
            assert config.check().learning_rate == own
            assert (own == recipe.learning_rate) == (optimizer in ADAMW_LIKE)
    # Every built-in recipe holds a measured rate for at least one optimizer besides AdamW's kin.
    assert all(recipe.optimizer_rates for recipe in RECIPES.values())
    # A rate the user set is the user's: kept whatever the optimizer (the Train page warns where it looks wrong).
    assert RunConfig(optimizer="sgd", learning_rate=5e-3).check().learning_rate == 5e-3


def test_a_pretrained_model_with_an_optimizer_the_recipe_has_no_rate_for_is_refused_in_one_line():
    for optimizer in ("sgd", "adafactor"):
        with pytest.raises(GradaccError) as raised:
            RunConfig(model="org/name", optimizer=optimizer).check()
        assert raised.value.field == "learning_rate" and "\n" not in raised.value.message
        assert raised.value.message == (
            f"Learning rate: {optimizer} needs one of its own, and the recipe for a pretrained model (a folder or hub "
            "id) has none for it (its 5e-05 is AdamW's); set one.")
        assert in_cli_words(raised.value.message, "learning_rate").startswith(f"--lr: {optimizer} needs one of its own")
    assert RunConfig(model="org/name", optimizer="sgd", learning_rate=0.05).check().learning_rate == 0.05
    # A bad optimizer is named as itself, not as a missing rate.
    with pytest.raises(GradaccError, match="Optimizer must be one of"):
        RunConfig(model="org/name", optimizer="lion").check()
