"""Plotly figures from the event stream; every chart takes one run or several (Compare page).

A run is ``(label, events)``: ``events`` is a list of event dicts (all kinds mixed is fine, each chart
picks what it needs). A bare list of events counts as one run.
"""

from __future__ import annotations

import collections
import copy
import functools
import math
import threading
from typing import Callable, Hashable, Iterable, Mapping

import numpy as np
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradacc import events as ev
from gradacc.units import MB

X_TITLES = {"step": "Optimizer step", "samples_seen": "Samples seen", "tokens_seen": "Tokens seen",
            "elapsed_s": "Elapsed time (s)"}
# Relative errors of 0 cannot sit on a log axis; they are drawn at this floor and hover shows 0.
LOG_FLOOR = 1e-12
# Most points one line draws (TensorBoard draws 1,000 a scalar too). A long run's 20,000 steps cannot show on a
# chart a thousand pixels wide, and every point costs a build, the wire and the browser on each poll.
MAX_POINTS = 1000


# --- one build for every watcher --------------------------------------------------------------

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


# --- inputs -----------------------------------------------------------------------------------

def _as_runs(runs) -> list[tuple[str, list[dict]]]:
    """Accept [(label, events), ...], or one run's events on their own."""
    if runs is None:
        return [("run", [])]
    runs = list(runs)
    if runs and isinstance(runs[0], dict):
        return [("run", runs)]
    return [(str(label), list(events or [])) for label, events in runs]


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e.get("event") == kind]


def _mb(value) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value / MB


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


def _points(values: list) -> np.ndarray:
    """A line's coordinates as a float array (None: NaN, a gap): plotly validates and copies a list point by point
    in Python, an array whole (measured: four 1,000-point lines build in 2-3 ms instead of 14-19 ms), and the build
    holds the GIL the training needs."""
    return np.array(values, dtype=float)


def _thinned_title(x_title: str, count: int) -> str:
    """The x-axis title says when a line shows fewer points than there are steps."""
    if count <= MAX_POINTS:
        return x_title
    return f"{x_title} · {count:,} steps, each stretch drawn by its lowest and highest point"


# --- layout -----------------------------------------------------------------------------------
# plotly checks every property it is given, in Python, while holding the GIL the training thread needs: styling the
# three live charts took 30-40 ms of each build (make_subplots alone 11 ms), per poll period of every watched run.
# So each layout is styled and checked once, through plotly's own API, and kept (below, by title and shape); a
# build copies it, edits the text that changes, adds plain trace dicts and assembles the figure without checking it
# again. tests/app/test_charts.py has plotly check every chart this module draws.

def _assemble(layout: dict, traces: Iterable[dict] = (), **axis_titles: str) -> go.Figure:
    """A figure from a checked layout (copied: a kept one is never changed), plain trace dicts and the titles of
    the axes that change with the data (``xaxis2="Optimizer step · ..."``)."""
    layout = copy.deepcopy(layout)
    for axis, text in axis_titles.items():
        layout.setdefault(axis, {}).setdefault("title", {})["text"] = text
    return go.Figure(data=list(traces), layout=layout, _validate=False)


def _figure(title: str, x_title: str, y_title: str) -> go.Figure:
    return _assemble(_plain_layout(title, x_title, y_title))


@functools.lru_cache(maxsize=64)
def _plain_layout(title: str, x_title: str, y_title: str) -> dict:
    return _style(go.Figure(), title, x_title, y_title).to_dict()["layout"]


# Characters of a title per line: a chart in two fifths of a 1280-pixel page fits about this many at
# TITLE_SIZE; a longer title is wrapped, never cut.
TITLE_CHARS = 32
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


