"""Accumulated gradients equal the full-batch gradient with exact weights, for every backend and case."""

import pytest

from gradacc.config import RunConfig
from gradacc.analysis.equivalence import check, rows, window_size
from gradacc.errors import GradaccError

EXACT_TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=["pytorch", "accelerate", "trainer"])
def report(request):
    return check(RunConfig(backend=request.param, micro_batch_size=4, grad_accum_steps=4, max_seq_length=32))


def test_exact_normalization_matches_the_full_batch_gradient_in_every_case(report):
    # Every case is there, so "every" cannot pass on an empty or shortened report.
    assert list(report["cases"]) == ["equal_windows", "short_last_window", "token_level", "language_model"]
    for case, result in report["cases"].items():
        assert result["exact_rel_error"] <= EXACT_TOLERANCE, case


def test_naive_is_right_only_for_equal_windows(report):
    cases = report["cases"]
    assert cases["equal_windows"]["naive_rel_error"] <= EXACT_TOLERANCE
    # A window of 6 = 4 + 2 examples: naive weights 1/4, 1/4 instead of 4/6, 2/6 → about half the gradient.
    assert cases["short_last_window"]["micro_batch_items"] == [4, 2]
    assert cases["short_last_window"]["naive_rel_error"] > 0.3
    # Token counts differ between micro-batches, so equal 1/k weights are wrong.
    token_items = cases["token_level"]["micro_batch_items"]
    assert len(set(token_items)) > 1
    assert cases["token_level"]["naive_rel_error"] > 1e-3


def test_trainer_library_default_shows_the_k_times_pitfall(report):
    if report["backend"] != "trainer":
        assert "library_default_rel_error" not in report["cases"]["equal_windows"]
        return
    # BERT's forward takes **kwargs, so Trainer skips its ÷k: the gradient is k=4 times too large.
    assert report["cases"]["equal_windows"]["library_default_rel_error"] == pytest.approx(3.0, rel=1e-4)


def test_main_case_defaults_to_one_full_window(report):
    assert report["samples"] == 16
    assert report["exact_rel_error"] == report["cases"]["equal_windows"]["exact_rel_error"]
    assert {r["normalization"] for r in rows(report)} >= {"naive", "exact"}


def test_short_window_size_has_a_partial_last_micro_batch():
    assert window_size("short_last_window", 8, 4) == 8 + 4
    assert window_size("short_last_window", 4, 1) == 2
    assert window_size("equal_windows", 8, 4) == 32


def test_samples_beyond_one_window_are_refused():
    with pytest.raises(GradaccError, match="one accumulation window"):
        check(RunConfig(micro_batch_size=4, grad_accum_steps=2), samples=9)


def test_language_model_case_naive_is_visibly_wrong_and_exact_is_not(report):
    result = report["cases"]["language_model"]
    assert len(set(result["micro_batch_items"])) > 1  # micro-batches predict different numbers of tokens
    assert result["exact_rel_error"] <= EXACT_TOLERANCE
    assert result["naive_rel_error"] > 1e-2
    if report["backend"] == "trainer":  # GPT-2 forwards **kwargs to its loss: the library default is right here
        assert result["library_default_rel_error"] <= EXACT_TOLERANCE


def test_a_causal_lm_check_has_the_two_windows_and_naive_is_wrong_in_the_main_one():
    report = check(RunConfig(model="tiny-gpt", dataset="builtin-text", micro_batch_size=4, grad_accum_steps=4,
                             max_seq_length=32))
    assert set(report["cases"]) == {"equal_windows", "short_last_window"}
    assert report["exact_rel_error"] <= EXACT_TOLERANCE
    assert report["naive_rel_error"] > 1e-2  # equal windows in examples, not in predicted tokens
