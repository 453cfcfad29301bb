"""Demos: one click per story. Each scenario (gradacc.analysis.demos) queues its runs, shows them live, and
states its result. ``?demo=NAME`` opens one, so a speaker can prepare links."""

import streamlit as st

from gradacc.analysis import demos
from gradacc.app import (comparison, coupled_view, inputs, navigation, pacing, runview, scroll, server, warmup_status,
                         web_page)
from gradacc.errors import GradaccError

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

CHOICE = "demo.choice"
SCROLL = "demo.scroll"

# Wide: on a projector the runs side by side, the headline in two lines and the charts' titles need the width.
st.set_page_config(page_title="gradacc: demos", page_icon="🧮", layout="wide")

manager = server.run_manager()
checks = server.check_runner()
limits = server.limits()
owner = server.owner_id()

st.title("Demos: one click per story")
warmup_status.warm_up_status()

names = list(demos.SCENARIOS)
requested = st.query_params.get("demo")
if requested and requested not in demos.SCENARIOS:
    st.warning(f"There is no demo called {requested!r}; the demos are {', '.join(names)}.")
elif requested and st.session_state.get("demo.requested") != requested:
    st.session_state[CHOICE] = requested  # a link (or a reload) picks the demo; the picker follows
st.session_state["demo.requested"] = requested
# Streamlit can drop a widget's state around a fragment's st.rerun (streamlit#10805, #11266): the address bar, which
# this page keeps on the demo shown, then says which one it was, not the first of the list.
inputs.defaults({CHOICE: requested if requested in demos.SCENARIOS else names[0]})
# One line, whatever the number of demos: the Run button stays in view at 1280×720.
name = st.selectbox("Demo", names, key=CHOICE, format_func=lambda n: demos.SCENARIOS[n].title,
                    label_visibility="collapsed")
st.query_params["demo"] = name
st.session_state["demo.requested"] = name
scenario = demos.SCENARIOS[name]
configs = scenario.configs()

runs_key = f"demo.runs.{name}"
run_ids = st.session_state.get(runs_key)
if not run_ids:
    run_ids = runview.live_demo_run_ids(manager.runs(), scenario)
    if run_ids:  # someone else's demo, running: a viewer who opened its link lands on it, not on the page top
        st.session_state[SCROLL] = {"runs": True, "headline": True}
st.session_state[runs_key] = run_ids  # a demo someone else is running is watched here until it ends, and after
runs = [run for run in (manager.get(run_id) for run_id in run_ids) if run is not None]
live = any(run.is_live for run in runs)

st.header(scenario.title)
refused = {field: message for _, config in configs for field, message in limits.errors(config).items()}
if refused:
    st.error("This deployment's limits refuse this demo: " + " ".join(dict.fromkeys(refused.values())))
if st.button("Run this demo", type="primary", key="demo.run", disabled=live or bool(refused),
             help="Its runs are still going." if live else None):
    try:
        run_ids = [manager.submit(config, owner, label=scenario.run_label(label)) for label, config in configs]
        if scenario.checks:
            coupled_view.submit(checks, scenario.checks)
    except GradaccError as error:
        st.error(error.message)
    else:
        st.session_state[runs_key] = run_ids
        st.session_state[SCROLL] = {"runs": True, "headline": True}  # bring each into view once it is drawn
        st.rerun()  # redraw with the live view polling
st.markdown(scenario.explanation)
st.caption("Runs, in this order: " + " · ".join(
    f"**{label}** ({inputs.BACKEND_NAMES[config.backend]}, m={config.micro_batch_size}, k={config.grad_accum_steps}, "
    f"{config.train_samples} examples × {config.epochs} epoch{'s' if config.epochs > 1 else ''})"
    for label, config in configs) + f". Expect: {scenario.expect}")

st.divider()


checking = bool(scenario.checks) and coupled_view.pending(checks, scenario.checks)


# One poller for the runs and the checks: a full rerun that one fragment asks for while another fragment's run is
# under way mounts the charts anew (a blink on the projector, or a chart mounted twice): one fragment polls both, so
# none races another (warmup_status.py never asks for a full rerun, for the same reason).
polling = pacing.CHART_POLL_SECONDS if checking else None
if live:
    polling = pacing.chart_poll_seconds(*(manager.get(run_id) for run_id in run_ids))


