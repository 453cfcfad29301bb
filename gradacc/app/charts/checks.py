"""The charts of checks: the memory plan's predicted and measured peaks, and the equivalence check's errors."""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import plotly.graph_objects as go

from gradacc.app.charts.style import blank_figure, empty_figure, in_mb
from gradacc.units import MB

# Relative errors of 0 cannot sit on a log axis; they are drawn at this floor and hover shows 0.
LOG_FLOOR = 1e-12


def memory_plan_figure(predicted: Mapping | Iterable, measured: Mapping | Iterable | None = None,
                       budget_bytes: float | None = None, held_out: Mapping | Iterable | None = None,
                       title: str = "Memory plan: peak memory by micro-batch size") -> go.Figure:
    """Peak memory against micro-batch size: the plan's prediction and, where run, the measurement.

    ``predicted``, ``measured`` and ``held_out`` map micro-batch size to bytes (a dict or (size, bytes) pairs);
    ``held_out``: measured points the prediction was not fitted on, drawn apart (the check of the line).
    """
    figure = blank_figure(title, "Micro-batch size", "Peak memory (MB)")
    drawn = False
    for name, points, mode, dash, symbol in (("predicted", predicted, "lines+markers", "dash", "circle"),
                                             ("measured", measured, "markers", None, "circle"),
                                             ("measured, not fitted on", held_out, "markers", None, "diamond-open")):
        pairs = sorted(dict(points or {}).items())
        if pairs:
            drawn = True
            figure.add_trace(go.Scatter(x=[size for size, _ in pairs], y=[in_mb(b) for _, b in pairs], name=name,
                                        mode=mode, line=dict(dash=dash), marker=dict(size=9 if symbol == "circle"
                                                                                      else 14, symbol=symbol)))
    if not drawn:
        return empty_figure(title, "Micro-batch size", "Peak memory (MB)", "No memory plan yet")
    if budget_bytes:
        figure.add_hline(y=budget_bytes / MB, line_dash="dot", line_color="firebrick",
                         annotation_text=f"budget {budget_bytes / MB:,.0f} MB")
    sizes = sorted({*dict(predicted or {}), *dict(measured or {}), *dict(held_out or {})})
    figure.update_xaxes(type="log", tickvals=sizes)  # sizes are usually powers of two: evenly spaced
    figure.update_layout(hovermode="closest")
    return figure


def equivalence_figure(rows: Iterable[dict], tolerance: float | None = None) -> go.Figure:
    """Relative error of each case against the reference, one bar group per loss normalization."""
    rows = list(rows or [])
    title, x_title, y_title = "Accumulated vs. full-batch gradients: relative error", "Case", "Relative error (log scale)"
    if not rows:
        return empty_figure(title, x_title, y_title, "No equivalence check has been run")
    figure = blank_figure(title, x_title, y_title)
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
