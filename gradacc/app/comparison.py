"""Two or more runs side by side: the headline in words, charts whose titles state it, the table.

Shared by the Compare page and the Demos page, so a demo proves its point with the same view a visitor
gets when comparing their own runs; the replay page (``web_page``) builds the same figures, lines and table from
recorded runs with the functions below that take no Streamlit.
"""

from __future__ import annotations

import streamlit as st

from gradacc import events as ev
from gradacc.analysis import compare, divergence, run_names
from gradacc.analysis.headline import headline as two_run_headline
from gradacc.app import charts, server
from gradacc.app.live_chart import live_chart

# The view's charts, row by row: (name, width share). With a story chart (a demo's claim) it comes first, beside the
# loss curves, and the memory bars move down beside the evaluation.
ROWS = ((("loss", 3), ("memory", 2)), (("eval", 1), ("process", 1)))
STORY_ROWS = ((("story", 3), ("loss", 2)), (("eval", 1), ("memory", 1)), (("process", 1),))
# What the process-memory chart is, said where it is folded away (the app) or titled (the replay).
PROCESS_NOTE = "Process memory (RSS): mostly the Python and torch runtime, the same for every run"
# A cell nothing was measured for: a dash, not "None".
MISSING = "—"


def names(runs) -> dict[str, str]:
    """{run id: what differs between these runs}, e.g. 'm=8, k=4, naive' (see run_names.differing_labels)."""
    return run_names.differing_labels({run.run_id: run.config for run in runs})


def headline(runs, pairs: list[tuple[int, int]] | None = None) -> dict | None:
    """The headline of the pair ``pairs[0]`` (default: the first two runs), once both have ended (a live run's
    numbers still move). ``further``: [(A's run id, B's run id, B's loss claim against A)] for the other pairs that
    have ended, ``pairs[1:]``; by default each later run that ended on the first run's model and data, against the
    first (a third run is often the control: exact beside naive, both against the full batch)."""
    a, b = pairs[0] if pairs else (0, 1)
    if len(runs) <= max(a, b) or runs[a].is_live or runs[b].is_live:
        return None
    # The page names each run by what differs (names()): the headline need not say it again.
    figures = two_run_headline(runs[a].events, runs[b].events, name_differences=False)
    if pairs:
        further = [(x, y) for x, y in pairs[1:] if max(x, y) < len(runs)]
    else:
        further = [(0, index) for index, run in enumerate(runs) if index > 1 and all(
            run.config.get(name) == runs[0].config.get(name) for name in (*run_names.DATA_FIELDS, "model"))]
    figures["further"] = [
        (runs[x].run_id, runs[y].run_id,
         two_run_headline(runs[x].events, runs[y].events, name_differences=False)["loss_claim"])
        for x, y in further if not runs[x].is_live and not runs[y].is_live
        and all(any(e.get("event") == ev.STEP for e in runs[i].events) for i in (x, y))]
    figures["pair"] = [runs[a].run_id, runs[b].run_id]
    return figures


def against_line(figures: dict, labels: dict[str, str]) -> str:
    """'**B** against **A** · **C** against it: loss curves identical (...)' (Markdown): which run the headline
    describes against which, then each further pair's loss claim."""
    a, b = figures["pair"]
    line = f"**{labels[b]}** against **{labels[a]}**"
    for reference, run_id, claim in figures.get("further") or []:
        against = "it" if reference == a else f"**{labels[reference]}**"
        line += f" · **{labels[run_id]}** against {against}: {claim[:1].lower()}{claim[1:]}"
    return line


# The box each verdict is shown in: green only for the same curves; a difference whose cause is not accumulation
# informs; one measured where only accumulation differs warns; a run without a curve is an error.
VERDICT_BOXES = {divergence.SAME: "success", divergence.EXPLAINED: "info", divergence.DIFFERS: "warning",
                 divergence.FAILED: "error"}


def headline_box(figures: dict, runs) -> str:
    """'success', 'info', 'warning' or 'error', as the headline's verdict means (VERDICT_BOXES); a headline whose
    runs warned or did not complete is neither green nor blue."""
    by_id = {run.run_id: run for run in runs}
    pair = [by_id[run_id] for run_id in figures["pair"]]
    box = VERDICT_BOXES[figures["verdict"]]
    warned = any((run.ended or {}).get("warnings") for run in pair)
    if box in ("success", "info") and (warned or any(run.status != ev.COMPLETED for run in pair)):
        return "warning"
    return box


def show_headline(figures: dict | None, runs, labels: dict[str, str]) -> None:
    if figures is None:
        return
    box = {"success": st.success, "info": st.info, "warning": st.warning,
           "error": st.error}[headline_box(figures, runs)]
    with st.container(key="headline"):
        box(f"### {figures['headline']}\n{against_line(figures, labels)}", icon="📣")


def warning_lines(runs, labels: dict[str, str]) -> list[str]:
    return [f"⚠️ {labels[run.run_id]}: {warning}" for run in runs for warning in (run.ended or {}).get("warnings") or []]


