"""A speaker's click on a projector (1280×720): /demos?demo=NAME, "Run this demo", the runs growing live in view,
and the result written on screen, whole, in true words."""

import re

from playwright.sync_api import expect

import st_ui
from chromium import PROJECTOR, WIDE_PROJECTOR

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


# Whether plotly's toolbar (shown on hover) and the chart's title overlap: boxes as the page draws them.
TOOLBAR_OVER_TITLE = """chart => {
  const box = (e) => e.getBoundingClientRect().toJSON();
  const [toolbar, title] = [chart.querySelector('.modebar'), chart.querySelector('.gtitle')];
  if (!toolbar || !title) return {missing: !toolbar ? 'modebar' : 'title'};
  const [a, b] = [box(toolbar), box(title)];
  return {overlap: a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom,
          toolbar: a, title: b, text: title.textContent};
}"""


def expect_toolbars_clear_of_titles(page) -> None:
    """Hover each displayed live chart, as a speaker pointing at it does: its toolbar covers no part of its title."""
    charts = page.locator(".gradacc-live-chart").filter(visible=True)
    assert charts.count() >= 2, "no charts to hover"
    for index in range(charts.count()):
        chart = charts.nth(index)
        chart.hover()
        found = chart.evaluate(TOOLBAR_OVER_TITLE)
        assert "missing" not in found and not found["overlap"], found


def play(page, artifacts, name: str, timeout_ms: int = 150_000, onlooker: bool = False,
         growing: bool = True, viewport: dict = PROJECTOR) -> str:
    """Open the demo at projector size, run it, sample the loss chart until the headline is written; check what a
    room sees (the live runs in view after the click, a curve growing over several polls, the headline whole in
    view, no console error while the live charts draw) and return the headline's text. ``onlooker``: a second
    browser opens the same link while the demo runs and must watch it (its runs' panels, no second start).
    ``growing``: the curve must be seen growing; a demo that the tests' scale shrinks to a second or two cannot be
    (its pace at full scale is measured with ``python -m gradacc.analysis.demos NAME``, README). ``viewport``: the
    screen (PROJECTOR, WIDE_PROJECTOR); every chart's toolbar, shown on hover, must leave its title readable.
    Every displayed chart must be mounted once, then redrawn in place poll after poll."""
    problems = st_ui.console_problems(page)
    page.set_viewport_size(viewport)
    st_ui.open_app(page, f"/demos?demo={name}")
    st_ui.click(page, "Run this demo")
    live = page.locator(".st-key-demo-live")
    expect(live).to_be_in_viewport(timeout=20_000)  # brought into view: the click changed more than the button
    # ... with the charts below the runs' status begun on screen, unscrolled.
    expect(page.locator(".gradacc-live-chart").first).to_be_in_viewport(timeout=20_000)
    if onlooker:
        second = page.context.browser.new_context(viewport=viewport, base_url=page.url.split("/demos")[0])
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
    assert mounts == charts, f"{mounts} charts mounted for {charts} on the page"
    if growing:
        assert len(grew) >= 2, points  # seen growing, poll after poll
    # Over (a third run may still train after the headline of the first two): it can be run again.
    expect(st_ui.button(page, "Run this demo")).to_be_enabled(timeout=timeout_ms)
    expect(headline).to_be_in_viewport(ratio=1.0)  # the result, whole, where the room looks
    header = page.get_by_test_id("stHeader").bounding_box()  # Streamlit's header covers the top of the view
    assert headline.bounding_box()["y"] >= header["y"] + header["height"], (headline.bounding_box(), header)
    st_ui.expect_no_exception(page)
    # What the room sees, unscrolled.
    page.screenshot(path=str(artifacts / f"demo-{name}-{viewport['width']}x{viewport['height']}.png"))
    expect_toolbars_clear_of_titles(page)  # last: hovering scrolls the charts into view
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
    assert "naive ÷k against exact" in text, text  # the scenario's names; the values follow this order (unit-tested)


def test_trainer_pitfall_says_the_k_times_loss_and_why(page, artifacts):
    text = play(page, artifacts, "trainer-pitfall", viewport=WIDE_PROJECTOR)  # the other screen, on one demo
    ratio = re.search(r"Loss (\d\.\d)× smaller with gradacc's fix \(median over \d+ steps\): Trainer's default did "
                      r"not divide the loss by k=4", text)
    assert ratio and 3.5 <= float(ratio.group(1)) <= 4.5, text
    assert "True vs False" not in text, text


def test_the_lm_demo_says_naives_drift_and_exacts_in_two_lines(page, artifacts):
    text = play(page, artifacts, "naive-vs-exact-lm")
    assert text.startswith("Loss curves differ"), text
    assert re.search(r"exact m=2, k=16 against it: loss curves identical \(max difference", text), text
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


# The loss chart's lines as drawn: [(run name, {samples seen: loss})], in the page's order (the compared two first).
DRAWN_CURVES = """() => {
  const chart = [...document.querySelectorAll('.gradacc-live-chart')].find((c) => c.offsetParent !== null);
  return chart.data.map((trace, index) => [trace.name, chart.calcdata[index].map((point) => [point.x, point.y])]);
}"""


