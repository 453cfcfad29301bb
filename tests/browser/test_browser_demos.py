"""Every demo as a speaker gives it: /demos?demo=NAME on a projector (1280×720) and a wider screen (1440×900), the Run
button in view on load (on the wider screen, for the longest title), "Run this demo", the runs in view with a loading
step on screen, the curves growing, the result written whole in view in true words, and charts a room can read (titles
on two lines, no label over another, no legend over an axis title, no toolbar over a chart, no "None" in a table)."""

import json
import re
import time

import pytest
from playwright.sync_api import expect

import st_ui
from chart_checks import chart_problems
from chromium import PROJECTOR, WIDE_PROJECTOR

from gradacc.analysis import demos
from gradacc.app.charts import demos as demo_charts
from gradacc.app.charts import fsdp as fsdp_charts

LIVE_CHARTS = ".gradacc-live-chart"
# Points drawn on the demo's first live chart, all runs together, and how many displayed chart elements the page has
# mounted so far: a chart mounted anew blinks empty (and loses a zoom) instead of being redrawn in place. One in a
# closed expander (process memory) is nobody's view: left out.
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
# The displayed live charts as drawn: [(y axis title, chart title, [(trace name, [(x, y)])])], in the page's order.
DRAWN = """() => [...document.querySelectorAll('.gradacc-live-chart')].filter((c) => c.offsetParent !== null && c.data)
  .map((chart) => [chart.layout.yaxis?.title?.text || '', (chart.layout.title?.text || '').replaceAll(' <br>', ' '),
                   chart.data.map((trace, i) => [trace.name, chart.calcdata[i].map((point) => [point.x, point.y])])])"""
# The cells of every table on the page (Streamlit's data grid keeps an accessible copy of them in the DOM).
TABLE_CELLS = """() => [...document.querySelectorAll('[data-testid=stDataFrame] td')].map((cell) => cell.innerText.trim())"""
# The headline's top is below the page's header (which covers the top of the view).
BELOW_HEADER = """() => document.querySelector('.st-key-headline [data-testid=stAlert]').getBoundingClientRect().top
  >= document.querySelector('[data-testid=stHeader]').getBoundingClientRect().bottom"""
# The demo's run panels as drawn now (not a stale copy a rerun left) and whether its Run button is disabled; null while
# the button is not drawn (a rerun sends the page anew, element by element, and a message above it shifts the rest).
WATCHED = """() => {
  const now = (selector) => [...document.querySelectorAll(selector)].filter((e) => !e.closest('[data-stale="true"]'));
  const statuses = now("[class*='st-key-demo-run-'] [data-testid=stAlert]").map((alert) => alert.innerText.trim());
  const button = now('[data-testid=stMain] button').find((b) => b.innerText.trim() === 'Run this demo');
  return button ? [statuses, button.disabled] : null;
}"""
# Demos slow enough at the tests' scale that a second browser surely opens their link while they run.
ONLOOKED = {"same-curve", "memory-wall", "in-batch-negatives"}
# Runs longer than the tests' scale makes of the others: the whole demo, at the most.
TIMEOUT_MS = {"in-batch-negatives": 300_000, "memory-wall": 200_000}


def readable(page, where: str) -> None:
    """Every displayed chart reads from the back of the room (chart_checks), and no table cell says None."""
    assert chart_problems(page, LIVE_CHARTS) == [], where
    cells = page.evaluate(TABLE_CELLS)
    assert cells and "None" not in cells, (where, cells)


def watch_as_an_onlooker(page, name: str) -> None:
    """A second browser opens the demo's link while it runs: it lands on the running demo, which it cannot start
    again."""
    context = page.context.browser.new_context(viewport=PROJECTOR, base_url=page.url.split("/demos")[0])
    watcher = context.new_page()
    st_ui.open_app(watcher, f"/demos?demo={name}")
    expect(watcher.locator("[class*='st-key-demo-run-']")).to_have_count(len(demos.SCENARIOS[name].runs))
    expect(watcher.locator(".st-key-demo-live")).to_be_in_viewport(timeout=20_000)
    # While a run is live it cannot be started again: read both in one look at what is drawn now (the demo may end
    # between two looks, and then the button is enabled again, rightly), once the button is drawn.
    statuses, disabled = watcher.wait_for_function(WATCHED).json_value()
    if any(status.startswith(("Running", "Queued")) for status in statuses):
        assert disabled, statuses
    context.close()


