"""The headless Chromium the browser tests and the page-measuring scripts drive: where it is, the flags that keep
it off the network (this machine has none) and quiet as root, and the window size pages are drawn at."""

import os

CHROMIUM = os.environ.get("GRADACC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 1000}
# The screens a demo is given on: a projector (1280×720) and a wider one or a laptop (1440×900).
PROJECTOR = {"width": 1280, "height": 720}
WIDE_PROJECTOR = {"width": 1440, "height": 900}


def launch(playwright):
    """A headless Chromium from a running ``sync_playwright()``."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
