"""Validation turns every bad value into one sentence naming the field; good values pass through."""

import math

import pytest

from gradacc.config import RunConfig, effective_batch
from gradacc.errors import GradaccError


@pytest.mark.parametrize("field,value,message", [
    ("micro_batch_size", 0, "micro batch size must be from 1 to 4096; got 0."),
    ("micro_batch_size", -3, "micro batch size must be from 1 to 4096; got -3."),
    ("micro_batch_size", 2.5, "micro batch size must be a whole number from 1 to 4096; got 2.5."),
    ("micro_batch_size", 10**9, "micro batch size must be from 1 to 4096; got 1000000000."),
    ("grad_accum_steps", 0, "grad accum steps must be from 1 to 4096; got 0."),
    ("epochs", 0, "epochs must be from 1 to 1000; got 0."),
    ("max_steps", 0, "max steps must be from 1 to 10000000; got 0."),
    ("learning_rate", 0.0, "learning rate must be greater than 0 and at most 10; got 0."),
    ("learning_rate", -1e-3, "learning rate must be greater than 0 and at most 10; got -0.001."),
    ("learning_rate", math.nan, "learning rate must be a finite number; got nan."),
    ("learning_rate", math.inf, "learning rate must be a finite number; got inf."),
    ("max_seq_length", 4, "max seq length must be from 8 to 512; got 4."),
    ("max_seq_length", 100000, "max seq length must be from 8 to 512; got 100000."),
    ("backend", "jax", "backend must be one of pytorch, accelerate, trainer; got 'jax'."),
    ("loss_normalization", "mean", "loss normalization must be one of exact, naive; got 'mean'."),
    ("model", "  ", "model must be a non-empty name or path."),
    ("dropout", 1.5, "dropout must be at least 0 and at most 0.9; got 1.5."),
    ("seed", "x", "seed must be a whole number from 0 to 4294967295; got 'x'."),
])
def test_bad_values_give_one_sentence_naming_the_field(field, value, message):
    with pytest.raises(GradaccError) as raised:
        RunConfig(**{field: value}).validate()
    assert raised.value.message == message
    assert raised.value.field == field


def test_whole_floats_become_ints():
    config = RunConfig(micro_batch_size=8.0, grad_accum_steps=4.0).validate()
    assert config.micro_batch_size == 8 and isinstance(config.micro_batch_size, int)


def test_effective_batch_is_m_times_k_times_processes():
    assert RunConfig(micro_batch_size=8, grad_accum_steps=4).effective_batch == 32
    assert RunConfig(micro_batch_size=8, grad_accum_steps=4, num_processes=2).effective_batch == 64
    assert effective_batch(3, 5, 2) == 30


def test_round_trip_through_a_dict_ignores_unknown_keys():
    config = RunConfig(backend="trainer", micro_batch_size=4)
    assert RunConfig.from_dict({**config.to_dict(), "unknown": 1}) == config
