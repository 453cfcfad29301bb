"""Recorded runs as one web page that replays them as the Demos page showed them: the runs' panels, the headline
and the line under it, the warnings, the table, every chart in the app's rows and look, the gradient checks.

The timeline is built by ``frames`` with the app's own functions; the text by ``parts``; the page is page.html with
replay.css, the app's chart look (``live_chart/page_look.js``) and replay.js. plotly.js is inlined (one file that
opens anywhere, ``export-html``) or loaded from a file beside the page (a gallery's pages share one,
``export-site``). Nothing is fetched from the network.
"""

from __future__ import annotations

import html
import json
import string
from pathlib import Path

from plotly.offline import get_plotlyjs

from gradacc import __version__
from gradacc.app import comparison
from gradacc.app.live_chart import PAGE_LOOK_JS
from gradacc.app.replay import frames, parts
from gradacc.errors import GradaccError

HERE = Path(__file__).parent
TEMPLATE = string.Template((HERE / "page.html").read_text(encoding="utf-8"))
CSS = (HERE / "replay.css").read_text(encoding="utf-8")
PLOTLY_FILE = "plotly.min.js"  # beside a gallery's pages


def page_html(title: str, runs: list[tuple[str, list[dict]]], explanation: str = "", runs_caption: str = "",
              pairs: list[tuple[int, int]] | None = None, story: str | None = None, checks: list[dict] | None = None,
              plotly_src: str | None = None, crumbs: str = "") -> str:
    """The whole page. ``runs``: [(name, events)]; ``explanation``: Markdown; ``pairs``: the headline's pair, then
    further ones (default: the Compare page's choice); ``story``: a demo's first chart; ``checks``: gradient check
    reports shown with the result; ``plotly_src``: a relative URL of plotly.js (None: inlined); ``crumbs``: HTML
    above the title (a gallery's link back)."""
    labels = {f"run-{index}": label for index, (label, _) in enumerate(runs)}
    timeline = frames.timeline(runs, labels, pairs, story, checks)
    if not any(frame.get("charts") for frame in timeline["frames"]) or not any(
            e.get("event") == "step" for _, events in runs for e in events):
        raise GradaccError("Nothing to replay: none of the runs logged a training step.")
    data = json.dumps(timeline, separators=(",", ":"), allow_nan=False)
    return TEMPLATE.substitute(
        title=html.escape(title), crumbs=crumbs, version=html.escape(__version__),
        explanation=parts.markdown(explanation), runs=parts.inline(runs_caption),
        rows=chart_rows(story), css=CSS, page_look=PAGE_LOOK_JS.read_text(encoding="utf-8"),
        replay_js=(HERE / "replay.js").read_text(encoding="utf-8"),
        plotly=(f'<script src="{html.escape(plotly_src)}"></script>' if plotly_src else
                f"<script>{_plotly_js()}</script>"),
        data=data.replace("</", "<\\/"))  # no "</script>" inside the script


def chart_rows(story: str | None) -> str:
    """The charts' places, in the app's rows (``comparison.ROWS``): the table after the first row, the process
    memory folded away."""
    out = []
    for index, row in enumerate(comparison.STORY_ROWS if story else comparison.ROWS):
        if index == 1:
            out.append('<div id="table"></div>')
        cells = []
        for name, _ in row:
            chart = f'<div class="chart" id="chart-{name}"></div>'
            if name == "process":
                chart = f"<details><summary>{html.escape(comparison.PROCESS_NOTE)}</summary>{chart}</details>"
            cells.append(f"<div>{chart}</div>")
        widths = " ".join(f"minmax(0, {share}fr)" for _, share in row)
        out.append(f'<div class="row" style="grid-template-columns: {widths}">{"".join(cells)}</div>')
    return "\n".join(out)


def _plotly_js() -> str:
    return get_plotlyjs()
