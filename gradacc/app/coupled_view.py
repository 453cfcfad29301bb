"""The coupled-loss checks on a page: in-batch negatives three ways, and BatchNorm against LayerNorm.

Used by the Equivalence page's "When accumulation is *not* a big batch" and the ``coupled-losses`` demo. The
checks run on the server's check queue (``gradacc.serving.checks``); this draws what they found.
"""

from __future__ import annotations

import time

import streamlit as st

from gradacc.app import equivalence_view


def submit(runner) -> None:
    from gradacc.serving.checks import coupled_check_configs

    for config in coupled_check_configs():
        runner.submit(config)


def pending(runner) -> bool:
    """Some coupled check is submitted and not done (the caller polls while it is)."""
    from gradacc.serving.checks import coupled_check_configs

    checks = [runner.get(config) for config in coupled_check_configs()]
    return any(check is not None and not check.done for check in checks)


def draw(runner, key: str) -> None:
    """The checks' state, then their sentences and table once all are done."""
    from gradacc.serving.checks import coupled_check_configs

    checks = [runner.get(config) for config in coupled_check_configs()]
    if any(check is None for check in checks):
        st.info("The gradient checks run with the button above: all-MiniLM-L6-v2 three ways at effective batch 64, "
                "and the two norms at effective batch 16 (about half a minute on 2 vCPUs).")
        return
    waiting = [check for check in checks if not check.done]
    if waiting:
        waited = time.monotonic() - min(check.submitted for check in waiting)
        st.status(f"Gradient checks running… {waited:.0f} s so far.", state="running")
        return
    failed = [check.error for check in checks if check.error]
    if failed:
        st.error(f"A gradient check failed: {failed[0]}")
        return
    sentences, rows = equivalence_view.coupled_summary([check.report for check in checks])
    for sentence in sentences:
        st.markdown(f"- {sentence}")
    st.dataframe(rows, hide_index=True, key=f"{key}.coupled_table",
                 column_config={"relative error": st.column_config.NumberColumn(format="%.2e"),
                                "activations (MB)": st.column_config.NumberColumn(format="%.1f")})