def _style(figure: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    # Legend under the plot: with several runs it wraps onto lines of its own instead of over the title.
    # Large type: these charts are shown on stage and must read from the back of a room.
    title = wrap(title)
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


def _empty(title: str, x_title: str, y_title: str, message: str) -> go.Figure:
    """A chart with nothing to draw yet: its frame, and ``message`` where the lines will be."""
    return _assemble(_empty_layout(title, x_title, y_title, message))


@functools.lru_cache(maxsize=32)
def _empty_layout(title: str, x_title: str, y_title: str, message: str) -> dict:
    figure = _style(go.Figure(), title, x_title, y_title)
    figure.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                          font=dict(size=15))
    figure.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    return figure.to_dict()["layout"]


def _color(index: int) -> str:
    """One colour per run, so a run's loss, memory and eval lines match across charts."""
    palette = plotly.colors.qualitative.Plotly
    return palette[index % len(palette)]


def _line(xs, ys, name: str, mode: str, xaxis: str = "x", yaxis: str = "y", **style) -> dict:
    """One line as a plain trace dict: coordinates as float arrays, on the given axes."""
    return dict(type="scatter", x=_points(xs), y=_points(ys), name=name, mode=mode, xaxis=xaxis, yaxis=yaxis,
                **style)


# --- training curves --------------------------------------------------------------------------

def _line_mode(points: list) -> str:
    """A line through one point draws nothing: show markers until there are two (the first live step)."""
    return "lines" if len(points) > 1 else "lines+markers"


# Runs whose curves coincide (the point of accumulation) must all stay visible: the first run is drawn
# thick and solid underneath, each later one thinner, dashed and with its own markers on top.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "x", "diamond-open", "triangle-up-open", "square-open", "star-open")


def _run_line(index: int, several: bool) -> dict:
    if not several:
        return dict(line=dict(color=_color(index)))
    return dict(line=dict(color=_color(index), dash=DASHES[index % len(DASHES)], width=6 if index == 0 else 2.5),
                marker=dict(symbol=MARKERS[index % len(MARKERS)], size=7 if index else 5))


def loss_figure(runs, x: str = "step", title: str = "Training loss") -> go.Figure:
    """Training loss per optimizer step (or against samples seen), one line per run; ``title`` can state what
    the curves show ("Loss curves identical ...")."""
    x_title = X_TITLES.get(x, x)
    runs = _as_runs(runs)
    traces, most = [], 0
    for index, (label, rows) in enumerate(runs):
        steps = [r for r in _of(rows, ev.STEP) if r.get("loss") is not None]
        if steps:
            most = max(most, len(steps))
            mode = "lines+markers" if len(runs) > 1 and index else _line_mode(steps)
            xs, ys = thin([r.get(x) for r in steps], [r["loss"] for r in steps])
            traces.append(_line(xs, ys, label, mode, **_run_line(index, len(runs) > 1)))
    if not most:
        return _empty(title, x_title, "Loss", "No training steps yet")
    return _assemble(_plain_layout(title, x_title, "Loss"), traces, xaxis=_thinned_title(x_title, most))


def eval_figure(runs, title: str = "Evaluation after each epoch") -> go.Figure:
    """Eval F1 (solid) and accuracy (dotted) after each epoch, per run; a causal LM's run draws its
    next-token accuracy (dash) on the same 0–1 axis and its perplexity (dash-dot) on a log axis at the right."""
    all_runs = _as_runs(runs)
    language_models = any(r.get("eval_perplexity") is not None for _, rows in all_runs for r in _of(rows, ev.EVAL))
    traces = []
    for index, (label, rows) in enumerate(all_runs):
        evals = _of(rows, ev.EVAL)
        epochs = [r.get("epoch") for r in evals]
        for metric, name, dash in EVAL_SCORES:
            values = [r.get(metric) for r in evals]
            if all(v is None for v in values):
                continue  # a metric this run's task does not have (or no evaluation yet)
            traces.append(_line(epochs, values, f"{label} · {name}", "lines+markers",
                                yaxis="y2" if metric == "eval_perplexity" else "y",
                                line=dict(color=_color(index), dash=dash)))
    if not traces:
        return _empty(title, "Epoch", "Score (0–1)", "No evaluation yet: it runs at the end of each epoch")
    return _assemble(_eval_layout(title, language_models), traces)


