"""Train: pick a model, data and accumulation settings, press Start, watch loss, memory and F1 live."""

import streamlit as st

from gradacc.app import charts, form, inputs, navigation, pacing, runview, scroll, server, train_form, warmup_status
from gradacc.app.charts import fsdp as fsdp_charts
from gradacc import units
from gradacc.training.run import health
from gradacc.app.live_chart import live_chart
from gradacc.training.backends import DESCRIPTIONS
from gradacc.training.tasks import task_named
from gradacc.choices import BACKENDS
from gradacc.config import RunConfig
from gradacc.labels import field_label
from gradacc.errors import GradaccError

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

K = train_form.TRAIN_FORM

manager = server.run_manager()
limits = server.limits()
owner = server.owner_id()

st.title("Gradient accumulation, live")
warmup_status.warm_up_status()
st.caption("This deployment: " + " · ".join(limits.describe()) + ".")

train_form.prepare_train_form(limits)  # first values, and what another page (the planner) suggested since
filled = st.container(key="train-filled")  # the form's top: what the planner filled, once the values are known
errors = inputs.FieldErrors()
data_column, settings_column = st.columns(2, gap="large")
with data_column:
    st.subheader("Model and data")
    model = inputs.model_input("train", errors)
    inputs.follow_recipe("train", model, limits)  # untouched fields move to the new model's (or optimizer's) recipe
    inputs.recipe_note("train")
    dataset, text_column, label_column, dataset_problem = inputs.dataset_input("train", errors, limits)
    task = inputs.task_input("train", errors, RunConfig(model=model, dataset=dataset))
    gradcache_mini_batch = inputs.gradcache_input("train", errors) if task_named(task).gradcache else None
    backend = st.radio(field_label("backend"), BACKENDS, key=K + "backend", persist_state="session",
                       format_func=inputs.BACKEND_NAMES.get, captions=[DESCRIPTIONS[b] for b in BACKENDS])
    errors.slot("backend")
with settings_column:
    st.subheader("Accumulation and training")
    settings = inputs.training_inputs(K, errors, model)
    with st.expander("Break it on purpose"):
        st.caption("PyTorch loop only. Each choice adds one wrong line from a real upstream report to the right loop, "
                   "as a hook (the Code page shows it in red beside the line it gets wrong); the run then says what "
                   "it broke, measured against the right loop in the same run.")
        settings["pitfalls"] = inputs.pitfall_input(K, field_label("pitfalls"), help="None chosen: the right loop.")
        errors.slot("pitfalls")

config = RunConfig(backend=backend, model=model, dataset=dataset, task=task, text_column=text_column,
                   label_column=label_column, gradcache_mini_batch=gradcache_mini_batch, **settings)
filled_note, just_filled = train_form.filled_note(config)
if filled_note:
    filled.info(filled_note, icon="🧠")
if just_filled:  # the planner's button sat far down its page, and the Train page opens at that scroll
    scroll.into_view("train-filled", nonce=filled_note)
train_form.keep_train_config(config)  # the other pages read the Train form's settings from here
train_examples, data_problems = inputs.train_examples(config)
checked, problems = form.check(config, limits, train_examples)  # checked once, here: every problem at once
if dataset_problem:
    problems["dataset"] = dataset_problem
for field, message in data_problems.items():
    problems.setdefault(field, message)
problems |= errors.empty  # an emptied field: the check took some for the recipe's value, the rest "got None"

# What the settings mean, updated as the visitor types.
effective, steps, examples = st.columns(3)
sizes_ok = not {"micro_batch_size", "grad_accum_steps"} & problems.keys()
effective.metric("Effective batch", config.effective_batch if sizes_ok else "—",
                 help="m × k × processes: the examples behind one optimizer step.")
if sizes_ok:
    effective.caption(f"{config.micro_batch_size} × {config.grad_accum_steps} × {config.num_processes} "
                      f"process{'es' if config.num_processes > 1 else ''}")
step_count = form.optimizer_steps(checked, train_examples) if not problems else None
steps.metric("Optimizer steps", step_count if step_count is not None else "—",
             help="ceil(ceil(N / processes / m) / k) per epoch: the short last window is a step too.")
examples.metric("Training examples", train_examples if train_examples is not None else "—",
                help="Known before Start for the built-in data and uploads; a hub dataset is counted when it loads.")

general = st.container()
errors.show(problems, general)
lr_warning = None if problems else health.learning_rate_warning(checked)
if lr_warning:  # said before Start; the run's end warnings name the same cause afterwards
    general.warning(lr_warning, icon="⚠️")

# The run this session watches: the last it started, or the one in the URL after a reload.
run_id = st.session_state.get("run_id") or st.query_params.get("run")
run = manager.get(run_id) if run_id else None
live = run is not None and run.is_live
own_live = live and run.owner == owner  # one live run per visitor; another's run (from a link) is only watched
# The URL names the run shown, so a reload or a shared link comes back to it. Set on every script run, not only at
# Start: a query parameter set just before st.rerun() can miss the address bar (streamlit#7961).
if run_id and st.query_params.get("run") != run_id:
    st.query_params["run"] = run_id


# At 1280×720 the form fills the screen and the run's panel starts below it: after Start the page scrolls Start and
# Stop to the top once, the run's panel under them, as the Demos page does with its runs (gradacc.app.scroll).
SCROLL_TO_RUN = "train.scroll_to_run"