def play(page, artifacts, name: str) -> tuple[str, list]:
    """Run the demo at projector size, sampling its first chart until the headline is written; check what a room
    sees (the runs in view with a loading step, a curve never shrinking, charts mounted once, the headline whole in
    view below the page's header, readable charts on both screens) and return the headline's text and the drawn
    charts."""
    timeout_ms = TIMEOUT_MS.get(name, 150_000)
    problems = st_ui.console_problems(page)
    page.set_viewport_size(PROJECTOR)
    st_ui.open_app(page, f"/demos?demo={name}")
    expect(st_ui.button(page, "Run this demo")).to_be_in_viewport(ratio=1.0)  # on load, where the speaker starts
    clicked = time.monotonic()
    st_ui.click(page, "Run this demo")
    expect(page.locator(".st-key-demo-live")).to_be_in_viewport(timeout=20_000)  # the click changed more than the button
    # Something moves: the first run's panel says what it is doing (its place in the queue, a loading step, then its
    # steps); how soon is measured at stage size (scripts/demo_timings.py), not asserted.
    first_panel = page.locator("[class*='st-key-demo-run-']").first
    expect(first_panel.get_by_test_id("stAlert")).to_contain_text(re.compile(r"Running: |Completed|Failed"),
                                                                      timeout=timeout_ms)
    progress_s = time.monotonic() - clicked
    expect(page.locator(LIVE_CHARTS).first).to_be_in_viewport(timeout=20_000)
    if name in ONLOOKED:
        watch_as_an_onlooker(page, name)
    headline = page.locator(".st-key-headline [data-testid=stAlert]")
    points = []
    for _ in range(timeout_ms // 500):
        if headline.count():
            break
        points.append(page.evaluate(LOSS_POINTS)[0])
        page.wait_for_timeout(500)
    expect(headline).to_be_visible(timeout=30_000)
    assert points == sorted(points), points  # never shrinking, never blank for a moment
    _, mounts, charts = page.evaluate(LOSS_POINTS)
    assert mounts == charts, f"{mounts} charts mounted for {charts} on the page"
    # Over (a third run may still train after the headline of the first two): it can be run again.
    expect(st_ui.button(page, "Run this demo")).to_be_enabled(timeout=timeout_ms)
    headline_s = time.monotonic() - clicked
    expect(headline).to_be_in_viewport(ratio=1.0)  # the result, whole, where the room looks
    # ... below Streamlit's header, which covers the top of the view, once the page has settled (scroll.SETTLE_MS)
    page.wait_for_function(BELOW_HEADER, timeout=10_000)
    st_ui.expect_no_exception(page)
    page.screenshot(path=str(artifacts / f"demo-{name}-1280x720.png"))  # what the room sees, unscrolled
    readable(page, "1280x720")
    for chart in page.locator(LIVE_CHARTS).filter(visible=True).all():  # a speaker points at each chart
        chart.hover()
        assert chart_problems(page, LIVE_CHARTS) == [], "after hovering"
    page.set_viewport_size(WIDE_PROJECTOR)
    expect(headline).to_be_visible()
    readable(page, "1440x900")
    drawn = page.evaluate(DRAWN)
    st_ui.screenshot(page, artifacts / f"demo-{name}-whole.png")
    assert problems == []
    _timings(artifacts, name, progress_s, headline_s)
    return headline.inner_text().removeprefix("📣").strip(), drawn


def _timings(artifacts, name: str, progress_s: float, headline_s: float) -> None:
    """Click → first progress and click → headline at the tests' scale, kept beside the screenshots (not asserted: a
    test never asserts wall-clock margins; docs/demos.md has the stage-size figures)."""
    path = artifacts / "demo-timings.json"
    found = json.loads(path.read_text()) if path.is_file() else {}
    found[name] = {"click_to_progress_s": round(progress_s, 1), "click_to_headline_s": round(headline_s, 1)}
    path.write_text(json.dumps(found, indent=1))


def lines(locator) -> int:
    """How many lines of text an element takes."""
    return locator.evaluate("""e => {
      const style = getComputedStyle(e);
      const text = e.getBoundingClientRect().height - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
      return Math.round(text / parseFloat(style.lineHeight));
    }""")


def story(drawn: list, axis: str) -> dict:
    """The chart with this y axis title: {trace name: {x: y}}, and its title under the key None."""
    _, title, traces = next(chart for chart in drawn if chart[0] == axis)
    return {None: title, **{name: dict(points) for name, points in traces}}


def claims(text: str) -> tuple[list[str], str]:
    """The headline's clauses and the line under it."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].split(" · "), lines[1]


def check_same_curve(text, drawn, page):
    said, _ = claims(text)
    assert re.fullmatch(r"Loss curves identical \(max difference (0|\d(e-0[5-9]|e-1\d))\)", said[0]), said
    assert re.fullmatch(r"activations \d\.\d× smaller", said[1]), said
    assert re.fullmatch(r"F1 \d\.\d{3} both", said[2]), said
    assert not re.search(r"per step|slower|faster|within noise", text), text  # runs one after the other: no time


def check_naive_vs_exact(text, drawn, page):
    said, against = claims(text)
    # At the tests' scale naive's curve leaves exact's at the short windows only: "by up to 75% (median 1e-07)".
    assert said[0].startswith("Loss curves differ by ") and "median" in said[0], said
    assert re.fullmatch(r"naive: \d+ of \d+ steps at 0\.25× their gradient", said[1]), said
    assert against == "naive ÷k against exact", against
    scales = story(drawn, demo_charts.SCALE_AXIS)
    exact, naive = scales["exact"], scales["naive ÷k"]
    assert set(exact.values()) == {1.0} and set(naive.values()) == {1.0, 0.25}  # what the chart draws ...
    dips = re.search(r"naive: (\d+) of (\d+) steps", said[1])
    assert int(dips.group(1)) == sum(value == 0.25 for value in naive.values())  # ... is what the headline says
    assert int(dips.group(2)) == len(naive) and said[1].removeprefix("naive: ") in scales[None]


def check_trainer_pitfall(text, drawn, page):
    said, _ = claims(text)
    ratio = re.fullmatch(r"Loss (\d\.\d)× smaller with gradacc's fix \(median of \d+ steps\): Trainer's default did "
                         r"not divide the loss by k=4", said[0])
    assert ratio and 3.5 <= float(ratio.group(1)) <= 4.5, said


def check_lm(text, drawn, page):
    said, against = claims(text)
    assert said[0].startswith("Loss curves differ by ") and "(median of " in said[0], said
    assert re.search(r"exact m=2, k=16 against it: loss curves identical \(max difference", against), against
    assert lines(page.locator(".st-key-headline h3")) <= 2
    differences = story(drawn, demo_charts.DIFFERENCE_AXIS)
    naive, exact = differences["naive ÷k m=2, k=16"], differences["exact m=2, k=16"]
    assert max(abs(value) for value in exact.values()) < 0.01  # % : float rounding
    assert max(abs(value) for value in naive.values()) > 0.5  # the drift, drawn where the room can see it


def check_memory_wall(text, drawn, page):
    panels = page.locator("[class*='st-key-demo-run-']")
    reason = st_ui.alert(panels.nth(0), "out of memory").inner_text()
    assert re.search(r"Failed[^:]*: out of memory: micro-batch 64 needs [\d.]+ MB \(static [\d.]+ MB \+ activations "
                     r"64 × [\d.]+ [kM]B\) of a 450 MB budget; m=16 with k=4 keeps the effective batch 64 within it",
                     reason), reason
    said, _ = claims(text)
    assert said[0].startswith("Loss curves identical (max difference") and re.match(r"activations \d\.\d× smaller",
                                                                                       said[1]), said
    expect(st_ui.alert(page, "out of memory")).to_have_count(1)  # the fitted run, in the same budget, trained


def gradient_table(page) -> dict:
    """The checks' table as the page shows it: {what m=M: relative error}."""
    rows = page.locator("[data-testid=stDataFrame]").filter(has_text="relative error").locator("tbody tr")
    table = {}
    for row in rows.all():
        cells = row.locator("td").all_inner_texts()
        table[f"{cells[0]} m={cells[1]}"] = float(cells[3])
    return table


def check_in_batch_negatives(text, drawn, page):
    said, against = claims(text)
    assert said[0].startswith("Loss curves differ"), said
    compared, control = against.split(" · ")
    assert compared == "MNRL m=16, k=4 against MNRL batch 64", against
    assert re.match(r"GradCache batch 64, mini-batch 16 against it: loss curves (identical|match) ", control), control
    expect(page.get_by_text(re.compile(r"^Accumulating \d+ micro-batches of 16 is \d+% off"))).to_be_visible(
        timeout=120_000)
    errors = gradient_table(page)
    assert errors["the same loss, accumulated m=16"] >= 0.1, errors
    assert errors["CachedMultipleNegativesRankingLoss (GradCache) m=64"] <= 1e-5, errors
    assert not any("bow-" in what for what in errors), errors  # the norms are the other demo's


def check_batchnorm(text, drawn, page):
    said, against = claims(text)
    assert said[0].startswith("Loss curves differ"), said
    assert against.startswith("BatchNorm m=4, k=8 against BatchNorm m=32, k=1 · "), against
    assert re.search(r"LayerNorm m=4, k=8 against LayerNorm m=32, k=1: loss curves (identical|match)", against), against
    differences = story(drawn, demo_charts.DIFFERENCE_AXIS)
    assert max(abs(v) for v in differences["BatchNorm m=4, k=8 against BatchNorm m=32, k=1"].values()) > 1  # %
    assert max(abs(v) for v in differences["LayerNorm m=4, k=8 against LayerNorm m=32, k=1"].values()) < 0.01
    expect(page.get_by_text(re.compile(r"^LayerNorm: at most"))).to_be_visible(timeout=120_000)
    errors = gradient_table(page)
    assert errors["bow-batchnorm m=2"] > errors["bow-batchnorm m=8"] > 0.01 and errors["bow-layernorm m=2"] <= 1e-5


# Each bar's label on the sharding chart, as the page drew it: [(trace name, x axis, [label per rank])].
SHARDING_BARS = """(title) => [...document.querySelectorAll('.gradacc-live-chart')]
  .filter((c) => c.offsetParent !== null && (c.layout.title?.text || '').replaceAll(' <br>', ' ') === title)
  .flatMap((chart) => chart.data.map((trace) => [trace.name, trace.xaxis || 'x', [...trace.text]]))"""


def check_fsdp_sync(text, drawn, page):
    said, against = claims(text)
    # The two syncs reduce in another order: float rounding, "identical" or "match" over 40 steps.
    assert re.match(r"Loss curves (identical|match) \(max difference", said[0]), said
    assert against == "per-micro-batch sync against per-window sync", against
    bars = {(name.split(" (")[0], axis): [float(label) for label in labels]
            for name, axis, labels in page.evaluate(SHARDING_BARS, fsdp_charts.TITLE)}
    held, sent = "x", "x2"  # the chart's two panels, as the headline's line and the page's explanation say
    assert len(bars) == 4 and all(len(ranks) == 2 for ranks in bars.values()), bars
    for window, micro in zip(bars[("per-window sync", held)], bars[("per-micro-batch sync", held)]):
        assert window == pytest.approx(2 * micro, rel=0.05), bars  # labels have 2 decimals
    for window, micro in zip(bars[("per-window sync", sent)], bars[("per-micro-batch sync", sent)]):
        assert micro == pytest.approx(4 * window, rel=0.05), bars


def check_pitfall(text, drawn, page):
    said, _ = claims(text)
    assert re.match(r"Broken on purpose: [a-z-]+ \(", said[0]), said
    # The broken run measured what its wrong line did: a run too short for it to show says so instead.
    pitfall = said[0].removeprefix("Broken on purpose: ").split(" (")[0]
    effect = page.get_by_text(re.compile(rf"^⚠️ broken: {pitfall}: Pitfall {pitfall} \(")).inner_text()
    assert not re.search(r"no (effect|short last window) in this run", effect), effect


CHECKS = {"same-curve": check_same_curve, "naive-vs-exact": check_naive_vs_exact,
          "trainer-pitfall": check_trainer_pitfall, "naive-vs-exact-lm": check_lm, "memory-wall": check_memory_wall,
          "in-batch-negatives": check_in_batch_negatives, "batchnorm": check_batchnorm, "fsdp-sync": check_fsdp_sync,
          **{name: check_pitfall for name in demos.SCENARIOS if name.startswith("pitfall-")}}


def test_the_run_button_is_in_view_on_load_on_the_wider_screen_too(page):
    """play() checks it at projector size for every demo. Only the demo's title, above the button, differs between
    demos, and the wider screen wraps it no more and is taller: the longest title stands for them all."""
    longest = max(demos.SCENARIOS.values(), key=lambda scenario: len(scenario.title))
    page.set_viewport_size(WIDE_PROJECTOR)
    st_ui.open_app(page, f"/demos?demo={longest.name}")
    expect(st_ui.button(page, "Run this demo")).to_be_in_viewport(ratio=1.0)


def test_every_demo_has_its_checks():
    assert set(CHECKS) == set(demos.SCENARIOS)


@pytest.mark.parametrize("name", list(demos.SCENARIOS))
def test_a_demo_from_its_link_to_its_result_on_both_screens(page, artifacts, name):
    text, drawn = play(page, artifacts, name)
    CHECKS[name](text, drawn, page)
    # Every run that trained is a curve of the loss chart (memory-wall's first fails before its first step, on purpose).
    trained = len(demos.SCENARIOS[name].runs) - (name == "memory-wall")
    assert [len(traces) for axis, _, traces in drawn if axis == "Loss"] == [trained], drawn
    st_ui.expect_no_exception(page)
