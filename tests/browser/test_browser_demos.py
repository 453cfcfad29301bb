"""A speaker's first click: /demos?demo=same-curve, "Run this demo", and the result written on screen."""

import re

from playwright.sync_api import expect

import st_ui

# Both runs of same-curve at GRADACC_DEMO_SCALE=0.25 (the browser server's): seconds each, queued one after the other.
DEMO_TIMEOUT_MS = 60_000


def test_the_same_curve_demo_runs_from_its_link_to_its_headline(page, artifacts):
    st_ui.open_app(page, "/demos?demo=same-curve")
    expect(page.get_by_role("heading", name="Same curve, a quarter of the activations")).to_be_visible()
    st_ui.click(page, "Run this demo")
    headline = st_ui.alert(page, re.compile(r"Loss curves identical \(max difference"))
    expect(headline).to_be_visible(timeout=DEMO_TIMEOUT_MS)
    text = headline.inner_text()
    # m=8, k=4 against m=32, k=1: fewer activations, more time per step, the same F1.
    assert re.search(r"activations \d\.\d× smaller", text), text
    assert "F1" in text and "both" in text, text
    expect(st_ui.traces(st_ui.plot(page, "Loss curves identical"))).to_have_count(2)
    expect(st_ui.button(page, "Run this demo")).to_be_enabled()  # over: it can be run again
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "demo-same-curve.png")
