"""Cold and warm latency of the Train page in a real browser, as a visitor sees it.

Starts `streamlit run app.py` with an empty GRADACC_HOME, opens the page in Debian's chromium and prints
one JSON object (seconds):

- server_healthy_s: process start to /_stcore/health answering;
- first_paint_s: opening the page to its title on screen (the first script run; torch not imported yet);
- libraries_ready_s: opening the page to "Training libraries ready" (torch, transformers, accelerate);
- click_to_first_loss_s: clicking Start to the first point on the loss chart, once per run, each run in
  a new browser session (a visitor's first click: the page has loaded nothing for a run yet).

    python3 scripts/page_latency.py [--runs 3]

Uses the browser tests' helpers (tests/browser) so it drives the page exactly as they do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from conftest import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, free_port, stop  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

import st_ui  # noqa: E402
import train_page  # noqa: E402


def start_server(home: str, port: int) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "GRADACC_HOME": home, "GRADACC_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "GRADACC_ALLOW_HUB": "0"}
    started = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1):
                return server, time.monotonic() - started
        except OSError:
            if server.poll() is not None or time.monotonic() - started > 90:
                raise SystemExit("error: streamlit did not start")
            time.sleep(0.05)


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
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        server, healthy = start_server(home, port)
        result = {"server_healthy_s": round(healthy, 2)}
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport=VIEWPORT, base_url=f"http://127.0.0.1:{port}")
                opened = time.monotonic()
                page.goto("/")
                page.get_by_role("heading", name="Gradient accumulation, live").wait_for(timeout=90_000)
                result["first_paint_s"] = round(time.monotonic() - opened, 2)
                expect(page.get_by_text("Training libraries ready")).to_be_visible(timeout=120_000)
                result["libraries_ready_s"] = round(time.monotonic() - opened, 2)
                base_url = f"http://127.0.0.1:{port}"
                result["click_to_first_loss_s"] = [time_first_run(browser, base_url) for _ in range(runs)]
                browser.close()
        finally:
            stop(server)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
