"""The Train page says when the chosen dropout could not be applied to the model (the run's notes)."""

from app_support import SMALL_RUN, completed, open_app, run_until, set_numbers
from attack_support import hide_dropout

RUN_TIMEOUT_S = 90  # the first run in the process also imports torch and transformers


def test_the_train_page_says_the_dropout_could_not_be_applied(app_home, monkeypatch):
    hide_dropout(monkeypatch)  # tiny-bert whose dropout never draws, whatever gradacc sets
    at = open_app()
    set_numbers(at, "train", {**SMALL_RUN, "dropout": 0.2})
    at.button(key="start").click().run()
    run_until(at, completed, RUN_TIMEOUT_S, "the run to complete")
    captions = " ".join(c.value for c in at.caption)
    assert "Dropout 0.2 could not be applied to model tiny-bert: its output is the same on every pass in training " \
           "mode" in captions
