"""The charts of runs, from their events: training loss, evaluation after each epoch, memory over the run and
memory per optimizer step; one run or several (Compare, the demos)."""

from __future__ import annotations

import functools
import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradacc import events as ev
from gradacc.app.charts.cache import thin, thinned_title
from gradacc.app.charts.style import (TEXT_SIZE, X_TITLES, as_runs, assemble, blank_figure, empty_figure, in_mb,
                                      line_mode, line_trace, of_kind, plain_layout, run_color, run_line_style, styled)
from gradacc.units import MB


def loss_figure(runs, x: str = "step", title: str = "Training loss", title_chars: int | None = None) -> go.Figure:
    """Training loss per optimizer step (or against samples seen), one line per run; ``title`` can state what
    the curves show ("Loss curves identical ..."); ``title_chars``: its line length (style.WIDE_TITLE_CHARS in a
    wide slot)."""
    x_title = X_TITLES.get(x, x)
    runs = as_runs(runs)
    traces, most = [], 0
    for index, (label, rows) in enumerate(runs):
        steps = [r for r in of_kind(rows, ev.STEP) if r.get("loss") is not None]
        if steps:
            most = max(most, len(steps))
            mode = "lines+markers" if len(runs) > 1 and index else line_mode(steps)
            xs, ys = thin([r.get(x) for r in steps], [r["loss"] for r in steps])
            traces.append(line_trace(xs, ys, label, mode, **run_line_style(index, len(runs) > 1)))
    if not most:
        return empty_figure(title, x_title, "Loss", "No training steps yet", title_chars)
    return assemble(plain_layout(title, x_title, "Loss", title_chars), traces, xaxis=thinned_title(x_title, most))


def eval_figure(runs, title: str = "Evaluation after each epoch") -> go.Figure:
    """Eval F1 (solid) and accuracy (dotted) after each epoch, per run; a causal LM's run draws its
    next-token accuracy (dash) on the same 0–1 axis and its perplexity (dash-dot) on a log axis at the right.
    Runs of one epoch each have one evaluation: bars with their values written on them, not lone dots."""
    all_runs = as_runs(runs)
    language_models = any(r.get("eval_perplexity") is not None for _, rows in all_runs for r in of_kind(rows, ev.EVAL))
    if _one_epoch(all_runs):
        return _eval_bars(all_runs, title, language_models)
    traces = []
    for index, (label, rows) in enumerate(all_runs):
        evals = of_kind(rows, ev.EVAL)
        epochs = [r.get("epoch") for r in evals]
        for metric, name, dash in EVAL_SCORES:
            values = [r.get(metric) for r in evals]
            if all(v is None for v in values):
                continue  # a metric this run's task does not have (or no evaluation yet)
            traces.append(line_trace(epochs, values, f"{label} · {name}", "lines+markers",
                                yaxis="y2" if metric == "eval_perplexity" else "y",
                                line=dict(color=run_color(index), dash=dash)))
    if not traces:
        return empty_figure(title, "Epoch", "Score (0–1)", "No evaluation yet: it runs at the end of each epoch")
    return assemble(_eval_layout(title, language_models), traces)


def _one_epoch(runs: list[tuple[str, list[dict]]]) -> bool:
    """Every run evaluated once, and planned for one epoch where its start says so (a longer run's first
    evaluation stays a line that grows)."""
    evaluated = False
    for _, rows in runs:
        evals = of_kind(rows, ev.EVAL)
        started = next((r for r in rows if r.get("event") == ev.RUN_STARTED), None)
        planned = ((started or {}).get("config") or {}).get("epochs")
        if len(evals) > 1 or (planned is not None and planned != 1):
            return False
        evaluated = evaluated or bool(evals)
    return evaluated