@functools.lru_cache(maxsize=16)
def _eval_layout(title: str, language_models: bool) -> dict:
    """Scores on 0–1; a causal LM's perplexity on a log axis at the right (y2)."""
    if language_models:
        figure = _style(make_subplots(specs=[[{"secondary_y": True}]]), title, "Epoch", "")
        # Whole numbers, a few of them: a log axis over less than a decade otherwise labels single digits.
        figure.update_yaxes(title_text="Perplexity (log)", type="log", secondary_y=True, tickformat=".3~g", nticks=5,
                            title_standoff=8)
        figure.update_layout(margin_r=90)  # room for the right axis' ticks beside its title
        figure.update_yaxes(title_text="Score (0–1)", range=[0, 1.02], secondary_y=False)
    else:
        figure = _style(go.Figure(), title, "Epoch", "Score (0–1)")
        figure.update_yaxes(range=[0, 1.02])
    figure.update_xaxes(dtick=1)
    return figure.to_dict()["layout"]


# (eval field, legend name, line dash): classification's scores, then a causal LM's.
EVAL_SCORES = (("eval_f1", "F1", "solid"), ("eval_accuracy", "accuracy", "dot"),
               ("eval_next_token_accuracy", "next-token accuracy", "dash"),
               ("eval_perplexity", "perplexity", "dashdot"),
               ("eval_mrr_at_10", "MRR@10", "longdash"), ("eval_recall_at_1", "recall@1", "longdashdot"))


# --- memory -----------------------------------------------------------------------------------

# (step field, legend name, line dash, panel row): row 1 is the whole process, row 2 what one
# optimizer step holds, where micro-batch size and accumulation show.
MEMORY_SERIES = (
    ("rss_bytes", "process RSS", "solid", 1),
    ("cuda_peak_bytes", "CUDA peak", "dash", 1),
    ("activation_bytes", "activations / micro-batch", "dot", 2),
)
MEMORY_PANELS = ("Process memory", "Activations per micro-batch vs. parameters + gradients + optimizer state")
# The axes of each panel of memory_figure's layout (make_subplots names them so).
PANEL_AXES = {1: dict(xaxis="x", yaxis="y"), 2: dict(xaxis="x2", yaxis="y2")}


def memory_figure(runs, x: str = "step", title: str = "Memory") -> go.Figure:
    """Memory over the run, in two panels sharing the x axis: RSS and CUDA peak (GPU only) on top;
    activations per micro-batch and the static parameters + gradients + optimizer state (a flat
    dash-dot line from run_started) below, since they are far smaller than the process."""
    x_title = X_TITLES.get(x, x)
    traces, most = [], 0
    for index, (label, rows) in enumerate(_as_runs(runs)):
        steps = _of(rows, ev.STEP)
        xs = [r.get(x) for r in steps]
        most = max(most, len(steps))
        for field, name, dash, row in MEMORY_SERIES:
            ys = [_mb(r.get(field)) for r in steps]
            if any(y is not None for y in ys):  # CUDA peak is None on CPU: no empty line in the legend
                shown_x, shown_y = thin(xs, ys)
                traces.append(_line(shown_x, shown_y, f"{label} · {name}", _line_mode(steps), **PANEL_AXES[row],
                                    line=dict(color=_color(index), dash=dash)))
        static = _static_total(rows)
        if static is not None and xs:
            traces.append(_line([xs[0], xs[-1]], [static / MB] * 2, f"{label} · params + grads + optimizer",
                                "lines", **PANEL_AXES[2], line=dict(color=_color(index), dash="dashdot")))
    if not traces:
        return _empty("Memory", x_title, "Memory (MB)", "No memory measurements yet")
    return _assemble(_memory_layout(title, x_title), traces, xaxis2=_thinned_title(x_title, most))


