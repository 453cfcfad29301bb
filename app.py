"""gradacc: gradient accumulation, live. Run with ``streamlit run app.py``.

This file only sets up the page and the navigation; every page lives in ``pages/``. Nothing here imports
torch or transformers: the run manager warms them up in the background while the first page paints.
"""

import streamlit as st

from gradacc.app import widgets as ui

st.set_page_config(page_title="gradacc: gradient accumulation, live", page_icon="🧮", layout="wide")
ui.run_manager()  # the first visitor creates it: marks interrupted runs, starts warming up

navigation = st.navigation([
    # First in the menu: the page a speaker opens (/demos?demo=same-curve).
    st.Page("pages/demos.py", title="Demos", icon="🎬", url_path="demos"),
    st.Page("pages/train.py", title="Train", icon="🏋️", default=True),
    st.Page("pages/compare.py", title="Compare runs", icon="📊"),
    st.Page("pages/equivalence.py", title="Equivalence", icon="⚖️"),
    st.Page("pages/planner.py", title="Memory planner", icon="🧠"),
    st.Page("pages/code.py", title="Code", icon="📜"),
])
navigation.run()
