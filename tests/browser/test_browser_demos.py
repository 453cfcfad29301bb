"""A speaker's first click: /demos?demo=same-curve, "Run this demo", and the result written on screen."""

import re

from playwright.sync_api import expect

import st_ui

# Both runs of same-curve at GRADACC_DEMO_SCALE=0.25 (the browser server's): seconds each, queued one after the other.
DEMO_TIMEOUT_MS = 60_000


def test_the_same_curve_demo_runs_from_its_link_to_its_headline(page, artifacts):
    problems = st_ui.console_problems(page)  # live charts drawing, resizing and redrawing: no console error
    st_ui.open_app(page, "/demos?demo=same-curve")
    expect(page.get_by_role("heading", name="Same curve, a quarter of the activations")).to_be_visible()
    st_ui.click(page, "Run this demo")
    # A second browser on the same link while the demo runs watches it: the runs' panels, no second start.
    second = page.context.browser.new_context(viewport=page.viewport_size, base_url=page.url.split("/demos")[0])
    onlooker = second.new_page()
    st_ui.open_app(onlooker, "/demos?demo=same-curve")
    expect(onlooker.locator("[class*='st-key-demo-run-']")).to_have_count(2)
    expect(st_ui.button(onlooker, "Run this demo")).to_be_disabled()
    headline = st_ui.alert(page, re.compile(r"Loss curves identical \(max difference"))
    expect(headline).to_be_visible(timeout=DEMO_TIMEOUT_MS)
    expect(st_ui.alert(onlooker, re.compile(r"Loss curves identical"))).to_be_visible(timeout=DEMO_TIMEOUT_MS)
    second.close()
    text = headline.inner_text()
    # m=8, k=4 against m=32, k=1: fewer activations, more time per step, the same F1.
    assert re.search(r"activations \d\.\d× smaller", text), text
    assert "F1" in text and "both" in text, text
    expect(st_ui.traces(st_ui.plot(page, "Loss curves identical"))).to_have_count(2)
    expect(st_ui.button(page, "Run this demo")).to_be_enabled()  # over: it can be run again
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "demo-same-curve.png")
    assert problems == []


# memory-wall at GRADACC_DEMO_SCALE=0.25: two all-MiniLM-L6-v2 runs of 2 optimizer steps each (the first one fails
# before its first), one after the other.
MEMORY_WALL_TIMEOUT_MS = 150_000


def test_the_memory_wall_demo_fails_out_of_memory_then_fits_the_same_effective_batch(page, artifacts):
    st_ui.open_app(page, "/demos?demo=memory-wall")
    title = "The memory wall: out of memory, then fit with accumulation"
    expect(page.get_by_role("heading", name=title)).to_be_visible()
    st_ui.click(page, "Run this demo")
    # The runs' panels, in the scenario's order (keyed by run id): m=64 in 450 MB, the fit, m=64 without a budget.
    panels = page.locator("[class*='st-key-demo-run-']")
    expect(panels).to_have_count(3)
    refused = st_ui.alert(panels.nth(0), "out of memory")
    expect(refused).to_be_visible(timeout=MEMORY_WALL_TIMEOUT_MS)
    reason = refused.inner_text()
    # The figures, and the way out: measured before step 1, as a GPU would refuse.
    assert re.search(r"Failed[^:]*: out of memory: micro-batch 64 needs "
                     r"[\d.]+ MB \(static [\d.]+ MB \+ activations 64 × [\d.]+ [kM]B\) of a 450 MB budget; m=16 "
                     r"with k=4 keeps the effective batch 64 within it", reason), reason
    headline = st_ui.alert(page, re.compile(r"Loss curves identical \(max difference"))
    expect(headline).to_be_visible(timeout=MEMORY_WALL_TIMEOUT_MS)
    text = headline.inner_text()
    assert re.search(r"activations \d\.\d× smaller", text), text  # m=16, k=4 against m=64, k=1
    for fitted in (panels.nth(1), panels.nth(2)):
        expect(st_ui.alert(fitted, re.compile(r"^Completed: \d+ optimizer steps"))).to_be_visible()
    # Must not happen: the fitted run, in the same 450 MB, failing as well.
    expect(st_ui.alert(page, "out of memory")).to_have_count(1)
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "demo-memory-wall.png")
