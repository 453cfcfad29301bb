"""The figures that show a demo's claim where the loss curves cannot (``Scenario.chart``): the gradient each step
applied against its window's own (naive ÷k's short windows), and each run's loss against a reference run's at
the same samples seen (a drift of a few % on a loss falling from 7 to 2 is invisible on the loss axis)."""

from __future__ import annotations

import plotly.graph_objects as go

from gradacc import events as ev
from gradacc.analysis import window_scale
from gradacc.app.charts.cache import thin, thinned_title
from gradacc.app.charts.style import (WIDE_TITLE_CHARS, X_TITLES, as_runs, assemble, empty_figure, line_mode,
                                      line_trace, of_kind, plain_layout, run_line_style)

SCALE_AXIS = "× its window's gradient"
DIFFERENCE_AXIS = "Loss difference (%)"


def gradient_scale_figure(runs, title: str | None = None, title_chars: int = WIDE_TITLE_CHARS) -> go.Figure:
    """Per run, each optimizer step's gradient against the gradient of its window's mean loss (1× = what the full
    batch of those examples gives; ``analysis.window_scale``), against samples seen. ``title``: default, what the
    runs did ("naive ÷k: 6 of 732 steps at 0.25× their gradient")."""
    runs = as_runs(runs)
    x_title = X_TITLES["samples_seen"]
    traces, claims, most, highest = [], [], 0, 1.0
    for index, (label, rows) in enumerate(runs):
        scales = window_scale.step_scales(rows)
        if not scales:
            continue
        most = max(most, len(scales))
        highest = max(highest, *(s[2] for s in scales))
        xs, ys = thin([s[0] for s in scales], [s[1] for s in scales])
        traces.append(line_trace(xs, ys, label, "lines+markers" if index and len(runs) > 1 else line_mode(scales),
                                 **run_line_style(index, len(runs) > 1)))
        said = window_scale.claim(rows)
        if said:
            claims.append(f"{label}: {said}")
    title = title or ("; ".join(claims) if claims else "Every step applied its window's gradient whole (1×)")
    if not traces:
        return empty_figure(title, x_title, SCALE_AXIS, "No training steps yet", title_chars)
    figure = assemble(plain_layout(title, x_title, SCALE_AXIS, title_chars), traces,
                      xaxis=thinned_title(x_title, most))
    figure.update_yaxes(range=[0, highest * 1.1], rangemode="tozero")
    return figure


def loss_difference_figure(runs, pairs, title: str | None = None, title_chars: int = WIDE_TITLE_CHARS) -> go.Figure:
    """For each (a, b) in ``pairs`` (indices into ``runs``), B's loss against A's at the same samples seen, in % of
    A's: 0 is the same loss. B's colour and dash are its own in every chart; the legend names B, and its reference
    too when the pairs do not share one."""
    runs = as_runs(runs)
    x_title = X_TITLES["samples_seen"]
    references = {a for a, _ in pairs}
    one_reference = len(references) == 1
    if title is None:
        title = (f"Loss against {runs[next(iter(references))][0]}'s, in %" if one_reference
                 else "Each run's loss against its reference's, in %")
    traces, most = [], 0
    for a, b in pairs:
        curve_a = _curve(runs[a][1])
        points = [(x, loss) for x, loss in _curve(runs[b][1]).items() if curve_a.get(x)]
        if not points:
            continue
        most = max(most, len(points))
        name = runs[b][0] if one_reference else f"{runs[b][0]} against {runs[a][0]}"
        xs, ys = thin([x for x, _ in points], [100 * (loss - curve_a[x]) / curve_a[x] for x, loss in points])
        traces.append(line_trace(xs, ys, name, line_mode(points), **run_line_style(b, True)))
    if not traces:
        return empty_figure(title, x_title, DIFFERENCE_AXIS, "No steps of both runs yet", title_chars)
    figure = assemble(plain_layout(title, x_title, DIFFERENCE_AXIS, title_chars), traces,
                      xaxis=thinned_title(x_title, most))
    figure.add_hline(y=0, line=dict(color="#888888", width=1))
    return figure


def _curve(rows: list[dict]) -> dict:
    return {e["samples_seen"]: e["loss"] for e in of_kind(rows, ev.STEP) if e.get("loss") is not None}

