"""The coupled-loss checks on a page: in-batch negatives three ways, and BatchNorm against LayerNorm.

Used by the Equivalence page's "When accumulation is *not* a big batch" (every check) and the demos
``in-batch-negatives`` and ``batchnorm`` (one set each, ``which``: ``serving.checks.CHECK_SETS``). The checks run
on the server's check queue (``gradacc.serving.checks``); this draws what they found.
"""

from __future__ import annotations

import time

import streamlit as st

from gradacc.app import equivalence_view
from gradacc.serving.checks import coupled_check_configs

# What each set checks, said while nothing has run yet.
ABOUT = {"in-batch-negatives": "all-MiniLM-L6-v2 three ways at effective batch 64",
         None: "all-MiniLM-L6-v2 three ways at effective batch 64, and the two norms at effective batch 16",
         "norms": "BatchNorm and LayerNorm at effective batch 16, split into micro-batches of 2 to 16"}


def submit(runner, which: str | None = None) -> None:
    for config in coupled_check_configs(which):
        runner.submit(config)


def pending(runner, which: str | None = None) -> bool:
    """Some coupled check is submitted and not done (the caller polls while it is)."""
    checks = [runner.get(config) for config in coupled_check_configs(which)]
    return any(check is not None and not check.done for check in checks)


def reports(runner, which: str | None) -> list[dict] | None:
    """The checks' reports once every one of the set is done and none failed; else None."""
    if not which:
        return None
    checks = [runner.get(config) for config in coupled_check_configs(which)]
    if any(check is None or not check.done or check.error for check in checks):
        return None
    return [check.report for check in checks]


def draw(runner, which: str | None, key: str) -> None:
    """The checks' state, then their sentences and table once all are done."""
    checks = [runner.get(config) for config in coupled_check_configs(which)]
    if any(check is None for check in checks):
        st.info(f"The gradient checks run with the button above: {ABOUT[which]} (seconds to half a minute on 2 "
                "vCPUs).")
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
    shown = equivalence_view.coupled_columns(rows)
    st.dataframe(rows, hide_index=True, key=f"{key}.coupled_table", column_order=shown,
                 column_config={"relative error": st.column_config.NumberColumn(format="%.2e")})
