"""A gallery written by ``python -m gradacc export-site DIR``, opened from disk as a visitor would with no network:
its total size, and for each demo page the time from navigation to its first charts drawn (the page's own
``gradacc-first-chart`` performance mark), each page opened ``--times`` times in a fresh browser context.

    python3 scripts/gallery_first_chart.py DIR [--times 3]

Prints one JSON object: bytes, files, and per page the median and range of its first-chart times (ms).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts" / "browsing")]

from chromium import PROJECTOR, launch  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

FIRST_CHART = "() => performance.getEntriesByName('gradacc-first-chart').map((mark) => mark.startTime)[0]"


def first_chart_ms(browser, page_path: Path) -> float:
    context = browser.new_context(offline=True, viewport=PROJECTOR)
    refused = []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else (refused.append(route.request.url), route.abort()))
    page = context.new_page()
    page.goto(page_path.as_uri())
    page.wait_for_function(f"({FIRST_CHART})() !== undefined", timeout=60_000)
    took = page.evaluate(FIRST_CHART)
    context.close()
    if refused:
        raise SystemExit(f"{page_path.name} asked the network for {refused}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--times", type=int, default=3)
    args = parser.parse_args()
    files = [path for path in args.folder.iterdir() if path.is_file()]
    pages = sorted(path for path in files if path.suffix == ".html" and path.name != "index.html")
    result = {"bytes": sum(path.stat().st_size for path in files), "files": len(files),
              "load_before": round(os.getloadavg()[0], 1), "pages": {}}
    with sync_playwright() as playwright:
        browser = launch(playwright)
        for page_path in pages:
            times = [first_chart_ms(browser, page_path) for _ in range(args.times)]
            result["pages"][page_path.name] = {"bytes": page_path.stat().st_size,
                                               "first_chart_ms_median": round(statistics.median(times)),
                                               "first_chart_ms_range": [round(min(times)), round(max(times))]}
        browser.close()
    result["load_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
