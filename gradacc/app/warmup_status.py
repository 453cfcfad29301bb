"""The status line of the background import of the training libraries."""

from __future__ import annotations

import streamlit as st

from gradacc.serving import warmup


WARM_UP_POLL_SECONDS = 1.0


def warm_up_status() -> None:
    """'warming up the training libraries…' until torch and transformers are imported, then 'ready'
    (or, if an import failed, that runs will fail until the server restarts)."""
    state_at_start = warmup.state()

    @st.fragment(run_every=WARM_UP_POLL_SECONDS if state_at_start in ("cold", "warming") else None)
    def status_line():
        state = warmup.state()
        if state in ("cold", "warming"):
            st.caption("⏳ Warming up the training libraries (torch, transformers)…")
            return
        # Ready: this fragment goes on polling (a caption a second) until the page's next full run, on any click,
        # draws it without. Only a page opened in the seconds the server warms up polls so. It never asks for a full
        # rerun: one would race the page's other fragment (a demo's live view) and mount its charts anew, a blink.
        if state == "warm":
            st.caption("✅ Training libraries ready.")
        else:
            st.error(f"The training libraries failed to import ({warmup.failure()}); runs will fail until "
                     "the server is restarted.")

    status_line()