def start(run_config: RunConfig) -> None:  # the checked form, or a Fit with accumulation to check
    try:
        new_run = manager.submit(run_config, owner, label=form.run_label(run_config))
    except GradaccError as error:
        general.error(error.message)
        return
    st.session_state["run_id"] = new_run  # the rerun below puts it in the URL too
    st.session_state[SCROLL_TO_RUN] = new_run  # the rerun below brings its panel into view, Stop above it
    train_form.suggest_train_settings(micro_batch_size=run_config.micro_batch_size,
                              grad_accum_steps=run_config.grad_accum_steps)  # the form shows what now runs
    st.rerun()  # redraw with the live panel polling


start_column, stop_column, _ = st.container(key="train-buttons").columns([1, 1, 5])
if start_column.button("Start", type="primary", key="start", disabled=bool(problems) or own_live,
                       help="Fix the settings marked in red first." if problems else None):
    start(checked)
if own_live and stop_column.button("Stop", key="stop"):
    manager.stop(run_id, owner)
    st.toast("Stopping after the current micro-batch…")

st.divider()


# Status and charts are drawn from one snapshot of the run per poll, so the chart shows the step the status
# names. One poll a second, slower when many pages watch (pacing.chart_poll_seconds): building and sending plotly
# figures holds the GIL that the training thread needs, and on a 2-CPU server would slow the run it draws.
poll_seconds = pacing.chart_poll_seconds(run) if live else None


@st.fragment(run_every=poll_seconds)
def run_panel():
    live_run = manager.get(run_id) if run_id else None
    current = pacing.watch(live_run, poll_seconds) if live_run is not None else None
    pacing.keep_pace(poll_seconds, live_run)
    run_status(current)
    run_charts(current)


def run_status(current):
    if current is None:
        st.info("Press Start to train; loss, memory and F1 appear here as the run goes.")
        return
    if live and not current.is_live:
        st.rerun()  # the run ended: one full rerun turns polling off and re-enables Start
    # Keyed by the run: the browser (and a browser test) can tell this run's panel from the last one's.
    with st.container(key=f"run-{current.run_id}-status"):
        st.caption(f"Run {current.run_id} · {current.name}")
        kind, sentence = runview.status_message(current, runview.queue(manager, run_id))
        getattr(st, kind)(sentence)
        bar = runview.progress(current)
        if bar is not None:  # a queued run, or one that failed before it counted steps, has no bar to show
            st.progress(bar[0], text=bar[1])
        for note in runview.notes(current):
            st.caption(f"ℹ️ {note}")
        fit = runview.fit_with_accumulation(current)
        if fit is not None and st.button("Fit with accumulation", type="primary", key="fit_with_accumulation",
                                         disabled=manager.any_live(owner),
                                         help=f"Start it again with m={fit.micro_batch_size}, k={fit.grad_accum_steps}: "
                                              "the largest power-of-two micro-batch that fits, and the same effective "
                                              "batch."):
            start(fit)
        if not runview.has_anything_to_show(current):
            return  # ended before it trained: the reason above is all there is; no empty scores or charts
        f1, accuracy, memory = st.columns(3)
        for column, (name, value) in zip((f1, accuracy), runview.eval_scores(current)):
            column.metric(name, value)
        static = (current.started or {}).get("static_memory") or {}
        memory.metric("Params + grads + optimizer", units.format_bytes(static.get("total")))
        if not current.is_live and current.started is not None:
            # Built from the stored events when clicked (runs from before the export too); nothing is pushed anywhere.
            st.download_button("Download for TensorBoard", data=lambda: runview.tensorboard_zip(current),
                               file_name=f"gradacc-{current.run_id}-tensorboard.zip", mime="application/zip",
                               on_click="ignore", key="tensorboard_zip",
                               help="The run's TensorBoard event files: unzip, then `tensorboard --logdir .`")


def run_charts(current):
    if current is not None and not runview.has_anything_to_show(current):
        return
    # Before a run has started the charts are drawn empty: the page keeps its layout, and the browser
    # loads plotly while the visitor chooses settings instead of after Start (about 1.3 s here).
    run_events = current.events if current is not None and current.started is not None else []
    with st.container(key=f"run-{run_id or 'none'}-charts"):
        x_axis = st.radio("Loss against", ["step", "samples_seen"], format_func=charts.X_TITLES.get, horizontal=True,
                          key="loss_x")
        curves = [("this run", run_events)]
        loss_figure, memory_figure, eval_figure = server.shared_figures(
            ("train", run_id if run_events else None, len(run_events), x_axis),
            lambda: (charts.loss_figure(curves, x=x_axis), charts.memory_figure(curves), charts.eval_figure(curves)))
        loss_chart, eval_chart = st.columns(2)
        with loss_chart:
            live_chart(loss_figure, key="loss_chart")
        with eval_chart:
            live_chart(eval_figure, key="eval_chart")
        live_chart(memory_figure, key="memory_chart")  # full width: its two panels need the room
        if fsdp_charts.has_sharding(curves):  # a sharded run: what each rank held and sent, as it measured them
            st.plotly_chart(fsdp_charts.sharding_figure(curves), key="sharding_chart")


if run_id and st.session_state.pop(SCROLL_TO_RUN, None) == run_id:
    scroll.into_view("train-buttons", nonce=run_id)
run_panel()