@functools.lru_cache(maxsize=16)
def _memory_layout(title: str, x_title: str) -> dict:
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=MEMORY_PANELS)
    _style(figure, title, "", "")
    figure.update_xaxes(title_text=x_title, row=2, col=1)
    for row in (1, 2):
        figure.update_yaxes(title_text="MB", rangemode="tozero", row=row, col=1)  # from 0: honest sizes
    figure.update_layout(legend_y=-0.2)  # two panels: the paper is taller than one plot, the legend nearer
    return figure.to_dict()["layout"]


# Stacked, bottom to top: what a step holds whatever m and k are, then what one micro-batch adds.
BREAKDOWN = (("parameters", "parameters", "#9aa5b1"), ("gradients", "gradients", "#c0c7cf"),
             ("optimizer_state", "optimizer state", "#dde1e6"),
             ("activation_bytes", "peak activations of a micro-batch", "#d62728"))


# A run refused out of memory before step 1 knows its static bytes as one figure, not split.
STATIC_WHOLE = ("static_bytes", "parameters, gradients and optimizer state", "#bfc5cc")


def memory_breakdown_figure(runs, title: str = "Memory per optimizer step: static + activations") -> go.Figure:
    """One stacked bar per run: parameters, gradients and optimizer state (the same for any m and k), and the
    peak activations of one micro-batch on top (what accumulation shrinks). Process RSS, mostly the Python
    and torch runtime, is in ``memory_figure``."""
    figure = _figure(title, "", "Memory (MB)")
    parts = (STATIC_WHOLE, *BREAKDOWN)
    labels, heights, budgets = [], {part: [] for part, _, _ in parts}, set()
    for label, rows in _as_runs(runs):
        started = _of(rows, ev.RUN_STARTED)
        static = (started[0].get("static_memory") or {}) if started else {}
        activations = [r["activation_bytes"] for r in _of(rows, ev.STEP) if r.get("activation_bytes") is not None]
        # A run refused out of memory never stepped: its bar is the need it measured, above the budget line.
        refused = next((e.get("out_of_memory") for e in _of(rows, ev.RUN_ENDED) if e.get("out_of_memory")), None)
        if refused and not activations:
            activations = [refused["activation_bytes"] + (refused.get("device_bytes") or 0.0)]
            label = f"{label} (out of memory)"
            if not any(static.get(part) for part, _, _ in BREAKDOWN):  # stopped before it split its static bytes
                static = {"static_bytes": refused.get("static_bytes")}
        budget = (started[0].get("config") or {}).get("memory_budget_mb") if started else None
        if budget:
            budgets.add(float(budget))
        elif refused and refused.get("cap_bytes"):  # the cap that refused it, where its config is not at hand
            budgets.add(round(refused["cap_bytes"] / MB, 1))
        if not static and not activations:
            continue
        labels.append(label)
        for part, _, _ in parts:
            value = max(activations) if part == "activation_bytes" and activations else static.get(part)
            heights[part].append(_mb(value) or 0.0)
    if not labels:
        return _empty(title, "", "Memory (MB)", "No memory measurements yet")
    for part, name, color in parts:
        if part == STATIC_WHOLE[0] and not any(heights[part]):
            continue
        figure.add_trace(go.Bar(x=labels, y=heights[part], name=name, marker_color=color,
                                text=[f"{v:.1f} MB" for v in heights[part]] if part == "activation_bytes" else None,
                                textposition="inside", hovertemplate="%{x}<br>%{y:.2f} MB<extra>" + name + "</extra>"))
    for budget in sorted(budgets):  # the wall: a run's memory budget, as a device's memory would be
        figure.add_hline(y=budget, line=dict(color="#000000", dash="dash", width=3),
                         annotation=dict(text=f"budget {budget:g} MB", font=dict(size=TEXT_SIZE)),
                         annotation_position="top right")
    # Run names under their bars, level and wrapped (rotated text does not read from a distance).
    figure.update_xaxes(tickangle=0, tickvals=labels, ticktext=[wrap(label, 10) for label in labels])
    figure.update_layout(barmode="stack", hovermode="closest")
    return figure


