"""Each demo as a speaker's click sees it, at its stage size, in a real browser: click → first visible progress (the
first run's panel saying what it does), click → first point on the first chart, click → headline, with the load
average (1 min) before and after each demo: the figures of docs/demos.md's table.

Starts `streamlit run app.py` with an empty GRADACC_HOME (the libraries warm before the first demo is clicked), opens
/demos?demo=NAME at 1280×720 in Debian's chromium, clicks **Run this demo** and polls the page every 100 ms. Prints
one JSON object per demo, as it goes.

    python3 scripts/demo_timings.py [NAME ...] > demo-timings.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts" / "browsing"), str(ROOT)]  # the browser tests' helpers; gradacc

from chromium import PROJECTOR, launch  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

import st_ui  # noqa: E402
from app_server import StreamlitServer  # noqa: E402
from gradacc.analysis import demos  # noqa: E402

# The first run's status once it shows anything but "Queued": a loading step, its steps, or its end.
PROGRESS = """() => {
  const panel = document.querySelector("[class*='st-key-demo-run-'] [data-testid=stAlert]");
  return panel ? panel.innerText : '';
}"""
# Points on the loss chart (its y axis says "Loss"): a demo's first chart may need two runs before it draws any.
FIRST_POINTS = """() => {
  const chart = [...document.querySelectorAll('.gradacc-live-chart')]
    .find((c) => c.offsetParent !== null && c.calcdata && c.layout.yaxis?.title?.text === 'Loss');
  return chart ? chart.calcdata.reduce((n, trace) => n + trace.length, 0) : 0;
}"""


def time_demo(browser, base_url: str, name: str, limit_s: float = 600.0) -> dict:
    page = browser.new_page(viewport=PROJECTOR, base_url=base_url)
    st_ui.open_app(page, f"/demos?demo={name}")
    load_before = os.getloadavg()[0]
    st_ui.click(page, "Run this demo")
    clicked = time.monotonic()
    found: dict = {"demo": name}
    headline = page.locator(".st-key-headline [data-testid=stAlert]")
    while time.monotonic() - clicked < limit_s:
        elapsed = round(time.monotonic() - clicked, 1)
        if "click_to_progress_s" not in found and page.evaluate(PROGRESS).strip() not in ("", "Queued"):
            status = page.evaluate(PROGRESS).strip()
            if not status.startswith("Queued"):
                found["click_to_progress_s"], found["first_progress"] = elapsed, status.split("\n")[-1]
        if "click_to_first_point_s" not in found and page.evaluate(FIRST_POINTS) > 0:
            found["click_to_first_point_s"] = elapsed
        if headline.count():
            found["click_to_headline_s"] = elapsed
            break
        page.wait_for_timeout(100)
    expect(st_ui.button(page, "Run this demo")).to_be_enabled(timeout=limit_s * 1000)  # every run ended
    found["click_to_last_run_ended_s"] = round(time.monotonic() - clicked, 1)
    found["headline"] = headline.inner_text().removeprefix("📣").strip() if headline.count() else None
    found["load_before"], found["load_after"] = round(load_before, 1), round(os.getloadavg()[0], 1)
    page.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="demos to time (default: every one)")
    names = parser.parse_args().names or list(demos.SCENARIOS)
    with tempfile.TemporaryDirectory() as home:
        server = StreamlitServer(Path(home), Path(home) / "streamlit.log", {"GRADACC_DEMO_SCALE": "1"})
        try:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                warm = browser.new_page(viewport=PROJECTOR, base_url=server.url)
                st_ui.open_app(warm, "/demos")
                expect(warm.get_by_text("Training libraries ready")).to_be_visible(timeout=180_000)
                warm.close()
                for name in names:
                    print(json.dumps(time_demo(browser, server.url, name)), flush=True)
                browser.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