def build_figures(curves: list[tuple[str, list[dict]]], figures: dict | None, x: str = "samples_seen",
                  story: str | None = None, pairs: list[tuple[int, int]] | None = None) -> dict:
    """{chart name: figure} for ``ROWS`` (or ``STORY_ROWS`` with a ``story`` chart, one of
    ``demos.STORY_CHARTS``, a loss difference drawn for ``pairs``): the same figures on a page and in its replay. ``curves``: [(name, events)] per run."""
    loss_title = figures["loss_title"] if figures else "Training loss against samples seen"
    memory_title = (f"Memory per step: {figures['memory_claim']}" if figures and figures["memory_claim"]
                    else "Memory per step: static + peak activations")
    built = {"loss": charts.loss_figure(curves, x=x, title=loss_title,
                                        title_chars=None if story else charts.WIDE_TITLE_CHARS),
             "eval": charts.eval_figure(curves),
             "memory": charts.memory_breakdown_figure(curves, title=memory_title),
             "process": charts.memory_figure(curves, x=x, title="Process memory (RSS) over the run")}
    if story == "loss-difference":
        built["story"] = charts.loss_difference_figure(curves, pairs or [(0, 1)])
    elif story == "gradient-scale":
        built["story"] = charts.gradient_scale_figure(curves)
    elif story == "sharding":
        built["story"] = charts.sharding_figure(curves)
    return built


def table_rows(runs, labels: dict[str, str]) -> tuple[list[dict], list[str]]:
    """(the summary rows as shown, the columns shown): a column with a gap (a run that failed before its first
    step) is written out as text, with a dash where nothing was measured."""
    rows = [compare.summary(run, labels[run.run_id]) for run in runs]
    shown = compare.shown_columns(rows)
    gaps = {column for column in shown if any(row[column] is None for row in rows)}
    return [{column: _cell(row[column]) if column in gaps else row[column] for column in shown}
            for row in rows], shown


def table_by_field(runs, labels: dict[str, str]) -> tuple[list[dict], list[str]]:
    """The summary turned on its side for the page: a row per field ("what") and a column per run, as text. A row
    per run has 15 columns, 2,200 px wide, where a projector's page gives the table 818 (1280×720): its last columns
    scrolled out of view. (The CSV and the offline page keep a row per run.)"""
    rows, shown = table_rows(runs, labels)
    names = [str(row["name"]) for row in rows]
    names = [name if names.count(name) == 1 else f"{index + 1}. {name}" for index, name in enumerate(names)]
    by_field = [{"what": column, **{name: _cell(row[column]) for name, row in zip(names, rows)}}
                for column in shown if column != "name"]
    return by_field, ["what", *names]


def _cell(value) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def draw(snapshots, key: str, x: str = "samples_seen", labels: dict[str, str] | None = None,
         pairs: list[tuple[int, int]] | None = None, story: str | None = None, toolbar: bool = True) -> dict | None:
    """Headline (once the compared runs ended), the charts (``build_figures``) and the summary table.

    ``snapshots``: runs as the pages take them each poll (``RunState.snapshot``), so text and charts are drawn
    from one set of events. ``key`` keeps this view's widgets and cached figures apart from another view's.
    ``labels``: {run id: name} to call the runs by (a demo's own names); else names() says what differs.
    ``pairs``: the headline's pair first, then further pairs (see ``headline``); ``story``: a demo's chart;
    ``toolbar``: plotly's toolbar on hover (a demo on a projector goes without). Returns the headline.
    """
    labels = labels or names(snapshots)
    figures = headline(snapshots, pairs)
    # One slot each, drawn empty until there is something to say: an element that appears above the charts would
    # shift them, and Streamlit mounts a shifted chart anew (a blank frame, a lost zoom) instead of redrawing it.
    with st.container():
        show_headline(figures, snapshots, labels)
    with st.container():
        for line in warning_lines(snapshots, labels):
            st.caption(line)
    curves = [(labels[run.run_id], run.events) for run in snapshots]
    chart_names = [name for row in (STORY_ROWS if story else ROWS) for name, _ in row]
    built = dict(zip(chart_names, server.shared_figures(
        (key, tuple((run.run_id, name, len(events)) for run, (name, events) in zip(snapshots, curves)),
         figures["headline"] if figures else None, story, tuple(pairs or ())),
        lambda: tuple(build_figures(curves, figures, x, story, pairs)[name] for name in chart_names))))
    for index, row in enumerate(STORY_ROWS if story else ROWS):
        if index == 1:  # the table between the first row of charts and the rest
            rows, shown = table_by_field(snapshots, labels)
            st.dataframe(rows, hide_index=True, column_order=shown)
        for (name, _), column in zip(row, st.columns([share for _, share in row])):
            if name == "process":
                with column.expander(PROCESS_NOTE):
                    live_chart(built[name], key=f"{key}_{name}", toolbar=toolbar)
            else:
                with column:
                    live_chart(built[name], key=f"{key}_{name}", toolbar=toolbar)
    return figures