def loss_claim_is_true(claim: str, curve_a: dict, curve_b: dict) -> None:
    """A headline's loss claim of B against A ("Loss curves differ: loss up to 4.8× smaller", "... differ by up
    to 12%", "... identical (max difference 1e-07)"), recomputed from the two curves drawn: the same printed figure."""
    shared = sorted(set(curve_a) & set(curve_b))
    assert shared, (claim, curve_a, curve_b)
    worst = max(abs(curve_a[x] - curve_b[x]) / max(abs(curve_a[x]), abs(curve_b[x]), 1e-12) for x in shared)
    ratios = [curve_b[x] / curve_a[x] for x in shared]
    extreme = max(ratios, key=lambda r: max(r, 1 / r))
    if times := re.search(r"loss up to ([\d.]+)× (larger|smaller)", claim):
        factor = max(extreme, 1 / extreme)
        assert times.group(1) == (f"{factor:.1f}" if factor < 10 else f"{factor:.0f}"), (claim, ratios)
        assert times.group(2) == ("larger" if extreme > 1 else "smaller"), (claim, ratios)
    elif percent := re.search(r"differ by up to (\d+)%", claim):
        assert percent.group(1) == f"{worst * 100:.0f}", (claim, worst)
    else:
        found = re.search(r"(identical|match) \(max difference ([\de.+-]+)\)", claim)
        assert found, claim
        assert found.group(2) == ("0" if worst == 0 else f"{worst:.0e}"), (claim, worst)


def gradient_table(page) -> dict:
    """The coupled checks' table as the page shows it: {what m=M: relative error}."""
    rows = page.locator("[data-testid=stDataFrame]").filter(has_text="relative error").locator("tbody tr")
    table = {}
    for row in rows.all():
        what, m, _, error, _ = row.locator("td").all_inner_texts()
        table[f"{what} m={m}"] = float(error)
    return table


# coupled-losses: five runs (three all-MiniLM-L6-v2 contrastive ways, two BatchNorm) and four gradient checks. Outcomes
# only: its runs' sizes are its own (demos.COUPLED_LOSSES), and at the tests' scale the contrastive runs are short.
COUPLED_TIMEOUT_MS = 300_000


def test_coupled_losses_says_what_its_runs_and_gradient_checks_show(page, artifacts):
    # Its charts are drawn in place too: the gradient checks, below the runs since they moved there, end with a full
    # rerun that no longer shifts (and so remounts) the charts above them.
    text = play(page, artifacts, "coupled-losses", timeout_ms=COUPLED_TIMEOUT_MS)
    claims, against = [line for line in text.splitlines() if line.strip()]
    curves = {name: dict(points) for name, points in page.evaluate(DRAWN_CURVES)}
    names = list(curves)
    assert len(names) == 5, names  # every run drew its curve: batch 64, m=16 k=4, GradCache, the two BatchNorms
    # The headline names the scenario's compared runs (accumulated against the batch), then GradCache against it.
    compared, control = against.split(" · ")
    assert compared == f"{names[1]} against {names[0]}", against
    assert control.startswith(f"{names[2]} against it: "), against
    # Its words, true of those runs' curves as drawn: accumulated in-batch negatives are a different loss; GradCache
    # computes the batch's.
    loss_claim = claims.split(" · ")[0]
    assert loss_claim.startswith("Loss curves differ"), claims
    loss_claim_is_true(loss_claim, curves[names[0]], curves[names[1]])
    control_claim = control.removeprefix(f"{names[2]} against it: ")
    assert re.match(r"loss curves (identical|match) ", control_claim), control
    loss_claim_is_true(control_claim, curves[names[0]], curves[names[2]])
    # BatchNorm's curves apart (m=4, k=8 against m=32): more than the headline would call a match (1 %).
    batch_norm, small = curves[names[3]], curves[names[4]]
    assert max(abs(batch_norm[x] - small[x]) / abs(batch_norm[x]) for x in set(batch_norm) & set(small)) > 0.01
    # The gradient checks: their sentences and table, each verdict its own way round.
    expect(page.get_by_text(re.compile(r"^LayerNorm: at most"))).to_be_visible(timeout=COUPLED_TIMEOUT_MS)
    errors = gradient_table(page)
    assert errors["the same loss, accumulated m=16"] >= 0.1, errors
    assert errors["CachedMultipleNegativesRankingLoss (GradCache) m=64"] <= 1e-5, errors
    assert errors["bow-batchnorm m=2"] > errors["bow-batchnorm m=8"] > 0.01, errors
    assert errors["bow-layernorm m=2"] <= 1e-5, errors
    accumulated = st_ui.main(page).get_by_text(re.compile(r"^Accumulating \d+ micro-batches of 16 is \d+% off"))
    said = re.search(r"is (\d+)% off", accumulated.inner_text())
    assert said.group(1) == f"{errors['the same loss, accumulated m=16'] * 100:.0f}", said  # the sentence, the table
    st_ui.expect_no_exception(page)
    st_ui.screenshot(page, artifacts / "demo-coupled-losses-whole.png")
