"""The Train form's logic: every error at once with its field, counts, uploads."""

import pytest

from gradacc.app import form
from gradacc import config as config_module
from gradacc.config import RunConfig, ValidConfig, checked_values
from gradacc.errors import GradaccError
from gradacc.serving import uploads
from gradacc.serving.limits import Limits


def test_every_bad_field_is_reported_not_just_the_first(monkeypatch):
    checks = count_checks(monkeypatch)
    checked, errors = form.check(RunConfig(micro_batch_size=0, grad_accum_steps=-2, learning_rate=0.0, dropout=2.0))
    assert checked is None and len(checks) == 1  # one check found all four
    assert set(errors) == {"micro_batch_size", "grad_accum_steps", "learning_rate", "dropout"}
    assert errors["dropout"].startswith("Dropout must be at least 0 and at most 0.9")


def test_a_refused_field_and_a_broken_limit_are_both_said_from_one_call():
    errors = form.check(RunConfig(micro_batch_size=0, epochs=5, train_samples=5000, eval_samples=50),
                        Limits(max_epochs=2, max_train_samples=100), train_examples=10)[1]
    assert set(errors) == {"micro_batch_size", "epochs", "train_samples"}
    assert errors["micro_batch_size"].startswith("Micro-batch size (m) must be a whole number")  # not "at most 10"
    assert errors["epochs"] == "Epochs must be at most 2 on this deployment; got 5."


def test_a_good_config_is_checked_once_and_limits_and_data_size_are_checked_too(monkeypatch):
    checks = count_checks(monkeypatch)
    typed = RunConfig(micro_batch_size=4.0)
    checked, errors = form.check(typed)
    assert errors == {} and isinstance(checked, ValidConfig) and checked.micro_batch_size == 4  # normalised
    assert checked.learning_rate == typed.recipe.learning_rate and typed.learning_rate is None  # the form's untouched
    assert checked.check() is checked and len(checks) == 1  # what Start submits is not checked again
    errors = form.check(RunConfig(epochs=5, micro_batch_size=64), Limits(max_epochs=2), train_examples=10)[1]
    assert set(errors) == {"epochs", "micro_batch_size"}
    assert "Micro-batch size (m) must be at most the 10 training examples; got 64." == errors["micro_batch_size"]


def count_checks(monkeypatch) -> list:
    """Every run of the config check from now on (ValidConfig's constructor calls it)."""
    calls = []

    def counted(config):
        calls.append(config)
        return checked_values(config)

    monkeypatch.setattr(config_module, "checked_values", counted)
    return calls


def test_a_field_with_no_widget_goes_to_the_general_slot():
    errors = form.check(RunConfig(backend="jax"))[1]
    assert "backend" in errors  # a RunConfig field, even if the page has no widget for it


def test_steps_and_examples_are_known_before_loading_for_built_in_data():
    config = RunConfig(micro_batch_size=4, grad_accum_steps=2, epochs=3, train_samples=100)
    assert form.known_train_examples(config) == 100
    assert form.optimizer_steps(config, 100) == 39  # ceil(ceil(100/4)/2) = 13 per epoch
    assert form.optimizer_steps(config, None) is None
    assert form.known_train_examples(RunConfig(dataset="imdb")) is None


def test_an_upload_is_saved_once_under_a_safe_name_and_its_columns_are_read(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADACC_HOME", str(tmp_path))
    content = b"Sentence,Label\nvery good,pos\nrather bad,neg\nfine,pos\nawful,neg\nnice,pos\n"
    path = uploads.save_upload("../../etc/my reviews!.csv", content, Limits())
    assert path.parent == tmp_path / "uploads" and path.name.startswith("my_reviews-") and path.suffix == ".csv"
    assert uploads.save_upload("again.csv", content, Limits()).read_bytes() == content
    columns = form.table_columns(path)
    assert columns == ["Sentence", "Label"]
    assert form.guess_column(columns, ("text", "sentence")) == "Sentence"
    assert form.count_train_examples(RunConfig(dataset=str(path))) == 4  # one of five held out


@pytest.mark.parametrize("name, content, message", [("data.txt", b"a", "not a CSV or JSONL"),
                                                    ("big.csv", b"x" * 2_000, "accepts uploads up to 0.001 MB"),
                                                    ("empty.csv", b"", "is empty")])
def test_bad_uploads_are_refused(tmp_path, monkeypatch, name, content, message):
    monkeypatch.setenv("GRADACC_HOME", str(tmp_path))
    with pytest.raises(GradaccError, match=message) as raised:
        uploads.save_upload(name, content, Limits(max_upload_mb=0.001))
    assert raised.value.field == "dataset"


def test_old_uploads_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADACC_HOME", str(tmp_path))
    monkeypatch.setattr(uploads, "KEEP_UPLOADS", 3)
    for i in range(5):
        uploads.save_upload(f"f{i}.csv", f"text,label\n{i},1\n".encode(), Limits())
    assert len(list((tmp_path / "uploads").iterdir())) == 3


def test_a_run_is_labelled_with_the_model_as_given_never_a_trimmed_path():
    assert form.run_label(RunConfig(model="../../etc")).endswith(" · ../../etc")
    long_path = "/data/" + "deep/" * 20 + "my-model"
    label = form.run_label(RunConfig(model=long_path))
    assert label.endswith("· …" + long_path[-(form.RUN_LABEL_MODEL_CHARS - 1):]) and "my-model" in label


def test_following_a_new_model_or_optimizer_moves_untouched_fields_and_says_the_resolved_rate():
    from gradacc import recipes

    tiny = recipes.recipe_for("tiny-bert")
    values = {"epochs": tiny.epochs, "dropout": 0.0, "max_seq_length": tiny.max_seq_length}  # dropout: the visitor's
    moves, note = form.follow(("tiny-bert", "adamw"), ("all-MiniLM-L6-v2", "adamw"), values, None)
    assert moves == {"epochs": 1}  # dropout was touched; the lengths are equal
    assert note == ("Set to all-MiniLM-L6-v2's recipe: Learning rate 0.0002, Epochs 1. "
                    "Fields you changed keep your values.")
    # The visitor's own rate stays theirs, and a field the hand-off sets itself is not moved.
    own = form.follow(("tiny-bert", "adamw"), ("all-MiniLM-L6-v2", "adamw"), values, 1e-3, keep={"epochs"})
    assert own == ({}, None)
    moves, note = form.follow(("tiny-bert", "adamw"), ("tiny-bert", "adafactor"), values, None)
    assert moves == {} and note.startswith(
        f"Set to tiny-bert's recipe for adafactor: Learning rate {recipes.learning_rate('tiny-bert', 'adafactor'):g}")
    # No rate measured for SGD: nothing to announce (the field empties and the check asks for one).
    assert form.follow(("tiny-bert", "adamw"), ("tiny-bert", "sgd"), values, None) == ({}, None)
