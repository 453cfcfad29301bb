"""The app's entry: page setup and navigation; every page lives in ``pages/`` beside the main script.

Two ways in, one app: ``streamlit run app.py`` in a checkout (app.py calls ``main()``; pages/ is next to it),
and ``gradacc app`` from an installed package, which runs this file itself (the wheel puts the checkout's
pages/ here as gradacc/app/pages/). Page paths are relative to the main script, so they hold in both.
Nothing here imports torch or transformers: the run manager warms them up in the background while the
first page paints.
"""

import streamlit as st

from gradacc.app import server


def main() -> None:
    st.set_page_config(page_title="gradacc: gradient accumulation, live", page_icon="🧮", layout="wide")
    server.run_manager()  # the first visitor creates it: marks interrupted runs, starts warming up

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
    server.run_page(navigation)


if __name__ == "__main__":  # `gradacc app`: Streamlit runs this file as its main script
    main()
