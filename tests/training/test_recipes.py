"""Each built-in model trains with its own recipe, and reaches a good F1 with it on the built-in data."""

import json

import pytest

from gradacc import cli
from gradacc.cli import options as cli_options
from gradacc import events as ev
from gradacc.config import RunConfig
from gradacc import recipes
from gradacc.choices import OPTIMIZERS
from gradacc.recipes import PRETRAINED_RECIPE, RECIPE_FIELDS, RECIPES

F1_GOAL = 0.85


def test_unset_fields_take_the_models_recipe_and_set_ones_are_kept():
    config = RunConfig()
    assert all(getattr(config, name) is None for name in RECIPE_FIELDS)  # None: "from the recipe", until checked
    checked = config.check()
    assert config.learning_rate is None  # check() leaves the original alone
    assert [getattr(checked, name) for name in RECIPE_FIELDS] == \
        [getattr(RECIPES["tiny-bert"], name) for name in RECIPE_FIELDS]
    minilm = RunConfig(model="all-MiniLM-L6-v2", dropout=0.0).check()
    assert minilm.learning_rate == RECIPES["all-MiniLM-L6-v2"].learning_rate and minilm.dropout == 0.0
    assert RunConfig(model="someone/bert-base").check().learning_rate == PRETRAINED_RECIPE.learning_rate


def test_the_cli_takes_the_recipe_unless_a_flag_says_otherwise():
    parser = cli.build_parser()
    default = cli_options.config_from_args(parser.parse_args(["train", "--model", "all-MiniLM-L6-v2"])).check()
    assert default.learning_rate == RECIPES["all-MiniLM-L6-v2"].learning_rate
    chosen = cli_options.config_from_args(parser.parse_args(["train", "--model", "all-MiniLM-L6-v2", "--lr", "1e-3"]))
    assert chosen.check().learning_rate == 1e-3


def test_the_learning_rate_is_resolved_in_one_place():
    """recipes.learning_rate: the rate asked for, else the recipe's for the optimizer (None: it has none)."""
    for model, recipe in [*RECIPES.items(), ("org/name", PRETRAINED_RECIPE)]:
        for optimizer in OPTIMIZERS:
            assert recipes.learning_rate(model, optimizer) == recipe.learning_rate_for(optimizer)
            assert recipes.learning_rate(model, optimizer, 0.5) == 0.5  # the user's own, whatever the recipe says
    assert recipes.learning_rate("tiny-bert", "sgd") is None and recipes.learning_rate("tiny-bert", 3) is None


# 63 optimizer steps of the default run: seconds each on an idle 2-core machine, minutes when it is shared.
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["pytorch", "accelerate", "trainer"])
def test_tiny_bert_learns_within_its_first_epoch_at_the_default_settings(backend):
    """The default run (2000 examples, m=8, k=4: 63 optimizer steps) for one epoch: it once ended at F1 0."""
    from gradacc.training.run.engine import train

    recorder = ev.Recorder()
    ended = train(RunConfig(backend=backend, epochs=1, instrument=False), recorder)
    assert ended["status"] == ev.COMPLETED and ended["warnings"] == [], ended
    assert recorder.of(ev.EVAL)[-1]["eval_f1"] >= F1_GOAL


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_minilm_reaches_its_goal_with_its_recipe_from_the_cli(tmp_path, capsys):
    """The issue's command, no --lr: 512 examples, one epoch (16 optimizer steps of a 22M-parameter model)."""
    metrics = tmp_path / "minilm.jsonl"
    code = cli.main(["train", "--model", "all-MiniLM-L6-v2", "--train-samples", "512", "--eval-samples", "200",
                     "--epochs", "1", "--metrics-out", str(metrics)])
    assert code == cli_options.EXIT_OK, capsys.readouterr()
    written = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert written[-1]["event"] == ev.RUN_ENDED and written[-1]["warnings"] == [], written[-1]
    assert [e for e in written if e["event"] == ev.EVAL][-1]["eval_f1"] >= F1_GOAL
