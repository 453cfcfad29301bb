"""Charts that stay in the page while a run goes and change in place.

``st.plotly_chart`` in Streamlit 1.67 derives a chart's identity from its figure, so each poll that brings new
points creates the chart anew in the browser (streamlit#8782; streamlit#16052 would change it): the Train page's
three charts cost each watching browser 0.37-0.49 s of CPU a second, and a room of five watchers filled the
browsers' core. ``live_chart`` keeps each chart mounted by its key (a ``st.components.v2`` component in the page's
own DOM) and hands every new figure to ``Plotly.react``, which changes only what differs.

plotly.js is the plotly package's own copy (the version its figures are written for). Streamlit serves a
component's files only from inside that component's folder, and refuses a symlink out of it, so the file is
copied once into a temporary folder and served from there by a static ``components.v1`` declaration.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import plotly
import plotly.graph_objects as go
import plotly.io
import streamlit as st
import streamlit.components.v1 as components_v1

from gradacc.app import charts

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_mount = st.components.v2.component("gradacc.live_chart", js=(Path(__file__).with_name("live_chart.js")
                                                              .read_text(encoding="utf-8")), isolate_styles=False)


@functools.cache
def _served_folder() -> str:
    """A folder holding a copy of plotly.min.js (once per process; servers sharing the folder each copy safely)."""
    folder = Path(tempfile.gettempdir()) / f"gradacc-plotly-{plotly.__version__}"
    folder.mkdir(exist_ok=True)
    target = folder / PLOTLY_JS.name
    if not target.is_file() or target.stat().st_size != PLOTLY_JS.stat().st_size:
        partial = folder / f".{PLOTLY_JS.name}.{os.getpid()}"
        shutil.copyfile(PLOTLY_JS, partial)
        os.replace(partial, target)  # atomic: a browser never gets half a file
    return str(folder)


def plotly_url() -> str:
    """Where the page loads plotly.js from, relative to the page (so a base URL path still works). Declared on
    every call: it costs microseconds, and each Streamlit runtime (each AppTest too) has its own registry."""
    served = components_v1.declare_component("plotly_js", path=_served_folder())
    return f"component/{served.name}/{PLOTLY_JS.name}"


def spec(figure: go.Figure) -> str:
    """The figure as the browser gets it, without plotly's default template: the chart takes the page's type and
    colours instead (live_chart.js). A shared figure (``charts.FrozenFigure``) is never changed after it is built,
    so its text is computed once for every session that draws it."""
    cached = getattr(figure, "_live_spec", None)
    if cached is not None:
        return cached
    as_dict = figure.to_dict()
    layout = {name: value for name, value in as_dict.get("layout", {}).items() if name != "template"}
    text = plotly.io.to_json({"data": as_dict.get("data", []), "layout": layout}, validate=False)
    if isinstance(figure, charts.FrozenFigure):
        figure._live_spec = text
    return text


def live_chart(figure: go.Figure, key: str) -> None:
    """Draw ``figure`` here; the chart with this ``key`` stays mounted across reruns and redraws in place."""
    text = spec(figure)
    _mount(key=key, data={"figure": text, "revision": hashlib.blake2b(text.encode(), digest_size=8).hexdigest(),
                          "plotly_url": plotly_url()})