@st.fragment(run_every=polling)
def demo_view():
    current = [run for run in (manager.get(run_id) for run_id in run_ids) if run is not None]
    if polling and not any(run.is_live for run in current) and not (
            scenario.checks and coupled_view.pending(checks, scenario.checks)):
        st.rerun()  # all ended: one full rerun turns polling off and enables the button again
    runs_view(current)
    # Below the runs: the checks' sentences and table arrive while the runs train, and above them they would push
    # the runs and the headline, already scrolled into view, down off the screen.
    if scenario.checks:
        st.subheader("Gradients against the big batch")
        coupled_view.draw(checks, scenario.checks, key="demo")


def runs_view(current) -> None:
    """The runs' panels, their charts and the headline (and their scrolls into view)."""
    if not current:
        st.info("Press **Run this demo**: its runs queue one after the other, train live here, and the result "
                "is written above the charts when both are done.")
        return
    poll_seconds = polling if live else None
    snapshots = [pacing.watch(run, poll_seconds) for run in current]
    pacing.keep_pace(poll_seconds, *current)
    wanted = st.session_state.get(SCROLL) or {}
    with st.container():  # a fixed slot: the charts below keep their place (comparison.draw says why)
        if wanted.get("runs"):  # just clicked (or a link to a running demo): its runs on screen
            # The same frame on every poll until the result is written: it runs once, and stays mounted (a frame
            # drawn once was gone at the next poll, on a busy machine before its script had run).
            scroll.into_view("demo-live", nonce=f"runs {run_ids}")
    columns = st.container(key="demo-live").columns(len(snapshots))
    # The scenario's own names ("naive ÷k", "GradCache batch 64"): what differs between five runs, spelt out, is no
    # name a room can read. A watched demo cut short (a run deleted) falls back to what differs.
    whole = len(current) == len(scenario.runs)
    labels = ({run.run_id: demo_run.label for demo_run, run in zip(scenario.runs, current)}
              if whole else comparison.names(snapshots))
    for column, run in zip(columns, snapshots):
        with column, st.container(key=f"demo-run-{run.run_id}"):
            st.markdown(f"**{labels[run.run_id]}**")
            kind, sentence = runview.status_message(run, runview.queue(manager, run.run_id))
            getattr(st, kind)(sentence)
            bar = runview.progress(run)
            if bar is not None:  # queued, or failed before its first step: the sentence above says it all
                st.progress(bar[0], text=bar[1])
    with st.container():
        if any(run.is_live for run in snapshots):
            st.caption("The result is written here when both runs are done.")
    figures = comparison.draw(snapshots, key="demo", labels=labels, toolbar=False,
                              pairs=[scenario.compares, *scenario.controls] if whole else None,
                              story=scenario.chart if whole else None)
    if figures is not None:
        wanted.pop("runs", None)  # the result's own scroll takes over
    if figures is not None and wanted.get("headline"):
        # The result, the moment it is written, once every run has ended, and again in the page's last full run:
        # runs still training above it change their panels' heights meanwhile, and the end of polling changes them
        # once more (the "result is written here" line goes), which moves it under the page's header.
        settled = not any(run.is_live for run in snapshots)
        moment = "final" if not live else "settled" if settled else "written"
        scroll.into_view("headline", nonce=f"headline {run_ids} {moment}")
        if moment == "final":
            wanted.pop("headline")
    if not any(run.is_live for run in current) and whole:
        # Built when clicked, from the runs as stored: a speaker's offline copy, or a free static Space.
        recorded = [(demo_run.label, run.events) for demo_run, run in zip(scenario.runs, current)]
        st.download_button("Download as a web page",
                           data=lambda: web_page.demo_page(scenario, recorded,
                                                           coupled_view.reports(checks, scenario.checks)),
                           file_name=f"gradacc-{name}.html", mime="text/html", on_click="ignore", key="demo.web_page",
                           help="One HTML file that replays these runs at their pace with the explanation, every "
                                "chart, the table and the result; it needs no network (plotly is inside).")


demo_view()
