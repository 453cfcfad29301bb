"""The app's navigation: its pages, the page ``st.navigation`` chose, and a page's link answered before the app ran.

Nothing here imports torch or transformers: the run manager warms them up in the background while the first page
paints. ``gradacc/app/streamlit_app.py`` (and ``app.py`` in a checkout) calls ``main``; every page calls
``under_navigation`` first.
"""

import threading

import streamlit as st

from gradacc.app import server


# Streamlit keeps a widget's or a metric's label on one line and cuts what does not fit with "…": on a projector
# (1280×720) the Train form's toggle read "Shard the model (…". A cut label reads as another setting; they wrap.
WRAPPED_LABELS = """<style>
[data-testid=stWidgetLabel] .stMarkdownEllipsis, [data-testid=stWidgetLabel] .stMarkdownEllipsis p,
[data-testid=stMetricLabel] .stMarkdownEllipsis, [data-testid=stMetricLabel] .stMarkdownEllipsis p {
  white-space: normal; overflow: visible; text-overflow: clip;
}
</style>"""


def main() -> None:
    st.set_page_config(page_title="gradacc: gradient accumulation, live", page_icon="🧮", layout="wide")
    server.run_manager()  # the first visitor creates it: marks interrupted runs, starts warming up
    st.html(WRAPPED_LABELS)

    navigation = st.navigation([
        # The landing page: what gradacc shows, one click to each demo or to Train.
        st.Page("pages/home.py", title="Start here", icon="🧮", default=True),
        # The page a speaker opens (/demos?demo=same-curve).
        st.Page("pages/demos.py", title="Demos", icon="🎬", url_path="demos"),
        st.Page("pages/train.py", title="Train", icon="🏋️", url_path="train"),
        st.Page("pages/compare.py", title="Compare runs", icon="📊"),
        st.Page("pages/equivalence.py", title="Equivalence", icon="⚖️"),
        # Is Trainer's default right for a model? The stock-Trainer audit, and how to audit one's own script.
        st.Page("pages/audit.py", title="Audit", icon="🩺", url_path="audit"),
        st.Page("pages/planner.py", title="Memory planner", icon="🧠"),
        st.Page("pages/code.py", title="Code", icon="📜"),
    ])
    run_page(navigation)


# Set while the app's navigation runs a page (``main``): a page run without it was opened alone.
_navigating = threading.local()


def under_navigation() -> None:
    """First thing on every page. Until some visitor has loaded the app's entry, a fresh server answers a page's own
    link (/demos?demo=..., /train) with Streamlit's pages/ folder fallback: that file alone, without the app's
    navigation (sidebar of file names, narrow layout). Then run the app instead, which draws this page."""
    if getattr(_navigating, "page", False):
        return
    main()
    st.stop()


def run_page(navigation) -> None:
    """Run the page ``st.navigation`` chose, marked as run by the app (see ``under_navigation``)."""
    _navigating.page = True
    try:
        navigation.run()
    finally:
        _navigating.page = False