def _eval_bars(runs: list[tuple[str, list[dict]]], title: str, language_models: bool) -> go.Figure:
    """One bar group per metric, a bar per run in its colour, each value written on its bar."""
    traces = []
    for index, (label, rows) in enumerate(runs):
        evaluation = next(iter(of_kind(rows, ev.EVAL)), {})
        for axis in ("y", "y2"):
            shown = [(name, evaluation.get(metric)) for metric, name, _ in EVAL_SCORES
                     if evaluation.get(metric) is not None and (metric == "eval_perplexity") == (axis == "y2")]
            if shown:
                traces.append(dict(type="bar", x=[name for name, _ in shown], y=[value for _, value in shown],
                                   name=label, yaxis=axis, offsetgroup=str(index), legendgroup=str(index),
                                   showlegend=axis == "y" or not language_models, marker=dict(color=run_color(index)),
                                   texttemplate="%{y:.3~g}", textposition="outside", cliponaxis=False))
    return assemble(_bar_layout(title, language_models), traces)


@functools.lru_cache(maxsize=8)
def _bar_layout(title: str, language_models: bool) -> dict:
    layout = dict(_eval_layout(title, language_models))
    axis = {key: value for key, value in layout.get("xaxis", {}).items() if key != "dtick"}
    layout["xaxis"] = {**axis, "title": {"text": "After the one epoch"}, "type": "category"}
    return {**layout, "barmode": "group", "hovermode": "closest", "showlegend": True}


@functools.lru_cache(maxsize=16)
def _eval_layout(title: str, language_models: bool) -> dict:
    """Scores on 0–1; a causal LM's perplexity on a log axis at the right (y2)."""
    if language_models:
        figure = styled(make_subplots(specs=[[{"secondary_y": True}]]), title, "Epoch", "")
        # Whole numbers, a few of them: a log axis over less than a decade otherwise labels single digits.
        figure.update_yaxes(title_text="Perplexity (log)", type="log", secondary_y=True, tickformat=".3~g", nticks=5,
                            title_standoff=8)
        figure.update_layout(margin_r=90)  # room for the right axis' ticks beside its title
        figure.update_yaxes(title_text="Score (0–1)", range=[0, 1.02], secondary_y=False)
    else:
        figure = styled(go.Figure(), title, "Epoch", "Score (0–1)")
        figure.update_yaxes(range=[0, 1.02])
    figure.update_xaxes(dtick=1)
    return figure.to_dict()["layout"]


# (eval field, legend name, line dash): classification's scores, then a causal LM's.
EVAL_SCORES = (("eval_f1", "F1", "solid"), ("eval_accuracy", "accuracy", "dot"),
               ("eval_next_token_accuracy", "next-token accuracy", "dash"),
               ("eval_perplexity", "perplexity", "dashdot"),
               ("eval_mrr_at_10", "MRR@10", "longdash"), ("eval_recall_at_1", "recall@1", "longdashdot"))


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
    for index, (label, rows) in enumerate(as_runs(runs)):
        steps = of_kind(rows, ev.STEP)
        xs = [r.get(x) for r in steps]
        most = max(most, len(steps))
        for field, name, dash, row in MEMORY_SERIES:
            ys = [in_mb(r.get(field)) for r in steps]
            if any(y is not None for y in ys):  # CUDA peak is None on CPU: no empty line in the legend
                shown_x, shown_y = thin(xs, ys)
                traces.append(line_trace(shown_x, shown_y, f"{label} · {name}", line_mode(steps), **PANEL_AXES[row],
                                    line=dict(color=run_color(index), dash=dash)))
        static = _static_total(rows)
        if static is not None and xs:
            traces.append(line_trace([xs[0], xs[-1]], [static / MB] * 2, f"{label} · params + grads + optimizer",
                                "lines", **PANEL_AXES[2], line=dict(color=run_color(index), dash="dashdot")))
    if not traces:
        return empty_figure("Memory", x_title, "Memory (MB)", "No memory measurements yet")
    return assemble(_memory_layout(title, x_title), traces, xaxis2=thinned_title(x_title, most))


@functools.lru_cache(maxsize=16)
def _memory_layout(title: str, x_title: str) -> dict:
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=MEMORY_PANELS)
    styled(figure, title, "", "")
    figure.update_xaxes(title_text=x_title, row=2, col=1)
    for row in (1, 2):
        figure.update_yaxes(title_text="MB", rangemode="tozero", row=row, col=1)  # from 0: honest sizes
    return figure.to_dict()["layout"]


