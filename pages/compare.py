"""Compare runs: overlay loss, memory and F1 of finished or live runs (anyone's) and export the table."""

import streamlit as st

from gradacc.analysis import compare
from gradacc.app import charts, widgets as ui

DEFAULT_PICKS = 3

manager = ui.run_manager()
owner = ui.owner_id()
st.title("Compare runs")
st.caption("Every run on this server, yours and other visitors'. Loss is drawn against samples seen, so runs "
           "with different effective batches line up.")

runs = {run.run_id: run for run in manager.runs()}
if not runs:
    st.info("No runs yet: start one on the Train page, then come back.")
    st.stop()

# Pre-picked: this visitor's newest runs (what they came to compare), else the server's newest.
own_ids = [run_id for run_id, run in runs.items() if run.owner == owner]
chosen_ids = st.multiselect("Runs", list(runs), default=(own_ids or list(runs))[:DEFAULT_PICKS],
                            format_func=lambda run_id: compare.title(runs[run_id]), key="compare_runs")
if not chosen_ids:
    st.info("Pick one or more runs above.")
    st.stop()
any_live = any(runs[run_id].is_live for run_id in chosen_ids)


@st.fragment(run_every=ui.CHART_POLL_SECONDS if any_live else None)
def comparison():
    # Fresh states each time: a live run's events grow between polls.
    chosen = [run for run in (manager.get(run_id) for run_id in chosen_ids) if run is not None]
    if any_live and not any(run.is_live for run in chosen):
        st.rerun()  # all ended: stop polling
    curves = [(compare.legend_name(run), run.events) for run in chosen]
    loss_figure, eval_figure, memory_figure = ui.shared_figures(
        ("compare", tuple((run.run_id, name, len(events)) for run, (name, events) in zip(chosen, curves))),
        lambda: (charts.loss_figure(curves, x="samples_seen"), charts.eval_figure(curves),
                 charts.memory_figure(curves, x="samples_seen")))
    loss_chart, eval_chart = st.columns(2)
    loss_chart.plotly_chart(loss_figure, key="compare_loss")
    eval_chart.plotly_chart(eval_figure, key="compare_eval")
    st.plotly_chart(memory_figure, key="compare_memory")

    rows = [compare.summary(run) for run in chosen]
    st.dataframe(rows, hide_index=True, column_order=compare.COLUMNS,
                 column_config={"peak activation bytes": st.column_config.NumberColumn(format="compact")})
    csv_column, json_column, _ = st.columns([1, 1, 4])
    csv_column.download_button("Download CSV", compare.to_csv(rows), file_name="gradacc-runs.csv",
                               mime="text/csv", key="download_csv", on_click="ignore")
    json_column.download_button("Download JSON", compare.to_json(chosen), file_name="gradacc-runs.json",
                                mime="application/json", key="download_json", on_click="ignore")


comparison()
