"""gradacc.app.live_chart: what a live chart sends, and where the browser gets plotly.js from.

That a chart keeps its identity while its points grow is tested on the Train page (test_page_train.py), that the
browser keeps it mounted and draws it in place in tests/browser/test_browser_train.py.
"""

import gzip
import hashlib
import json
from pathlib import Path

import plotly.graph_objects as go
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES
from streamlit.web.server.component_file_utils import build_safe_abspath, guess_content_type
from support import plotted

from gradacc.app import charts, live_chart
from gradacc.app.live_chart import PLOTLY_JS, plotly_url, spec


def test_a_live_chart_sends_its_figure_without_plotlys_template():
    figure = charts.loss_figure([{"event": "step", "step": 1, "loss": 0.7}, {"event": "step", "step": 2, "loss": 0.5}])
    assert "template" in figure.to_dict()["layout"]  # plotly's default look, tens of kB a poll
    sent = json.loads(spec(figure))
    assert "template" not in sent["layout"]  # the chart takes the page's type and colours instead
    assert sent["layout"]["title"]["text"] == "Training loss"
    assert plotted(sent["data"][0]["y"]) == [0.7, 0.5]


def test_a_shared_figure_is_written_once_and_a_private_one_each_time():
    shared = charts.freeze(go.Figure(go.Scatter(x=[1, 2], y=[3, 4])))
    assert spec(shared) is spec(shared)  # every session watching a run sends the same text
    private = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    first = spec(private)
    private.add_trace(go.Scatter(x=[1], y=[1]))
    assert len(json.loads(spec(private))["data"]) == 2 and len(json.loads(first)["data"]) == 1


def test_plotly_js_is_served_gzipped_from_a_copy_streamlit_may_serve_as_it_lies():
    assert plotly_url() == f"component/{live_chart.__name__}.plotly_js/plotly.min.js.gz"
    # None if Streamlit would refuse to serve it (outside the declared folder, or a symlink out of it).
    zipped = build_safe_abspath(live_chart._served_folder(), "plotly.min.js.gz")
    plain = build_safe_abspath(live_chart._served_folder(), "plotly.min.js")  # for browsers that cannot unzip
    assert zipped is not None and plain is not None
    expected = hashlib.sha256(PLOTLY_JS.read_bytes()).digest()
    assert hashlib.sha256(gzip.decompress(Path(zipped).read_bytes())).digest() == expected
    assert hashlib.sha256(Path(plain).read_bytes()).digest() == expected
    # The server gzips each response again unless its type is one it leaves alone; the real server's answer is
    # checked in test_attack_server.py.
    assert guess_content_type(zipped) == "application/gzip" and "application/gzip" in DEFAULT_EXCLUDED_CONTENT_TYPES
