"""A room full of watchers: what keeps N pages watching one run from costing N times one page."""

from __future__ import annotations

import pytest

from gradacc import events as ev
from gradacc.app import charts, pacing
from gradacc.serving.run_state import RunState


def step(n: int, loss: float = 1.0) -> dict:
    return {"event": ev.STEP, "step": n, "samples_seen": 32 * n, "loss": loss, "rss_bytes": 5e8,
            "activation_bytes": 2e5, "elapsed_s": 0.1 * n}


class Clock:
    """A monotonic clock the test moves by hand: windows of seconds are crossed without sleeping."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def live_run(steps: int = 3) -> RunState:
    run = RunState("r1", "owner", None, {"micro_batch_size": 8, "grad_accum_steps": 4}, "queued")
    run.clock = Clock()
    run.record({"event": ev.RUN_STARTED, "total_steps": 100, "static_memory": {"total": 3e6}})
    for n in range(1, steps + 1):
        run.record(step(n))
    return run


def test_pages_polling_within_the_reuse_period_share_one_snapshot_and_so_one_figure_build():
    run, cache = live_run(), charts.FigureCache()

    def draw(viewer: str) -> tuple:
        current = run.snapshot(reuse_for=60.0, viewer=viewer)
        return cache.get(("train", run.run_id, len(current.events)), lambda: (charts.loss_figure(current.events),))

    first = draw("page-1")
    run.record(step(4))  # new steps between two pages' polls: without the shared snapshot, a second build
    second = draw("page-2")
    assert second is first and cache.builds == 1
    assert len(run.snapshot().events) == 5  # a caller that does not reuse sees the new step


def test_a_shared_snapshot_is_renewed_when_it_is_too_old_or_the_status_changes():
    run = live_run()
    shared = run.snapshot(reuse_for=60.0)
    run.record(step(4))
    assert run.snapshot(reuse_for=0.0) is not shared  # no reuse asked
    shared = run.snapshot(reuse_for=60.0)
    run.clock.now += 30.0
    assert run.snapshot(reuse_for=60.0) is shared  # young enough
    run.clock.now += 31.0
    assert run.snapshot(reuse_for=60.0) is not shared  # too old
    shared = run.snapshot(reuse_for=60.0)
    run.record({"event": ev.RUN_ENDED, "status": ev.COMPLETED, "steps": 4})
    ended = run.snapshot(reuse_for=60.0)
    assert ended is not shared and ended.status == ev.COMPLETED and ended.ended["steps"] == 4


def test_watchers_counts_sessions_seen_lately_once_each():
    run = live_run()
    for viewer in ("a", "b", "a", "c"):
        run.snapshot(reuse_for=1.0, viewer=viewer)
    run.snapshot()  # the owner's own bookkeeping, no viewer: not a watcher
    assert run.watchers() == 3
    run.clock.now += 5.0
    run.snapshot(viewer="d")
    assert run.watchers(within=4.0) == 1
    assert run.watchers(within=6.0) == 4


def test_events_by_kind_stay_right_as_the_run_grows():
    run = live_run(steps=2)
    assert [e["step"] for e in run.of(ev.STEP)] == [1, 2]
    run.record({"event": ev.EVAL, "epoch": 1, "eval_f1": 0.5})
    run.record(step(3))
    assert [e["step"] for e in run.of(ev.STEP)] == [1, 2, 3]
    assert run.of(ev.EVAL)[0]["eval_f1"] == 0.5
    assert run.progress() == (3, 100)
    run.of(ev.STEP).clear()  # a caller's copy: the run's own list is untouched
    assert len(run.of(ev.STEP)) == 3


@pytest.mark.parametrize(("watchers", "seconds"), [(0, 1.0), (1, 1.0), (2, 1.0), (3, 3.0), (5, 4.0), (10, 8.0),
                                                  (20, 8.0), (200, 8.0)])
def test_a_small_room_keeps_the_full_pace_a_larger_one_shares_a_budget_and_the_owner_keeps_the_full_pace(
        watchers, seconds):
    assert pacing.room_poll_seconds(watchers) == seconds
    assert (watchers <= pacing.FULL_PACE_PAGES or watchers / seconds <= pacing.ROOM_POLLS_PER_SECOND
            or seconds == pacing.MAX_CHART_POLL_SECONDS)
    assert pacing.room_poll_seconds(watchers, owner=True) == pacing.CHART_POLL_SECONDS


def test_a_long_line_is_thinned_to_its_lows_and_highs_and_keeps_its_ends_and_spikes():
    xs = list(range(10_000))
    ys = [1.0] * 10_000
    ys[4321], ys[8765] = 50.0, -3.0  # a spike and a dip, each one step wide
    shown_x, shown_y = charts.thin(xs, ys)
    assert len(shown_x) <= charts.MAX_POINTS + 2
    assert (shown_x[0], shown_x[-1]) == (0, 9_999)
    assert (4321, 50.0) in zip(shown_x, shown_y) and (8765, -3.0) in zip(shown_x, shown_y)
    assert shown_x == sorted(shown_x)
    assert charts.thin(xs[:50], ys[:50]) == (xs[:50], ys[:50])  # short lines are drawn whole


def test_the_loss_chart_says_when_it_draws_fewer_points_than_steps():
    events = [step(n, loss=1.0 / n) for n in range(1, 3_001)]
    figure = charts.loss_figure(events)
    assert len(figure.data[0].x) <= charts.MAX_POINTS + 2
    assert "3,000 steps" in figure.layout.xaxis.title.text
    assert "steps" not in charts.loss_figure(events[:10]).layout.xaxis.title.text


def test_sessions_gone_longer_than_the_window_are_forgotten():
    from gradacc.serving.run_state import WATCHERS_WINDOW_S

    run = live_run()
    run.snapshot(viewer="left")
    run.clock.now += WATCHERS_WINDOW_S / 2
    run.snapshot(viewer="stayed")
    assert run.watchers() == 2 and list(run._viewers) == ["left", "stayed"]  # both inside the window
    run.clock.now += WATCHERS_WINDOW_S / 2 + 1
    assert run.watchers() == 1
    assert list(run._viewers) == ["stayed"]  # not only uncounted: dropped


@pytest.mark.parametrize(("page", "room", "rerun"), [(1, 1, False), (1, 2, True), (2, 2, False), (2, 3, True),
                                                     (4, 5, False), (4, 3, False), (4, 1, False), (3, 1, False)])
def test_a_page_reruns_for_a_slower_pace_once_the_room_wants_one_well_beyond_its_own(page, room, rerun):
    assert pacing.needs_new_pace(page, room) is rerun
