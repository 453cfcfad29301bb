"""The exported web page (python -m gradacc export-html) and the gallery (python -m gradacc export-site) in chromium
with every network request refused: the page replays its runs as the Demos page showed them, from disk, to its
headline, with charts a room can read."""

import re

from playwright.sync_api import expect

from chart_checks import chart_problems
from chromium import PROJECTOR, WIDE_PROJECTOR
from support import recorded_run, write_events

from gradacc import cli
from gradacc.analysis import demos
from gradacc.app import gallery


def offline_page(browser, viewport=PROJECTOR):
    """A page that may load files and nothing else; (page, the requests refused, console problems)."""
    context = browser.new_context(offline=True, viewport=viewport)
    requested, problems = [], []

    def block(route):  # the files themselves load; anything else would be the network
        if route.request.url.startswith("file:"):
            return route.continue_()
        requested.append(route.request.url)
        return route.abort()

    context.route("**/*", block)
    page = context.new_page()
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    return page, requested, problems


def loss_points(page) -> int:
    # What plotly drew: its decoded traces.
    return page.evaluate("() => document.getElementById('chart-loss')._fullData"
                         ".reduce((n, trace) => n + (trace._length || 0), 0)")


def test_the_exported_page_replays_its_curves_offline(browser, tmp_path):
    a = write_events(tmp_path / "a.jsonl", recorded_run(m=32, k=1, steps=8, seconds_per_step=0.25, dropout=0.0))
    b = write_events(tmp_path / "b.jsonl", recorded_run(m=8, k=4, steps=8, seconds_per_step=0.25, dropout=0.0))
    out = tmp_path / "demo.html"
    assert cli.main(["export-html", a, b, "--out", str(out)]) == 0
    page, requested, problems = offline_page(browser)
    page.goto(out.as_uri())
    page.wait_for_function("() => document.getElementById('chart-loss')._fullData !== undefined")
    first = loss_points(page)
    expect(page.locator("#headline")).to_contain_text("Loss curves identical", timeout=15_000)
    assert first < loss_points(page) == 16, (first, loss_points(page))  # the replay grew to both runs' 8 steps
    expect(page.locator("#headline")).to_contain_text("m=8, k=4 against m=32, k=1")  # the line under it, as in the app
    expect(page.locator("#table td").first).to_be_visible()
    for chart in ("eval", "memory"):
        assert page.evaluate(f"() => document.getElementById('chart-{chart}').data.length") > 0
    assert requested == [] and problems == []
    page.context.close()


def test_the_gallery_opens_from_disk_and_plays_a_demo_to_its_headline(browser, store, tmp_path, artifacts):
    # Recorded runs of one demo in the store (no training here): the gallery records nothing.
    scenario = demos.get("naive-vs-exact")
    for index, ((label, config), normalization) in enumerate(zip(scenario.configs(), ("exact", "naive"))):
        store.create_run(f"run{index}", "someone", config.to_dict(), label=scenario.run_label(label))
        for event in recorded_run(m=8, k=4, steps=12, seconds_per_step=0.2, dropout=0.0,
                                  loss_normalization=normalization, start=1000.0 + 100 * index):
            store.append_event(f"run{index}", event)
        store.set_status(f"run{index}", "completed")
    said = []
    written = gallery.write_site(tmp_path / "site", store, say=said.append, names=["naive-vs-exact"])
    assert written["recorded"] == [] and written["pages"] == ["index.html", "naive-vs-exact.html"]
    assert (tmp_path / "site" / "README.md").read_text().startswith("---\ntitle: gradacc demos\n")
    assert "sdk: static" in (tmp_path / "site" / "README.md").read_text()
    for screen in (PROJECTOR, WIDE_PROJECTOR):
        page, requested, problems = offline_page(browser, screen)
        page.goto((tmp_path / "site" / "index.html").as_uri())
        page.get_by_role("link", name=scenario.title).click()  # from the index to the demo, on disk
        expect(page.get_by_role("heading", name=scenario.title, exact=True)).to_be_visible()
        page.wait_for_function("() => document.getElementById('chart-story')._fullData !== undefined")
        expect(page.locator("#headline h3")).to_contain_text(re.compile(r"^Loss curves"), timeout=20_000)
        expect(page.locator("#panels")).to_contain_text("Completed: 12 optimizer steps")
        assert chart_problems(page, ".js-plotly-plot") == []
        page.screenshot(path=str(artifacts / f"gallery-naive-vs-exact-{screen['width']}x{screen['height']}.png"),
                        full_page=True)
        assert requested == [] and problems == []
        page.context.close()
