"""The Train form's config: every bad field said at once from one check, and one learning rate for page and CLI."""

from app_support import error_after, open_app, set_numbers

from gradacc import cli, recipes
from gradacc import config as config_module
from gradacc.app.inputs import OTHER_MODEL, offered_optimizers
from gradacc.choices import BUILTIN_MODELS
from gradacc.cli import options as cli_options
from gradacc.config import ConfigErrors
from gradacc.recipes import RECIPES


def count_checks(monkeypatch) -> list:
    """Every run of the config check from now on (ValidConfig's constructor calls it)."""
    calls, check = [], config_module.checked_values

    def counted(config):
        calls.append(config)
        return check(config)

    monkeypatch.setattr(config_module, "checked_values", counted)
    return calls


def test_three_bad_fields_are_said_next_to_their_three_widgets_from_one_check(app_home, monkeypatch):
    at = open_app()
    at.number_input(key="form.train.epochs").set_value(0)
    at.number_input(key="form.train.dropout").set_value(2.0)
    at.number_input(key="form.train.memory_budget_mb").set_value(-5.0)
    checks = count_checks(monkeypatch)
    at.run()
    assert not at.exception and len(checks) == 1  # the script run checked the form once
    assert error_after(at, "form.train.epochs") == "Epochs must be a whole number from 1 to 1000; got 0."
    assert error_after(at, "form.train.dropout") == "Dropout must be at least 0 and at most 0.9; got 2."
    assert error_after(at, "form.train.memory_budget_mb").startswith(
        "Memory budget (MB) must be a number greater than 0")
    assert len(at.error) == 3 and at.button(key="start").disabled


def cli_learning_rate(model: str, optimizer: str) -> float | None:
    """The rate the CLI's run of ``model`` and ``optimizer`` trains at (None: refused, a rate must be set)."""
    args = cli.build_parser().parse_args(["train", "--model", model, "--optimizer", optimizer])
    try:
        return cli_options.config_from_args(args).check().learning_rate
    except ConfigErrors as refused:
        assert refused.field == "learning_rate" and "needs one of its own" in refused.message, refused.by_field
        return None


def page_learning_rate(at, model: str, optimizer: str) -> float | None:
    """The rate the Train page's field shows for ``model`` and ``optimizer`` (None: empty, and refused beside it)."""
    if model in BUILTIN_MODELS:
        at.selectbox(key="form.train.model_choice").set_value(model)
    else:
        at.selectbox(key="form.train.model_choice").set_value(OTHER_MODEL).run()
        at.text_input(key="form.train.model_custom").set_value(model)
    at.selectbox(key="form.train.optimizer").set_value(optimizer)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = at.number_input(key="form.train.learning_rate").value
    if shown is None:
        assert "needs one of its own" in error_after(at, "form.train.learning_rate")
        assert at.button(key="start").disabled
    return shown


def test_the_page_and_the_cli_take_the_learning_rate_from_the_one_resolver(app_home, monkeypatch):
    at = open_app()
    models = [*RECIPES, "org/name"]  # and a hub id: the recipe for a pretrained model
    pairs = [(model, optimizer) for model in models for optimizer in offered_optimizers()]
    for model, optimizer in pairs:
        resolved = recipes.learning_rate(model, optimizer)
        assert page_learning_rate(at, model, optimizer) == resolved == cli_learning_rate(model, optimizer), \
            (model, optimizer)
    assert any(recipes.learning_rate(*pair) is None for pair in pairs)  # a refusal was among them
    # Both read it there: another answer from the resolver is what both then use.
    monkeypatch.setattr(recipes, "learning_rate", lambda model, optimizer, asked=None: asked or 0.0123)
    assert page_learning_rate(at, "tiny-bert", "adamw") == 0.0123 == cli_learning_rate("tiny-bert", "adamw")


def test_a_typed_rate_is_kept_across_models_and_the_recipes_rate_typed_back_follows_the_recipe_again(app_home):
    at = open_app()
    set_numbers(at, "train", {"learning_rate": 1e-3})
    at.selectbox(key="form.train.model_choice").set_value("all-MiniLM-L6-v2").run()
    assert at.number_input(key="form.train.learning_rate").value == 1e-3
    assert not any("Learning rate" in i.value for i in at.info)  # nothing moved it
    assert at.session_state["train_config"].learning_rate == 1e-3
    set_numbers(at, "train", {"learning_rate": RECIPES["all-MiniLM-L6-v2"].learning_rate})  # the recipe's, typed
    at.selectbox(key="form.train.model_choice").set_value("tiny-bert").run()
    assert at.number_input(key="form.train.learning_rate").value == RECIPES["tiny-bert"].learning_rate
    assert any(i.value.startswith("Set to tiny-bert's recipe: Learning rate 0.005") for i in at.info)
    assert not at.error


def test_an_optimizer_the_recipe_has_no_rate_for_empties_the_field_and_asks_for_one_beside_it(app_home):
    assert recipes.learning_rate("tiny-bert", "sgd") is None
    at = open_app()
    assert page_learning_rate(at, "tiny-bert", "sgd") is None
    assert error_after(at, "form.train.learning_rate") == recipes.no_recipe_rate("tiny-bert", "sgd")
    set_numbers(at, "train", {"learning_rate": 0.05})  # the visitor sets one: theirs, and the run may start
    assert not at.error and not at.button(key="start").disabled
