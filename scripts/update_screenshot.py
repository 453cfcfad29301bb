"""Refresh the README's picture (docs/screenshot.png) from the last browser test run, by hand.

The browser tests never write into the source tree; test_browser_demos.py leaves the Demos page after the
same-curve demo, headline and charts, in test-artifacts/demo-same-curve.png, and this copies it over:

    CI=true python3 -m pytest tests/browser/test_browser_demos.py && python3 scripts/update_screenshot.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "test-artifacts" / "demo-same-curve.png"
TARGET = ROOT / "docs" / "screenshot.png"


def main() -> int:
    if not SOURCE.is_file():
        print(f"error: {SOURCE.relative_to(ROOT)} not found: run tests/browser/test_browser_demos.py first",
              file=sys.stderr)
        return 1
    shutil.copyfile(SOURCE, TARGET)
    print(f"copied {SOURCE.relative_to(ROOT)} to {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
