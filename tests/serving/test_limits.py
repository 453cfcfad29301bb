"""Deployment limits from the environment, as the app and the CLI enforce them."""

import pytest

from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.serving.limits import Limits, is_hub_dataset, is_hub_model


def test_defaults_limit_only_time_and_uploads():
    limits = Limits.from_env({})
    assert limits == Limits(max_epochs=None, max_train_samples=None, max_run_seconds=600.0, max_upload_mb=5.0,
                            allow_hub=True)
    assert limits.errors(RunConfig(epochs=50, train_samples=None)) == {}


def test_values_are_read_and_zero_seconds_means_no_limit():
    limits = Limits.from_env({"GRADACC_MAX_EPOCHS": "3", "GRADACC_MAX_TRAIN_SAMPLES": "500",
                              "GRADACC_MAX_RUN_SECONDS": "0", "GRADACC_MAX_UPLOAD_MB": "0.5",
                              "GRADACC_ALLOW_HUB": "false"})
    assert (limits.max_epochs, limits.max_train_samples, limits.max_run_seconds) == (3, 500, None)
    assert limits.max_upload_bytes == 500_000 and not limits.allow_hub
    assert "no time limit" in limits.describe() and "hub ids disabled" in limits.describe()


# The one home of environment-variable parsing (gradacc/env.py, through Limits.from_env): every bad value is
# refused with one sentence naming the variable. Other tests only check that a value reaches its reader.
@pytest.mark.parametrize("name, raw, message", [
    ("GRADACC_MAX_EPOCHS", "0", "GRADACC_MAX_EPOCHS must be a whole number of at least 1; got '0'."),
    ("GRADACC_MAX_EPOCHS", "two", "GRADACC_MAX_EPOCHS must be a whole number of at least 1; got 'two'."),
    ("GRADACC_MAX_EPOCHS", "1.5", "GRADACC_MAX_EPOCHS must be a whole number of at least 1; got '1.5'."),
    ("GRADACC_MAX_TRAIN_SAMPLES", "-5", "GRADACC_MAX_TRAIN_SAMPLES must be a whole number of at least 1; got '-5'."),
    ("GRADACC_MAX_RUN_SECONDS", "-1", "GRADACC_MAX_RUN_SECONDS must be a number 0 or more; got '-1'."),
    ("GRADACC_MAX_RUN_SECONDS", "inf", "GRADACC_MAX_RUN_SECONDS must be a number 0 or more; got 'inf'."),
    ("GRADACC_MAX_RUN_SECONDS", "soon", "GRADACC_MAX_RUN_SECONDS must be a number 0 or more; got 'soon'."),
    ("GRADACC_MAX_UPLOAD_MB", "0", "GRADACC_MAX_UPLOAD_MB must be a number greater than 0; got '0'."),
    ("GRADACC_MAX_UPLOAD_MB", "inf", "GRADACC_MAX_UPLOAD_MB must be a number greater than 0; got 'inf'."),
    ("GRADACC_MAX_UPLOAD_MB", "nan", "GRADACC_MAX_UPLOAD_MB must be a number greater than 0; got 'nan'."),
])
def test_bad_settings_are_refused_with_the_variable_named(name, raw, message):
    with pytest.raises(GradaccError) as raised:
        Limits.from_env({name: raw})
    assert raised.value.message == message


def test_blank_settings_mean_unset():
    assert Limits.from_env({"GRADACC_MAX_EPOCHS": " ", "GRADACC_MAX_RUN_SECONDS": "", "GRADACC_MAX_UPLOAD_MB": ""}) \
        == Limits.from_env({})


def test_each_broken_limit_names_its_field():
    limits = Limits(max_epochs=2, max_train_samples=100, allow_hub=False)
    errors = limits.errors(RunConfig(epochs=3, train_samples=None, eval_samples=400, model="org/model",
                                     dataset="imdb"))
    assert set(errors) == {"epochs", "train_samples", "eval_samples", "model", "dataset"}
    assert "Epochs must be at most 2 on this deployment; got 3." == errors["epochs"] and "got all of them" in errors["train_samples"]
    with pytest.raises(GradaccError) as raised:
        limits.check(RunConfig(epochs=3))
    assert raised.value.field == "epochs"
    assert limits.check(RunConfig(epochs=2, train_samples=100, eval_samples=50)).epochs == 2


def test_built_in_names_and_local_paths_are_not_hub_ids(tmp_path):
    assert not is_hub_model("tiny-bert") and not is_hub_model("./models/mine") and not is_hub_model(str(tmp_path))
    assert is_hub_model("prajjwal1/bert-tiny")
    assert not is_hub_dataset("builtin-sentiment") and not is_hub_dataset("reviews.csv")
    assert not is_hub_dataset(str(tmp_path)) and is_hub_dataset("imdb")


def test_the_suite_clears_every_limit_a_deployment_may_set():
    """LIMIT_VARIABLES (support.py, cleared by conftest) names every variable limits.py reads, so a developer's own limit (say
    GRADACC_MAX_RUN_MEMORY_MB) never reaches a test that did not set it."""
    import os
    import re

    from support import LIMIT_VARIABLES
    from gradacc.serving import limits

    documented = set(re.findall(r"^\s+(GRADACC_\w+)\s", limits.__doc__, flags=re.MULTILINE))
    assert "GRADACC_MAX_RUN_MEMORY_MB" in documented
    assert documented <= set(LIMIT_VARIABLES)
    assert [name for name in LIMIT_VARIABLES if name in os.environ] == []
