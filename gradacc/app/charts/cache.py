"""One build of a figure for every watcher: figures frozen once built, a cache shared by the server's sessions, and
lines thinned to what a chart can show."""

from __future__ import annotations

import collections
import math
import threading
from typing import Callable, Hashable

import plotly.graph_objects as go

# Most points one line draws (TensorBoard draws 1,000 a scalar too). A long run's 20,000 steps cannot show on a
# chart a thousand pixels wide, and every point costs a build, the wire and the browser on each poll.
MAX_POINTS = 1000


class FrozenFigure(go.Figure):
    """A finished figure whose dict is computed once. ``st.plotly_chart`` deep-copies a figure with
    ``to_dict()`` on every draw (about 7 ms for the Train page's three); a shared figure is never changed
    after it is built, so every session can draw the same dict."""

    def to_dict(self):
        if getattr(self, "_frozen_dict", None) is None:
            self._frozen_dict = super().to_dict()
        return self._frozen_dict


def freeze(figure: go.Figure) -> go.Figure:
    # Re-classing, not copying: go.Figure(figure) would validate every point again (as slow as the build).
    figure.__class__ = FrozenFigure
    return figure


class FigureCache:
    """Figures shared by every session of the server, built once per key and kept for the latest
    ``max_entries`` keys (least recently drawn dropped first).

    A key names the figures' content: (page, run id, event count, view). A run's events only grow, so the
    count says whether anything changed. Building is pure Python and holds the GIL the training thread
    needs: twenty visitors watching one run now cost one build per new batch of events, not twenty.
    """

    def __init__(self, max_entries: int = 32):
        self.max_entries = max_entries
        self.builds = 0  # how many times ``build`` ran: what the tests and the watchers benchmark count
        self._figures: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], tuple]) -> tuple:
        """The figures for ``key``: ``build()`` (a tuple of figures) runs only if no session built them yet."""
        with self._lock:  # held while building, so two sessions asking at once build once
            if key in self._figures:
                self._figures.move_to_end(key)
                return self._figures[key]
            figures = tuple(freeze(figure) for figure in build())
            self.builds += 1
            self._figures[key] = figures
            while len(self._figures) > self.max_entries:
                self._figures.popitem(last=False)
            return figures


def thin(xs: list, ys: list, limit: int = MAX_POINTS) -> tuple[list, list]:
    """At most about ``limit`` points of a line: beyond it, each run of consecutive points is drawn by its lowest
    and its highest (in order), so a spike still shows; the first and last points are always kept."""
    if len(xs) <= limit:
        return xs, ys
    size = math.ceil(len(xs) / (limit // 2))
    keep = {0, len(xs) - 1}
    for start in range(0, len(xs), size):
        valued = [i for i in range(start, min(start + size, len(xs))) if ys[i] is not None]
        if valued:
            keep.update((min(valued, key=ys.__getitem__), max(valued, key=ys.__getitem__)))
        else:
            keep.add(start)  # a gap stays a gap
    kept = sorted(keep)
    return [xs[i] for i in kept], [ys[i] for i in kept]


def thinned_title(x_title: str, count: int) -> str:
    """The x-axis title says when a line shows fewer points than there are steps."""
    if count <= MAX_POINTS:
        return x_title
    return f"{x_title} · {count:,} steps, each stretch drawn by its lowest and highest point"
