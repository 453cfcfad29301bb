"""Equivalence: run the gradient check as a person would and read the verdict on screen."""

import re

from playwright.sync_api import expect

import st_ui

CHECK_TIMEOUT_MS = 120_000  # seconds for PyTorch; a busy machine gets room


def test_the_check_shows_exact_matches_and_naive_does_not(page, artifacts):
    st_ui.open_app(page)
    st_ui.go_to(page, "Equivalence")
    st_ui.set_number(page, "Micro-batch size (m)", 4)
    st_ui.set_number(page, "Accumulation steps (k)", 4)
    st_ui.click(page, "Run the check")

    verdict = st_ui.main(page).get_by_text(re.compile(r"^Exact normalisation: every relative error is at most"))
    expect(verdict).to_be_visible(timeout=CHECK_TIMEOUT_MS)
    # Naive ÷ k is wrong where micro-batches weigh differently: the short last window and a token-level loss.
    naive = st_ui.main(page).get_by_text(re.compile(r"^Naive is \d+% off with a short last window and \d+% off"))
    expect(naive).to_be_visible()
    expect(st_ui.traces(st_ui.plot(page, "Accumulated vs. full-batch gradients"))).not_to_have_count(0)
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "equivalence-result.png")
