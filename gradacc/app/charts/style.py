"""How every chart looks and is assembled: titles wrapped under the toolbar's strip, type that reads from the back
of a room, one colour and dash per run, layouts checked once and kept.

A run is ``(label, events)``: ``events`` is a list of event dicts (all kinds mixed is fine, each chart picks what it
needs). A bare list of events counts as one run.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Iterable

import numpy as np
import plotly.colors
import plotly.graph_objects as go

from gradacc.units import MB

X_TITLES = {"step": "Optimizer step", "samples_seen": "Samples seen", "tokens_seen": "Tokens seen",
            "elapsed_s": "Elapsed time (s)"}


def as_runs(runs) -> list[tuple[str, list[dict]]]:
    """Accept [(label, events), ...], or one run's events on their own."""
    if runs is None:
        return [("run", [])]
    runs = list(runs)
    if runs and isinstance(runs[0], dict):
        return [("run", runs)]
    return [(str(label), list(events or [])) for label, events in runs]


def of_kind(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e.get("event") == kind]


def in_mb(value) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value / MB




def as_points(values: list) -> np.ndarray:
    """A line's coordinates as a float array (None: NaN, a gap): plotly validates and copies a list point by point
    in Python, an array whole (measured: four 1,000-point lines build in 2-3 ms instead of 14-19 ms), and the build
    holds the GIL the training needs."""
    return np.array(values, dtype=float)




# plotly checks every property it is given, in Python, while holding the GIL the training thread needs: styling the
# three live charts took 30-40 ms of each build (make_subplots alone 11 ms), per poll period of every watched run.
# So each layout is styled and checked once, through plotly's own API, and kept (below, by title and shape); a
# build copies it, edits the text that changes, adds plain trace dicts and assembles the figure without checking it
# again. tests/app/test_charts.py has plotly check every chart this module draws.
def assemble(layout: dict, traces: Iterable[dict] = (), **axis_titles: str) -> go.Figure:
    """A figure from a checked layout (copied: a kept one is never changed), plain trace dicts and the titles of
    the axes that change with the data (``xaxis2="Optimizer step · ..."``)."""
    layout = copy.deepcopy(layout)
    for axis, text in axis_titles.items():
        layout.setdefault(axis, {}).setdefault("title", {})["text"] = text
    return go.Figure(data=list(traces), layout=layout, _validate=False)


def blank_figure(title: str, x_title: str, y_title: str, title_chars: int | None = None) -> go.Figure:
    return assemble(plain_layout(title, x_title, y_title, title_chars))


@functools.lru_cache(maxsize=64)
def plain_layout(title: str, x_title: str, y_title: str, title_chars: int | None = None) -> dict:
    return styled(go.Figure(), title, x_title, y_title, title_chars).to_dict()["layout"]


# Characters of a title per line: a chart in two fifths of a 1280-pixel page fits about this many at
# TITLE_SIZE; a longer title is wrapped, never cut.
TITLE_CHARS = 32
# ... and in three fifths of it (the first chart of a row on the Demos and Compare pages).
WIDE_TITLE_CHARS = 52
TITLE_SIZE = 20
TEXT_SIZE = 16  # ticks, axis titles and legends: readable from the back of a room
# Pixels kept free above the title for plotly's toolbar (the modebar, shown on hover: on a Streamlit page from 2 to
# about 28 px below the chart's top). A wrapped title is as wide as the toolbar's row: the two must not share it.
MODEBAR_STRIP = 36
# plotly draws a title of several lines this much (0.7 em) higher than a title of one line at the same place.
MULTILINE_LIFT = round(0.7 * TITLE_SIZE)


