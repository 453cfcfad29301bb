"""A speaker's click on a projector (1280×720): /demos?demo=NAME, "Run this demo", the runs growing live in view,
and the result written on screen, whole, in true words."""

import re

from playwright.sync_api import expect

import st_ui

PROJECTOR = {"width": 1280, "height": 720}
# Points drawn on the demo's loss chart (the first live chart), all runs together, and how many displayed chart
# elements the page has mounted so far: a chart mounted anew blinks empty (and loses a zoom) instead of being redrawn
# in place. One in a closed expander (process memory) is nobody's view: left out.
LOSS_POINTS = """() => {
  const charts = [...document.querySelectorAll('.gradacc-live-chart')].filter((chart) => chart.offsetParent !== null);
  window.gradaccMounted ??= new WeakSet();
  window.gradaccMounts ??= 0;
  for (const chart of charts) {
    if (!window.gradaccMounted.has(chart)) { window.gradaccMounted.add(chart); window.gradaccMounts += 1; }
  }
  // calcdata: the points plotly computed, one array per trace (the figure's own x may be packed binary).
  const points = charts.length && charts[0].calcdata ? charts[0].calcdata.reduce((n, trace) => n + trace.length, 0) : 0;
  return [points, window.gradaccMounts, charts.length];
}"""


def play(page, artifacts, name: str, timeout_ms: int = 150_000, onlooker: bool = False,
         growing: bool = True) -> str:
    """Open the demo at projector size, run it, sample the loss chart until the headline is written; check what a
    room sees (the live runs in view after the click, a curve growing over several polls, the headline whole in
    view, no console error while the live charts draw) and return the headline's text. ``onlooker``: a second
    browser opens the same link while the demo runs and must watch it (its runs' panels, no second start).
    ``growing``: the curve must be seen growing; a demo that the tests' scale shrinks to a second or two cannot be
    (its pace at full scale is measured with ``python -m gradacc.analysis.demos NAME``, README)."""
    problems = st_ui.console_problems(page)
    page.set_viewport_size(PROJECTOR)
    st_ui.open_app(page, f"/demos?demo={name}")
    st_ui.click(page, "Run this demo")
    live = page.locator(".st-key-demo-live")
    expect(live).to_be_in_viewport(timeout=20_000)  # brought into view: the click changed more than the button
    if onlooker:
        second = page.context.browser.new_context(viewport=PROJECTOR, base_url=page.url.split("/demos")[0])
        watcher = second.new_page()
        st_ui.open_app(watcher, f"/demos?demo={name}")
        expect(watcher.locator("[class*='st-key-demo-run-']")).to_have_count(2)
        expect(st_ui.button(watcher, "Run this demo")).to_be_disabled()
        second.close()
    headline = page.locator(".st-key-headline [data-testid=stAlert]")
    points = []
    for _ in range(timeout_ms // 500):
        if headline.count():
            break
        points.append(page.evaluate(LOSS_POINTS)[0])
        page.wait_for_timeout(500)
    expect(headline).to_be_visible(timeout=30_000)
    grew = sorted(set(points) - {0})
    assert points == sorted(points), points  # never shrinking, never blank for a moment
    _, mounts, charts = page.evaluate(LOSS_POINTS)
    assert mounts == charts, f"{mounts} charts mounted for {charts} on the page"  # each drawn in place, poll after poll
    if growing:
        assert len(grew) >= 2, points  # seen growing, poll after poll
    # Over (a third run may still train after the headline of the first two): it can be run again.
    expect(st_ui.button(page, "Run this demo")).to_be_enabled(timeout=timeout_ms)
    expect(headline).to_be_in_viewport(ratio=1.0)  # the result, whole, where the room looks
    st_ui.expect_no_exception(page)
    page.screenshot(path=str(artifacts / f"demo-{name}-projector.png"))  # what the room sees, unscrolled
    assert problems == []
    return headline.inner_text().removeprefix("📣").strip()  # the words, without the box's icon


def lines(locator) -> int:
    """How many lines of text an element takes."""
    return locator.evaluate("""e => {
      const style = getComputedStyle(e);
      const text = e.getBoundingClientRect().height - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
      return Math.round(text / parseFloat(style.lineHeight));
    }""")


def test_same_curve_says_identical_with_a_quarter_of_the_activations(page, artifacts):
    text = play(page, artifacts, "same-curve", onlooker=True)
    assert re.search(r"Loss curves identical \(max difference \d(e-0[5-9]|e-1\d)?\)", text), text  # ≤ 1e-4
    assert re.search(r"activations \d\.\d× smaller", text), text  # m=8, k=4 against m=32, k=1
    assert "F1" in text and "both" in text, text
    assert not re.search(r"\d× (slower|faster) per step \(median\)", text), text  # 4 steps at this scale: too few


def test_naive_against_exact_lists_naives_values_first(page, artifacts):
    text = play(page, artifacts, "naive-vs-exact", growing=False)  # tiny-bert: 2 s at the tests' scale
    assert text.startswith("Loss curves differ"), text
    assert "m=8, k=4, naive against m=8, k=4, exact" in text, text  # the values follow this order (unit-tested)


def test_trainer_pitfall_says_the_k_times_loss_and_why(page, artifacts):
    text = play(page, artifacts, "trainer-pitfall")
    ratio = re.search(r"Loss (\d\.\d)× smaller with gradacc's fix \(median over \d+ steps\): Trainer's default did "
                      r"not divide the loss by k=4", text)
    assert ratio and 3.5 <= float(ratio.group(1)) <= 4.5, text
    assert "True vs False" not in text, text


def test_the_lm_demo_says_naives_drift_and_exacts_in_two_lines(page, artifacts):
    text = play(page, artifacts, "naive-vs-exact-lm")
    assert text.startswith("Loss curves differ"), text
    assert re.search(r"exact against it: loss curves identical \(max difference", text), text
    assert lines(page.locator(".st-key-headline h3")) <= 2


# memory-wall at GRADACC_DEMO_SCALE=0.25: two all-MiniLM-L6-v2 runs of 5 optimizer steps each (the first one fails
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
