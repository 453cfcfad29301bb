"""Cold and warm latency of the Train page in a real browser, as a visitor sees it.

Starts `streamlit run app.py` with an empty GRADACC_HOME, opens the page in Debian's chromium and prints
one JSON object (seconds):

- server_healthy_s: process start to /_stcore/health answering;
- first_paint_s: opening the page to its title on screen (the first script run; torch not imported yet);
- libraries_ready_s: opening the page to "Training libraries ready" (torch, transformers, accelerate);
- click_to_first_loss_s: clicking Start to the first point on the loss chart, once per run, each run in
  a new browser session (a visitor's first click: the page has loaded nothing for a run yet).

    python3 scripts/page_latency.py [--runs 3] > page-latency.json
    python -m gradacc bench latency --browser-times page-latency.json   # the browser figure beside the others

Uses the helpers the browser tests use (scripts/browsing/), so it drives the page exactly as they do.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts" / "browsing")]  # the helpers the browser tests use too

from chromium import VIEWPORT, launch  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

import st_ui  # noqa: E402
import train_page  # noqa: E402
from app_server import StreamlitServer  # noqa: E402


def time_first_run(browser, base_url: str) -> float:
    """A new visitor opens the page, clicks Start and waits for the first loss point; then Stop."""
    page = browser.new_page(viewport=VIEWPORT, base_url=base_url)
    st_ui.open_app(page)
    train_page.configure(page, micro_batch=8, accum_steps=4, epochs=1)
    seconds = train_page.start_and_time_first_loss(page)["click_to_first_loss_s"]
    if st_ui.button(page, "Stop").count():  # a fast run may have finished already
        st_ui.click(page, "Stop")
    train_page.wait_until_ended(page, "(Stopped|Completed)", timeout_ms=30_000)
    page.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs to time (default 5)")
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as home:
        started = time.monotonic()
        server = StreamlitServer(Path(home), Path(home) / "streamlit.log")
        result = {"server_healthy_s": round(time.monotonic() - started, 2)}
        try:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                page = browser.new_page(viewport=VIEWPORT, base_url=server.url)
                opened = time.monotonic()
                page.goto("/")
                page.get_by_role("heading", name="Gradient accumulation, live").wait_for(timeout=90_000)
                result["first_paint_s"] = round(time.monotonic() - opened, 2)
                expect(page.get_by_text("Training libraries ready")).to_be_visible(timeout=120_000)
                result["libraries_ready_s"] = round(time.monotonic() - opened, 2)
                result["click_to_first_loss_s"] = [time_first_run(browser, server.url) for _ in range(runs)]
                browser.close()
        finally:
            server.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