# Stacked, bottom to top: what a step holds whatever m and k are, then what one micro-batch adds.
BREAKDOWN = (("parameters", "parameters", "#9aa5b1"), ("gradients", "gradients", "#c0c7cf"),
             ("optimizer_state", "optimizer state", "#dde1e6"),
             ("activation_bytes", "peak activations of a micro-batch", "#d62728"))


# A run refused out of memory before step 1 knows its static bytes as one figure, not split.
STATIC_WHOLE = ("static_bytes", "parameters, gradients and optimizer state", "#bfc5cc")


def memory_breakdown_figure(runs, title: str = "Memory per optimizer step: static + activations") -> go.Figure:
    """One stacked bar per run, lying down with the run's name at its left (names stacked one above the other never
    cover each other, however many runs): parameters, gradients and optimizer state (the same for any m and k), and
    the peak activations of one micro-batch after them (what accumulation shrinks). Process RSS, mostly the Python
    and torch runtime, is in ``memory_figure``."""
    figure = blank_figure(title, "Memory (MB)", "")
    parts = (STATIC_WHOLE, *BREAKDOWN)
    labels, heights, budgets = [], {part: [] for part, _, _ in parts}, set()
    for label, rows in as_runs(runs):
        started = of_kind(rows, ev.RUN_STARTED)
        static = (started[0].get("static_memory") or {}) if started else {}
        activations = [r["activation_bytes"] for r in of_kind(rows, ev.STEP) if r.get("activation_bytes") is not None]
        # A run refused out of memory never stepped: its bar is the need it measured, above the budget line.
        refused = next((e.get("out_of_memory") for e in of_kind(rows, ev.RUN_ENDED) if e.get("out_of_memory")), None)
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
            heights[part].append(in_mb(value) or 0.0)
    if not labels:
        return empty_figure(title, "Memory (MB)", "", "No memory measurements yet")
    for part, name, color in parts:
        if part == STATIC_WHOLE[0] and not any(heights[part]):
            continue
        figure.add_trace(go.Bar(y=labels, x=heights[part], name=name, marker_color=color, orientation="h",
                                # Level, after the bar's end: a thin segment would turn its text on its side.
                                text=[f"{v:.3g} MB" for v in heights[part]] if part == "activation_bytes" else None,
                                textposition="outside", textangle=0, cliponaxis=False,
                                hovertemplate="%{y}<br>%{x:.2f} MB<extra>" + name + "</extra>"))
    for budget in sorted(budgets):  # the wall: a run's memory budget, as a device's memory would be
        figure.add_vline(x=budget, line=dict(color="#000000", dash="dash", width=3),
                         annotation=dict(text=f"budget {budget:g} MB", font=dict(size=TEXT_SIZE)),
                         annotation_position="top")
    # Run names at the left of their bars, level, wrapped, the first run on top (rotated text does not read from a
    # distance).
    figure.update_yaxes(tickvals=labels, ticktext=[wrap_label(label, BAR_LABEL_CHARS) for label in labels],
                        categoryorder="array", categoryarray=labels[::-1], automargin=True)  # the first on top
    # Room after the longest bar (or the budget line) for the activations' figure written after it.
    longest = max([sum(heights[part][i] for part, _, _ in parts) for i in range(len(labels))] + sorted(budgets))
    figure.update_xaxes(range=[0, longest * 1.3])
    figure.update_layout(barmode="stack", hovermode="closest")
    return figure


# Characters of a run's name per line, at the left of its bar.
BAR_LABEL_CHARS = 16


def wrap_label(label: str, chars: int) -> str:
    """``label`` in lines of at most ``chars`` characters (one longer word alone excepted), broken at spaces and
    after hyphens ("broken: zero-grad-" / "per-micro-batch"), joined by " <br>" as ``wrap`` joins them."""
    lines = [""]
    for piece in re.findall(r"[^ -]+-?|-| ", label):
        if piece == " ":
            lines[-1] += " " if lines[-1] else ""
            continue
        if lines[-1].strip() and len(lines[-1]) + len(piece) > chars:
            lines.append("")
        lines[-1] += piece
    return " <br>".join(line.strip() for line in lines)


def _static_total(rows: list[dict]) -> float | None:
    started = of_kind(rows, ev.RUN_STARTED)
    static = (started[0].get("static_memory") or {}) if started else {}
    return static.get("total")