def wrap(text: str, limit: int = TITLE_CHARS) -> str:
    """``text`` broken into lines of at most ``limit`` characters (at spaces) joined by " <br>"."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= limit:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return " <br>".join(lines)  # the space kept: the drawn title's text still reads as one sentence


def unwrap(text: str) -> str:
    """A title as one line again (what ``wrap`` was given)."""
    return text.replace(" <br>", " ")


def styled(figure: go.Figure, title: str, x_title: str, y_title: str, title_chars: int | None = None) -> go.Figure:
    """``title_chars``: characters of the title per line (TITLE_CHARS, or WIDE_TITLE_CHARS for a wide chart)."""
    # Legend under the plot: with several runs it wraps onto lines of its own instead of over the title.
    # Large type: these charts are shown on stage and must read from the back of a room.
    title = wrap(title, title_chars or TITLE_CHARS)
    lines = title.count("<br>") + 1
    # The title hangs from the top, under the toolbar's strip (pad), whatever the chart's height.
    pad = MODEBAR_STRIP + (MULTILINE_LIFT if lines > 1 else 0)
    figure.update_layout(title=dict(text=title, font=dict(size=TITLE_SIZE), x=0, xanchor="left", y=1,
                                    yref="container", yanchor="top", pad=dict(t=pad)),
                         font=dict(size=TEXT_SIZE), hovermode="x unified",
                         margin=dict(l=70, r=20, t=MODEBAR_STRIP + 26 * lines + 12, b=50),
                         legend=dict(orientation="h", yanchor="top", y=-0.4, xanchor="left", x=0))
    if x_title:
        figure.update_layout(xaxis_title=x_title)
    if y_title:
        figure.update_layout(yaxis_title=y_title)
    return figure


# A drawn chart's legend (``fit_legend``): under the plot, one entry a line, a fixed number of pixels below it, and the
# chart as tall as plot, axis and legend need. A legend placed at a share of the plot's height came over the x axis'
# title once eight entries had shrunk the plot under it.
PLOT_PX = 270  # one panel's plot area
AXIS_PX = 86  # the x axis' tick labels and title, under the plot
LEGEND_ROW_PX = 24
TICK_LINE_PX = 20  # each further line of a tick label


def fit_legend(layout: dict, data: list[dict]) -> dict:
    """``layout`` (a figure's, as a dict) with its legend and height fitted to ``data``'s legend entries (see
    PLOT_PX); unchanged where plotly shows no legend (one trace, or showlegend off). The live charts and the
    replay pages draw every figure through it."""
    entries = [trace for trace in data if trace.get("showlegend", True) and trace.get("name")]
    if layout.get("showlegend") is False or (len(entries) < 2 and not layout.get("showlegend")):
        return layout
    panels = len({tuple(axis.get("domain") or (0, 1)) for name, axis in layout.items()
                  if name.startswith("yaxis") and isinstance(axis, dict) and "overlaying" not in axis}) or 1
    plot = PLOT_PX * panels
    # Tick labels of several lines (run names under their bars) push the axis' title, and the legend, further down.
    tick_lines = max((str(text).count("<br>") + 1 for text in (layout.get("xaxis") or {}).get("ticktext") or []),
                     default=1)
    axis = AXIS_PX + TICK_LINE_PX * (tick_lines - 1)
    margin = dict(layout.get("margin") or {})
    margin["b"] = axis + LEGEND_ROW_PX * len(entries) + 10
    return {**layout, "height": margin.get("t", 80) + plot + margin["b"], "margin": margin,
            "legend": {**(layout.get("legend") or {}), "orientation": "v", "yanchor": "top", "y": -axis / plot,
                       "xanchor": "left", "x": 0}}


def empty_figure(title: str, x_title: str, y_title: str, message: str, title_chars: int | None = None) -> go.Figure:
    """A chart with nothing to draw yet: its frame, and ``message`` where the lines will be."""
    return assemble(empty_layout(title, x_title, y_title, message, title_chars))


@functools.lru_cache(maxsize=32)
def empty_layout(title: str, x_title: str, y_title: str, message: str, title_chars: int | None = None) -> dict:
    figure = styled(go.Figure(), title, x_title, y_title, title_chars)
    figure.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                          font=dict(size=15))
    figure.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    return figure.to_dict()["layout"]


def run_color(index: int) -> str:
    """One colour per run, so a run's loss, memory and eval lines match across charts."""
    palette = plotly.colors.qualitative.Plotly
    return palette[index % len(palette)]


def line_trace(xs, ys, name: str, mode: str, xaxis: str = "x", yaxis: str = "y", **style) -> dict:
    """One line as a plain trace dict: coordinates as float arrays, on the given axes."""
    return dict(type="scatter", x=as_points(xs), y=as_points(ys), name=name, mode=mode, xaxis=xaxis, yaxis=yaxis,
                **style)


# Runs whose curves coincide (the point of accumulation) must all stay visible: the first run is drawn
# thick and solid underneath, each later one thinner, dashed and with its own markers on top.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "x", "diamond-open", "triangle-up-open", "square-open", "star-open")


def run_line_style(index: int, several: bool) -> dict:
    if not several:
        return dict(line=dict(color=run_color(index)))
    return dict(line=dict(color=run_color(index), dash=DASHES[index % len(DASHES)], width=6 if index == 0 else 2.5),
                marker=dict(symbol=MARKERS[index % len(MARKERS)], size=7 if index else 5))


def line_mode(points: list) -> str:
    """A line through one point draws nothing: show markers until there are two (the first live step)."""
    return "lines" if len(points) > 1 else "lines+markers"
