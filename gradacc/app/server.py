"""What one Streamlit server holds for all its visitors: the run manager, the equivalence-check and audit queues, the
deployment's limits, the figure cache; and each browser session's owner id.

Importing this must stay cheap (no torch, no transformers): every page imports it before painting.
"""

from __future__ import annotations

import sys
import uuid

import streamlit as st

from gradacc.errors import GradaccError
from gradacc.serving import warmup
from gradacc.serving.audits import THREAD_NAME as AUDIT_THREAD_NAME, audit_key, stock_audit
from gradacc.serving.checks import CheckRunner
from gradacc.serving.limits import Limits
from gradacc.serving.manager import RunManager
from gradacc.serving.store import RunStore


SWITCH_INTERVAL_S = 0.001


@st.cache_resource(show_spinner=False)
def _create_manager() -> RunManager:
    warmup.torch_threads()  # a bad GRADACC_TORCH_THREADS stops the page with one sentence, like the limits
    # The training thread gives the GIL up inside every torch op and must win it back after: while pages are
    # drawn in other threads, each op can wait out a whole switch interval (5 ms by default). 1 ms keeps a
    # room of watchers from stalling the run they watch (docs/bench/watchers.md).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # plotly looks numpy and pandas up in sys.modules without importing them; while the warm-up thread is
    # half-way through importing pandas, a chart drawn here would find a partial module and fail. Import both
    # fully first (well under a second), then warm up the rest.
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    # Slots and the time limit come from the deployment's Limits (a bad value: GradaccError, shown below).
    # recover=True marks runs a previous server left queued/running as interrupted (once per server).
    manager = RunManager(RunStore(), recover=True)
    warmup.start()  # torch and transformers import in the background while the page paints
    return manager


def run_manager() -> RunManager:
    """The server's RunManager; a broken deployment setting stops the page with one sentence."""
    try:
        return _create_manager()
    except GradaccError as error:
        st.error(f"This server is misconfigured: {error.message}")
        st.stop()
    except OSError as error:
        st.error(f"Cannot open the run store ({error.strerror or error}); check GRADACC_HOME.")
        st.stop()


@st.cache_resource(show_spinner=False)
def check_runner():
    """The server's queue of equivalence checks (one worker thread, shared by every visitor)."""
    return CheckRunner()


@st.cache_resource(show_spinner=False)
def audit_runner():
    """The server's queue of stock-Trainer audits (the Audit page), one worker thread like the checks'."""
    return CheckRunner(stock_audit, audit_key, thread_name=AUDIT_THREAD_NAME)


@st.cache_resource(show_spinner=False)
def grpo_runner():
    """The server's queue of GRPO scale checks (the Equivalence page's GRPO section), one worker thread."""
    from gradacc.analysis import grpo_scale  # torch-free at import: the check imports TRL when it runs

    def check(case):
        from gradacc.bench import grpo  # here: torch and TRL load with the check, not with the page

        warmup.wait_until_warm()
        return grpo_scale.check(case, grpo.one_run)

    return CheckRunner(check, grpo_scale.key, thread_name="gradacc-grpo-check")


def limits() -> Limits:
    try:
        return Limits.from_env()
    except GradaccError as error:
        st.error(f"This server is misconfigured: {error.message}")
        st.stop()


# What gradacc shows, in one sentence: the landing page says it to a first-time visitor.
PITCH = ("gradacc trains a model live and shows that k micro-batches of m examples, accumulated, give the same "
         "loss curve as one batch of m × k, with a fraction of the memory, and what breaks when it is done wrong.")


def owner_id() -> str:
    """This browser session's id: runs it starts are its own to stop."""
    if "owner" not in st.session_state:
        st.session_state["owner"] = uuid.uuid4().hex
    return st.session_state["owner"]


@st.cache_resource(show_spinner=False)
def figure_cache():
    """The server's figures, shared by every session (gradacc.app.charts.FigureCache)."""
    from gradacc.app.charts import FigureCache  # plotly: imported when a chart is first drawn, not per page

    return FigureCache()


def shared_figures(key, build) -> tuple:
    """``build()``'s figures for ``key`` (page, run ids, event counts, view), built once for all sessions."""
    return figure_cache().get(key, build)
