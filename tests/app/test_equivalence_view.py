"""The Equivalence page's background checks and the sentences that say what the numbers mean."""

import threading

import pytest

from gradacc.app import equivalence_view as view
from gradacc.errors import GradaccError
from gradacc.serving import checks


def report(library_default=None, naive_short=0.5, exact=2e-7):
    cases = {"equal_windows": {"naive_rel_error": 1e-7, "exact_rel_error": 1e-7, "micro_batch_items": [4, 4]},
             "short_last_window": {"naive_rel_error": naive_short, "exact_rel_error": exact,
                                   "micro_batch_items": [4, 2]},
             "token_level": {"naive_rel_error": 0.18, "exact_rel_error": 3e-7, "micro_batch_items": [30, 41]}}
    if library_default is not None:
        for case in cases.values():
            case["library_default_rel_error"] = library_default
    return {"backend": "trainer", "grad_accum_steps": 4, "micro_batch_size": 4, "cases": cases}


def test_the_explanation_says_exact_matches_and_where_naive_is_off():
    text = " ".join(view.explanation(report()))
    assert "every relative error is at most 3.0e-07" in text
    assert "50% off with a short last window and 18% off with a token-level loss" in text


def test_trainer_library_default_is_explained_as_k_times_too_large():
    text = " ".join(view.explanation(report(library_default=3.0)))
    assert "300% off even with equal windows: about 4.0× the full-batch gradient with k = 4" in text


def test_an_exact_error_above_rounding_is_not_called_a_match():
    assert "more than rounding" in view.explanation(report(exact=1e-2))[0]


def test_rows_and_table_use_readable_case_names():
    rows = view.rows(report(library_default=3.0))
    assert {r["normalization"] for r in rows} == {"naive", "exact", "library_default"}
    assert rows[0]["case"] == "equal windows"
    table = view.table(report())
    assert table[1] == {"case": "short last window", "items per micro-batch": "4, 2", "naive": 0.5, "exact": 2e-7}


def test_check_config_caps_the_window():
    assert checks.check_config("pytorch", 4, 4).max_seq_length == 32
    with pytest.raises(GradaccError) as raised:
        checks.check_config("pytorch", 32, 16)
    assert raised.value.field == "grad_accum_steps"
    with pytest.raises(GradaccError) as raised:
        checks.check_config("pytorch", 0, 4)
    assert raised.value.field == "micro_batch_size"


def test_checks_run_one_at_a_time_off_the_callers_thread_and_are_remembered():
    gate, calls = threading.Event(), []

    def slow_check(config):
        calls.append(config.micro_batch_size)
        gate.wait(10)
        if config.micro_batch_size == 3:
            raise GradaccError("the run failed")
        return report()

    runner = checks.CheckRunner(slow_check)
    first = runner.submit(checks.check_config("pytorch", 2, 2))
    second = runner.submit(checks.check_config("pytorch", 3, 2))
    assert not first.done and runner.waiting_before(second) == 1
    gate.set()
    first._future.result(10), second._future.exception(10)
    assert first.report["backend"] == "trainer" and first.error is None
    assert second.report is None and second.error == "the run failed"
    # The same settings again: the finished check answers; a failed one is run again.
    assert runner.submit(checks.check_config("pytorch", 2, 2)) is first
    assert runner.submit(checks.check_config("pytorch", 3, 2)) is not second
    runner.shutdown()
    assert calls[:2] == [2, 3]


def test_the_language_model_case_says_what_trainer_does_on_tiny_gpt():
    right, wrong = report(library_default=3.0), report(library_default=3.0)
    right["cases"]["language_model"] = {"naive_rel_error": 0.06, "exact_rel_error": 1e-7, "micro_batch_items": [9, 30],
                                        "library_default_rel_error": 2e-7}
    wrong["cases"]["language_model"] = {**right["cases"]["language_model"], "library_default_rel_error": 0.5}
    assert "On the language model, Trainer's library default matches the full-batch gradient" in \
        " ".join(view.explanation(right))
    assert "On the language model, Trainer's library default is 50% off" in " ".join(view.explanation(wrong))
    assert "6% off with a language model (tiny-gpt)" in " ".join(view.explanation(right))
