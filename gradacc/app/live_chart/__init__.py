"""Charts that stay in the page while a run goes and change in place.

``st.plotly_chart`` in Streamlit 1.67 derives a chart's identity from its figure, so each poll that brings new
points creates the chart anew in the browser (streamlit#8782; streamlit#16052 would change it): the Train page's
three charts cost each watching browser 0.37-0.49 s of CPU a second, and a room of five watchers filled the
browsers' core. ``live_chart`` keeps each chart mounted by its key (a ``st.components.v2`` component in the page's
own DOM) and hands every new figure to ``Plotly.react``, which changes only what differs.

plotly.js is the plotly package's own copy (the version its figures are written for). Streamlit serves a
component's files only from inside that component's folder, and refuses a symlink out of it, so the file is
written once into a temporary folder and served from there by a static ``components.v1`` declaration.

It is written gzipped, and the page unzips it (``DecompressionStream``). Streamlit's server gzips every other
component file again on each request, in Python: 85-110 ms of its one core for plotly's 4.8 MB, per visitor,
all at once when a room opens a shared link (measured with py-spy: over half of what the server did besides
training while twenty pages opened). A ``.gz`` file is sent as it lies (``application/gzip``, which the server
never compresses), 1.5 MB instead of 4.8 MB. A browser without ``DecompressionStream`` loads the plain copy.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
from pathlib import Path

import plotly
import plotly.graph_objects as go
import plotly.io
import streamlit as st
import streamlit.components.v1 as components_v1

from gradacc.app import charts

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLOTLY_JS_GZ = f"{PLOTLY_JS.name}.gz"  # what the page loads; the plain copy beside it, for old browsers
# The charts' look (page_look.js) is shared with the replay pages: one file, put in front of the component's code.
PAGE_LOOK_JS = Path(__file__).with_name("page_look.js")
_mount = st.components.v2.component("gradacc.live_chart", js=PAGE_LOOK_JS.read_text(encoding="utf-8") + "\n" + (
    Path(__file__).with_name("live_chart.js").read_text(encoding="utf-8")), isolate_styles=False)


@functools.cache
def _served_folder() -> str:
    """A folder holding plotly.min.js and its gzipped copy (written once per machine; servers sharing the folder
    each write safely)."""
    folder = Path(tempfile.gettempdir()) / f"gradacc-plotly-{plotly.__version__}"
    folder.mkdir(exist_ok=True)
    plain, zipped = folder / PLOTLY_JS.name, folder / PLOTLY_JS_GZ
    if not plain.is_file() or plain.stat().st_size != PLOTLY_JS.stat().st_size:
        _write(plain, PLOTLY_JS.read_bytes())
    if not zipped.is_file():
        _write(zipped, gzip.compress(PLOTLY_JS.read_bytes(), compresslevel=9, mtime=0))  # 0.15 s, once
    return str(folder)


def _write(target: Path, content: bytes) -> None:
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_bytes(content)
    os.replace(partial, target)  # atomic: a browser never gets half a file


def plotly_url() -> str:
    """Where the page loads plotly.js from, gzipped, relative to the page (so a base URL path still works); the
    plain copy is the same URL without ``.gz``. Declared on every call: it costs microseconds, and each Streamlit
    runtime (each AppTest too) has its own registry."""
    served = components_v1.declare_component("plotly_js", path=_served_folder())
    return f"component/{served.name}/{PLOTLY_JS_GZ}"


def spec(figure: go.Figure) -> str:
    """The figure as the browser gets it, without plotly's default template: the chart takes the page's type and
    colours instead (live_chart.js). A shared figure (``charts.FrozenFigure``) is never changed after it is built,
    so its text is computed once for every session that draws it."""
    cached = getattr(figure, "_live_spec", None)
    if cached is not None:
        return cached
    as_dict = figure.to_dict()
    layout = {name: value for name, value in as_dict.get("layout", {}).items() if name != "template"}
    layout = charts.fit_legend(layout, as_dict.get("data", []))
    text = plotly.io.to_json({"data": as_dict.get("data", []), "layout": layout}, validate=False)
    if isinstance(figure, charts.FrozenFigure):
        figure._live_spec = text
    return text


def live_chart(figure: go.Figure, key: str, toolbar: bool = True) -> None:
    """Draw ``figure`` here; the chart with this ``key`` stays mounted across reruns and redraws in place.
    ``toolbar``: plotly's toolbar on hover; without it (a demo on a projector) nothing covers a chart that the page
    scrolled under the pointer (a drag still zooms, a double click resets)."""
    text = spec(figure)
    _mount(key=key, data={"figure": text, "revision": hashlib.blake2b(text.encode(), digest_size=8).hexdigest(),
                          "plotly_url": plotly_url(), "toolbar": toolbar})
