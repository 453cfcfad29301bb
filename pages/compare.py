"""Compare runs: the headline of two runs in words, their curves, memory and F1 (anyone's runs), and the
table to export."""

import streamlit as st

from gradacc.analysis import compare, run_names
from gradacc.app import comparison, navigation, pacing, server

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

manager = server.run_manager()
owner = server.owner_id()
st.title("Compare runs")
st.caption("Every run on this server, yours and other visitors'. Loss is drawn against samples seen, so runs "
           "with different effective batches line up. The first two picks get a headline: the second "
           "described against the first.")

all_runs = manager.runs()
runs = {run.run_id: run for run in all_runs}
if not runs:
    st.info("No runs yet: start one on the Train page (or run a demo), then come back.")
    st.stop()

picks = run_names.default_picks(all_runs, owner)
chosen_ids = st.multiselect("Runs", list(runs), default=picks,
                            format_func=lambda run_id: run_names.title(runs[run_id]), key="compare_runs")
if not chosen_ids:
    st.info("Pick one or more runs above." if picks else run_names.NO_PICKS)
    st.stop()
any_live = any(runs[run_id].is_live for run_id in chosen_ids)


poll_seconds = pacing.chart_poll_seconds(*(runs[run_id] for run_id in chosen_ids)) if any_live else None


@st.fragment(run_every=poll_seconds)
def comparison_view():
    # Fresh states each time: a live run's events grow between polls.
    found = [run for run in (manager.get(run_id) for run_id in chosen_ids) if run is not None]
    chosen = [pacing.watch(run, poll_seconds) for run in found]
    if any_live and not any(run.is_live for run in chosen):
        st.rerun()  # all ended: stop polling
    pacing.keep_pace(poll_seconds, *found)
    if len(chosen) == 1:
        st.caption("Pick a second run for a headline that says how they differ.")
    comparison.draw(chosen, key="compare")
    labels = comparison.names(chosen)
    rows = [compare.summary(run, labels[run.run_id]) for run in chosen]
    csv_column, json_column, _ = st.columns([1, 1, 4])
    csv_column.download_button("Download CSV", compare.to_csv(rows), file_name="gradacc-runs.csv",
                               mime="text/csv", key="download_csv", on_click="ignore")
    json_column.download_button("Download JSON", compare.to_json(chosen), file_name="gradacc-runs.json",
                                mime="application/json", key="download_json", on_click="ignore")


comparison_view()
