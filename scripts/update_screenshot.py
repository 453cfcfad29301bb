"""Refresh the README's picture (docs/screenshot.png) from a PNG you choose, by hand.

The browser tests never write into the source tree; test_browser_demos.py leaves the Demos page after the
same-curve demo, headline and charts, in test-artifacts/demo-same-curve-whole.png (run in one process, -n 0; under
two workers the file is in test-artifacts/gw0/ or gw1/). Name that file (or any other screenshot) and this copies it
over; the script itself never looks into the tests' output:

    CI=true .venv/bin/python -m pytest -n 0 tests/browser/test_browser_demos.py -k same-curve
    .venv/bin/python scripts/update_screenshot.py test-artifacts/demo-same-curve-whole.png
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "screenshot.png"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("png", type=Path, help="the screenshot to copy to docs/screenshot.png")
    source = parser.parse_args(argv).png
    if not source.is_file():
        print(f"error: {source} not found", file=sys.stderr)
        return 1
    if source.read_bytes()[:8] != PNG_SIGNATURE:
        print(f"error: {source} is not a PNG", file=sys.stderr)
        return 1
    shutil.copyfile(source, TARGET)
    print(f"copied {source} to {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
