"""The exported web page (python -m gradacc export-html) in chromium with every network request blocked: the
curves are drawn from the inlined plotly and grow as the replay goes, then the headline appears."""

from playwright.sync_api import expect

from support import recorded_run, write_events

from gradacc import cli


def test_the_exported_page_replays_its_curves_offline(browser, tmp_path):
    a = write_events(tmp_path / "a.jsonl", recorded_run(m=32, k=1, steps=8, seconds_per_step=0.25, dropout=0.0))
    b = write_events(tmp_path / "b.jsonl", recorded_run(m=8, k=4, steps=8, seconds_per_step=0.25, dropout=0.0))
    out = tmp_path / "demo.html"
    assert cli.main(["export-html", a, b, "--out", str(out)]) == 0

    context = browser.new_context(offline=True)
    requested, problems = [], []

    def block(route):  # the file itself loads; anything else would be the network
        if route.request.url.startswith("file:"):
            return route.continue_()
        requested.append(route.request.url)
        return route.abort()

    context.route("**/*", block)
    page = context.new_page()
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(out.as_uri())

    def loss_points() -> int:
        # What plotly drew: its decoded traces (the figure's x and y arrive as base64 typed arrays).
        return page.evaluate("() => document.getElementById('loss')._fullData"
                             ".reduce((n, trace) => n + (trace._length || 0), 0)")

    page.wait_for_function("() => document.getElementById('loss')._fullData !== undefined")
    first = loss_points()
    page.wait_for_function("() => document.getElementById('headline').textContent.length > 0", timeout=15_000)
    assert first < loss_points() == 16, (first, loss_points())  # the replay grew to both runs' 8 steps
    expect(page.locator("#headline")).to_contain_text("Loss curves identical")
    assert page.evaluate("() => document.getElementById('eval').data.length") > 0
    assert requested == [] and problems == []
    context.close()
