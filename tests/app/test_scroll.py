"""gradacc.app.scroll: the frame that brings a demo's runs into view, drawn without a Streamlit deprecation.

That it scrolls is tested in the browser (tests/browser/test_browser_demos.py: the runs and the headline in view).
"""

from streamlit import deprecation_util
from streamlit.testing.v1 import AppTest


def draw_a_scroll():
    from gradacc.app import scroll

    scroll.into_view("demo-live", nonce="runs a b")


def test_the_scroll_is_an_inline_frame_naming_its_container_and_logs_no_deprecation(monkeypatch):
    """``components.v1.html`` logged its deprecation on every poll of a running demo."""
    warned = []
    monkeypatch.setattr(deprecation_util, "show_deprecation_warning", lambda message, *a, **k: warned.append(message))
    at = AppTest.from_function(draw_a_scroll).run()
    assert not at.exception
    (frame,) = at.get("iframe")
    assert "// runs a b" in frame.proto.srcdoc and '".st-key-demo-live"' in frame.proto.srcdoc
    assert warned == []
