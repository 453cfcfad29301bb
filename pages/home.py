"""The landing page: what gradacc shows in one sentence, and one click to each demo or to Train.

A run link from before this page existed (``/?run=ID``) still opens that run on Train."""

import streamlit as st

from gradacc.analysis import demos
from gradacc.app import navigation, server

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

server.owner_id()  # this session's id, as on every page that can start runs
if st.query_params.get("run"):
    st.switch_page("pages/train.py", query_params={"run": st.query_params["run"]})

# Streamlit keeps a page link on one line and clips what does not fit: a demo's title, cut on a projector, reads as
# a different claim. Here the links wrap instead.
st.html("""<style>
.st-key-home-links [data-testid=stPageLink-NavLink] [data-testid=stMarkdownContainer],
.st-key-home-links [data-testid=stPageLink-NavLink] p { white-space: normal; overflow: visible; line-height: 1.4; }
</style>""")

st.title("gradacc: gradient accumulation, live")
st.markdown(f"#### {server.PITCH}")
# The demos' titles are long: their column takes three fifths, so most of them fit on one line at 1280 pixels.
demo_column, train_column = st.container(key="home-links").columns([3, 2], gap="large")
with demo_column:
    st.subheader("Watch a demo")
    st.caption(f"One click opens it; press **Run this demo** there: its runs side by side, live, then the result, "
               f"{demos.MEASURED_RESULT_S[0]}–{demos.MEASURED_RESULT_S[1]} s after the click on a shared 2-vCPU "
               "machine (measured; longer when it is busy).")
    for scenario in demos.SCENARIOS.values():
        st.page_link("pages/demos.py", label=scenario.title, icon="🎬", query_params={"demo": scenario.name})
with train_column:
    st.subheader("Or train your own")
    st.caption("Pick a model, m and k, press Start: loss, memory and F1 live, on this machine's CPU.")
    st.page_link("pages/train.py", label="Train", icon="🏋️")
    st.page_link("pages/planner.py", label="Memory planner: which m and k fit a budget", icon="🧠")
    st.page_link("pages/audit.py", label="Audit: is Trainer's default right for your model?", icon="🩺")
