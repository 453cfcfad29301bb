"""How often a live page redraws its runs: every second for the run's owner and a small room, slower as a room
of watchers grows, so the pages do not take the core the training they show needs."""

from __future__ import annotations

import math
import time

import streamlit as st

from gradacc.app.server import owner_id


# How often a live page polls its run; only while that run is queued or running. Charts are redrawn
# less often: building plotly figures is pure Python and competes with training for the GIL.
POLL_SECONDS = 0.5
CHART_POLL_SECONDS = 1.0

# A room of watchers (a link shared in a talk): every page redraws its run each poll, and on a small server that
# work competes with the training it shows. Up to FULL_PACE_PAGES pages poll every second; a larger room shares a
# budget of ROOM_POLLS_PER_SECOND: three pages poll every 3 s, five every 4 s, ten or more every 8 s
# (MAX_CHART_POLL_SECONDS at most). The run's owner, whose page is the one on the projector, keeps polling every
# second. A page says when it refreshes more slowly (docs/bench/watchers.md measures the budget).
FULL_PACE_PAGES = 2
ROOM_POLLS_PER_SECOND = 1.25
MAX_CHART_POLL_SECONDS = 8.0


def chart_poll_seconds(*runs) -> float:
    """Seconds between this page's redraws of these live runs (see ROOM_POLLS_PER_SECOND)."""
    runs = [run for run in runs if run is not None]
    watchers = max((run.watchers() for run in runs), default=0)
    return room_poll_seconds(watchers, owner=bool(runs) and any(run.owner == owner_id() for run in runs))


def room_poll_seconds(watchers: int, owner: bool = False) -> float:
    """A page's poll period in a room of ``watchers`` pages: every CHART_POLL_SECONDS up to FULL_PACE_PAGES, beyond
    that the room shares ROOM_POLLS_PER_SECOND, in whole seconds; the run's ``owner`` polls every
    CHART_POLL_SECONDS whatever the room."""
    if owner or watchers <= FULL_PACE_PAGES:
        return CHART_POLL_SECONDS
    return float(min(MAX_CHART_POLL_SECONDS, max(CHART_POLL_SECONDS, math.ceil(watchers / ROOM_POLLS_PER_SECOND))))


def watch(run, poll_seconds: float | None):
    """A snapshot of ``run`` for this session's poll: every page watching draws the same one (taken at most once
    per poll period of this page, a little under it so an early poll still sees new steps; the owner's faster
    polls renew it for everyone), so a room of watchers costs one figure build per period, not one per page.
    Counts this session as a watcher."""
    return run.snapshot(reuse_for=0.9 * (poll_seconds or 0.0), viewer=owner_id())


def keep_pace(poll_seconds: float | None, *runs) -> None:
    """Called by a live view at each poll: once the room has grown to want a period 1.5× this page's, rerun the
    whole page so it polls at that pace; then say the page's pace.

    A fragment's period is fixed when the page runs whole, so a page opened into an empty room would go on
    polling every second while twenty others join it. Only slower, never faster: when twenty browsers share one core,
    their polls come late and the room seems to empty and fill again, so pages that also sped up could rerun
    back and forth. A page that slowed down keeps its pace until it runs whole again (its run ends, a click)."""
    if poll_seconds and needs_new_pace(poll_seconds, chart_poll_seconds(*runs)):
        st.rerun()
    if poll_seconds and poll_seconds > CHART_POLL_SECONDS:
        st.caption(f"👥 Many pages are watching: this one refreshes every {poll_seconds:.0f} s.")


def needs_new_pace(page_seconds: float, room_seconds: float) -> bool:
    return room_seconds >= 1.5 * page_seconds


def finished_job(runner, config, pending: bool, noun: str, press: str, busy: str):
    """Inside a page's polling fragment: where the background job (a check, an audit) of ``config`` stands — the
    line that says which button starts it, its wait with the seconds so far, or its error — and the job once it
    ended well (None otherwise). ``pending``: the page polls for it; its end redraws the page once, unpolled."""
    job = runner.get(config) if config is not None else None
    if job is None:
        st.info(press)
        return None
    if not job.done:
        ahead = runner.waiting_before(job)
        where = f"waiting for {ahead} other {noun}(s) to finish" if ahead and not job.running else busy
        st.status(f"{noun.capitalize()} {where}… {time.monotonic() - job.submitted:.0f} s so far.", state="running")
        return None
    if pending:
        st.rerun()  # it just finished: redraw once without polling
    if job.error:
        st.error(f"The {noun} could not run: {job.error}")
        return None
    return job
