"""Audit, on a projector (1280×720): press the button as a person would, and read the stock Trainer's verdict on
tiny-bert, its fix and the lines that audit one's own script, whole on screen."""

import re

from playwright.sync_api import expect

import st_ui
from chromium import PROJECTOR

AUDIT_TIMEOUT_MS = 120_000  # one optimizer step of tiny-bert: seconds; a busy machine gets room


def test_the_audit_page_gives_tiny_berts_verdict_and_its_fix_at_1280x720(page, artifacts):
    page.set_viewport_size(PROJECTOR)
    st_ui.open_app(page, "/audit")
    main = st_ui.main(page)
    expect(main.locator("h1").first).to_have_text("Is Trainer's default right for your model?")
    st_ui.set_number(page, "Micro-batch size (m)", 2)
    main.locator(".st-key-run_audit").get_by_role("button", name="Audit a stock Trainer", exact=True).click()

    verdict = st_ui.alert(main, re.compile(r"The gradient is k× too large:"))
    expect(verdict).to_be_visible(timeout=AUDIT_TIMEOUT_MS)
    expect(verdict).to_contain_text("#47688")
    expect(main.get_by_text(re.compile(r"compute_loss_func=gradacc\.audit\.classifier_mean_loss"))).to_be_visible()
    expect(main.locator("[data-testid=stCode]").filter(has_text="audit_trainer(trainer)")).to_be_visible()
    box = verdict.bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= PROJECTOR["width"], box  # whole, not cut
    assert st_ui.cut_text(page) == []  # and every label and table header
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "audit-result-1280x720.png")
