"""Two or more runs side by side: the headline in words, charts whose titles state it, the table.

Shared by the Compare page and the Demos page, so a demo proves its point with the same view a visitor
gets when comparing their own runs.
"""

from __future__ import annotations

import streamlit as st

from gradacc import events as ev
from gradacc.analysis import compare, run_names
from gradacc.analysis.headline import headline as two_run_headline
from gradacc.app import charts, server
from gradacc.app.live_chart import live_chart


def names(runs) -> dict[str, str]:
    """{run id: what differs between these runs}, e.g. 'm=8, k=4, naive' (see run_names.differing_labels)."""
    return run_names.differing_labels({run.run_id: run.config for run in runs})


def headline(runs) -> dict | None:
    """The headline of the first two runs, once both have ended (a live run's numbers still move); ``further``:
    for each later run that has ended on the same model and data, its loss curve against the first run's (a third
    run is often the control: exact beside naive, both against the full batch)."""
    if len(runs) < 2 or any(run.is_live for run in runs[:2]):
        return None
    # The page names each run by what differs (names()): the headline need not say it again.
    figures = two_run_headline(runs[0].events, runs[1].events, name_differences=False)
    same_data = [run for run in runs[2:] if not run.is_live and any(e.get("event") == ev.STEP for e in run.events)
                 and all(
        run.config.get(name) == runs[0].config.get(name) for name in (*run_names.DATA_FIELDS, "model"))]
    figures["further"] = {run.run_id: two_run_headline(runs[0].events, run.events, name_differences=False)["loss_claim"]
                          for run in same_data}
    return figures


def show_headline(figures: dict | None, runs, labels: dict[str, str]) -> None:
    if figures is None:
        return
    warned = any((run.ended or {}).get("warnings") for run in runs[:2])
    against = f"**{labels[runs[1].run_id]}** against **{labels[runs[0].run_id]}**"
    for run_id, claim in (figures.get("further") or {}).items():  # the control, said beside the headline
        against += f" · **{labels[run_id]}** against it: {claim[:1].lower()}{claim[1:]}"
    box = st.warning if warned or any(run.status != ev.COMPLETED for run in runs[:2]) else st.success
    with st.container(key="headline"):
        box(f"### {figures['headline']}\n{against}", icon="📣")


def draw(snapshots, key: str, x: str = "samples_seen", labels: dict[str, str] | None = None) -> dict | None:
    """Headline (once the first two runs ended), loss, eval and memory charts, and the summary table.

    ``snapshots``: runs as the pages take them each poll (``RunState.snapshot``), so text and charts are drawn
    from one set of events. ``key`` keeps this view's widgets and cached figures apart from another view's.
    ``labels``: {run id: name} to call the runs by (a demo's own names); else names() says what differs. Returns the
    headline.
    """
    labels = labels or names(snapshots)
    figures = headline(snapshots)
    # One slot each, drawn empty until there is something to say: an element that appears above the charts would
    # shift them, and Streamlit mounts a shifted chart anew (a blank frame, a lost zoom) instead of redrawing it.
    with st.container():
        show_headline(figures, snapshots, labels)
    with st.container():
        for run in snapshots:
            for warning in (run.ended or {}).get("warnings") or []:
                st.caption(f"⚠️ {labels[run.run_id]}: {warning}")
    curves = [(labels[run.run_id], run.events) for run in snapshots]
    loss_title = figures["loss_claim"] if figures else "Training loss against samples seen"
    memory_title = (f"Memory per step: {figures['memory_claim']}" if figures and figures["memory_claim"]
                    else "Memory per step: static + peak activations")
    loss_figure, eval_figure, memory_figure, process_figure = server.shared_figures(
        (key, tuple((run.run_id, name, len(events)) for run, (name, events) in zip(snapshots, curves)), loss_title,
         memory_title),
        lambda: (charts.loss_figure(curves, x=x, title=loss_title), charts.eval_figure(curves),
                 charts.memory_breakdown_figure(curves, title=memory_title),
                 charts.memory_figure(curves, x=x, title="Process memory (RSS) over the run")))
    loss_chart, memory_chart = st.columns([3, 2])
    with loss_chart:
        live_chart(loss_figure, key=f"{key}_loss")
    with memory_chart:
        live_chart(memory_figure, key=f"{key}_memory")
    rows = [compare.summary(run, labels[run.run_id]) for run in snapshots]
    st.dataframe(rows, hide_index=True, column_order=compare.shown_columns(rows),
                 column_config={"peak activation bytes": st.column_config.NumberColumn(format="compact")})
    eval_column, process_column = st.columns(2)
    with eval_column:
        live_chart(eval_figure, key=f"{key}_eval")
    with process_column.expander("Process memory (RSS): mostly the Python and torch runtime, the same for "
                                 "every run"):
        live_chart(process_figure, key=f"{key}_process")
    return figures