def _static_total(rows: list[dict]) -> float | None:
    started = _of(rows, ev.RUN_STARTED)
    static = (started[0].get("static_memory") or {}) if started else {}
    return static.get("total")


def memory_plan_figure(predicted: Mapping | Iterable, measured: Mapping | Iterable | None = None,
                       budget_bytes: float | None = None, held_out: Mapping | Iterable | None = None,
                       title: str = "Memory plan: peak memory by micro-batch size") -> go.Figure:
    """Peak memory against micro-batch size: the plan's prediction and, where run, the measurement.

    ``predicted``, ``measured`` and ``held_out`` map micro-batch size to bytes (a dict or (size, bytes) pairs);
    ``held_out``: measured points the prediction was not fitted on, drawn apart (the check of the line).
    """
    figure = _figure(title, "Micro-batch size", "Peak memory (MB)")
    drawn = False
    for name, points, mode, dash, symbol in (("predicted", predicted, "lines+markers", "dash", "circle"),
                                             ("measured", measured, "markers", None, "circle"),
                                             ("measured, not fitted on", held_out, "markers", None, "diamond-open")):
        pairs = sorted(dict(points or {}).items())
        if pairs:
            drawn = True
            figure.add_trace(go.Scatter(x=[size for size, _ in pairs], y=[_mb(b) for _, b in pairs], name=name,
                                        mode=mode, line=dict(dash=dash), marker=dict(size=9 if symbol == "circle"
                                                                                      else 14, symbol=symbol)))
    if not drawn:
        return _empty(title, "Micro-batch size", "Peak memory (MB)", "No memory plan yet")
    if budget_bytes:
        figure.add_hline(y=budget_bytes / MB, line_dash="dot", line_color="firebrick",
                         annotation_text=f"budget {budget_bytes / MB:,.0f} MB")
    sizes = sorted({*dict(predicted or {}), *dict(measured or {}), *dict(held_out or {})})
    figure.update_xaxes(type="log", tickvals=sizes)  # sizes are usually powers of two: evenly spaced
    figure.update_layout(hovermode="closest")
    return figure


# --- equivalence ------------------------------------------------------------------------------

def equivalence_figure(rows: Iterable[dict], tolerance: float | None = None) -> go.Figure:
    """Relative error of each case against the reference, one bar group per loss normalization."""
    rows = list(rows or [])
    title, x_title, y_title = "Accumulated vs. full-batch gradients: relative error", "Case", "Relative error (log scale)"
    if not rows:
        return _empty(title, x_title, y_title, "No equivalence check has been run")
    figure = _figure(title, x_title, y_title)
    normalizations = list(dict.fromkeys(r["normalization"] for r in rows))
    for normalization in normalizations:
        group = [r for r in rows if r["normalization"] == normalization]
        errors = [r["rel_error"] for r in group]
        figure.add_trace(go.Bar(x=[r["case"] for r in group], y=[_on_log_axis(e) for e in errors],
                                name=normalization, customdata=errors,
                                hovertemplate="%{x}<br>relative error %{customdata:.3g}<extra>%{fullData.name}</extra>"))
    figure.update_yaxes(type="log", exponentformat="power")
    figure.update_layout(barmode="group", hovermode="closest")
    if tolerance:
        figure.add_hline(y=tolerance, line_dash="dot", line_color="firebrick",
                         annotation_text=f"tolerance {tolerance:g}")
    return figure


def _on_log_axis(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None
    return max(value, LOG_FLOOR)
