"""Memory planner: measure a model once per lever setting, then rank the settings that fit a budget, with m and k."""

import pandas as pd
import streamlit as st

from gradacc.analysis import config_plan, learning_steps, planner, sharding
from gradacc.app import charts, inputs, navigation, scroll, server, train_form
from gradacc import units
from gradacc.config import RunConfig
from gradacc.labels import field_label
from gradacc.recipes import shares_learning_rate
from gradacc.errors import GradaccError, one_line
from gradacc.serving import warmup

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

K = f"{inputs.FORM}planner."
PLANNED_PROCESSES = (1, 2, 4, 8, 16, 32, 64)
WAY_NAMES = {"ddp": "replicated (DDP)", "per-window": "sharded (FSDP), per-window sync",
             "per-micro-batch": "sharded (FSDP), per-micro-batch sync"}
MEASUREMENT = "planner.measurement"

server.run_manager()
limits = server.limits()

st.title("Memory planner")
st.markdown("Training memory = **static** (parameters + gradients + optimizer state) + **activations** of one "
            "micro-batch (what autograd keeps for backward). Accumulation steps k add no memory; the micro-batch m "
            "does, and so do the other levers: **gradient checkpointing** keeps far fewer activations (and "
            "recomputes them), **bf16** autocast keeps smaller ones, a **lighter optimizer** keeps less state. The "
            f"planner measures the model under each of the {len(planner.LEVER_GRID)} settings of these levers, then "
            "ranks those that fit your budget, with m (a power of two) × k = your target effective batch exactly.")


CONFIG_PLAN = "planner.config_plan"  # the last plan from a config, or {"error": its one line}
CONFIG_PLANS = "planner.config_plans"  # clicks so far: each brings its result into view once
CONFIG_RESULT = "config-plan-result"


def plan_from_config() -> None:
    """A model this machine cannot train, planned from its config alone (gradacc.analysis.config_plan)."""
    st.caption("The model is built on the meta device (no weights); its activations are measured on small copies "
               "of the same family on this machine and scaled to the config. Framework overhead: "
               f"{config_plan.FRAMEWORK_OVERHEAD_SOURCE}.")
    source_column, upload_column = st.columns(2)
    source = source_column.text_input(f"{field_label('model')}: a hub id, or a folder with a config.json",
                                      key=K + "config_source")
    upload = upload_column.file_uploader("…or upload a config.json", type=["json"], key=K + "config_upload")
    gpu_column, length_column, target_column, ranks_column = st.columns(4)
    presets = [f"{size} GB" for size in config_plan.GPU_PRESETS_GB] + ["another size"]
    gpu = gpu_column.selectbox("GPU memory", presets, index=presets.index("24 GB"), key=K + "config_gpu")
    gigabytes = float(gpu.split()[0]) if gpu != "another size" else gpu_column.number_input(
        "GB", min_value=1.0, value=24.0, key=K + "config_gb")
    # the labels the plan's messages name (gradacc.labels)
    length = length_column.number_input(field_label("max_seq_length"), min_value=16, value=2048, step=256,
                                        key=K + "config_length")
    target = target_column.number_input(field_label("target_effective_batch"), min_value=1, value=256,
                                        key=K + "config_target")
    ranks = ranks_column.selectbox(field_label("processes"), PLANNED_PROCESSES, key=K + "config_processes")
    clicked = st.button("Plan from the config", key="plan_config", disabled=not (source.strip() or upload))
    if clicked:
        warmup.wait_until_warm()  # it imports torch: never beside the warm-up's import (gradacc.serving.warmup)
        try:
            with st.spinner("Measuring the family's small copies…"):
                st.session_state[CONFIG_PLAN] = config_plan.plan_upload(
                    upload.getvalue() if upload else None, source.strip(), budget_mb=config_plan.gpu_budget_mb(
                        gigabytes), sequence_length=int(length), target_effective_batch=int(target),
                    processes=int(ranks))
        except GradaccError as error:
            st.session_state[CONFIG_PLAN] = {"error": error.message}
        st.session_state[CONFIG_PLANS] = st.session_state.get(CONFIG_PLANS, 0) + 1
    with st.container(key=CONFIG_RESULT):  # below the fields: brought into view after each click
        show_config_plan(st.session_state.get(CONFIG_PLAN))
    if clicked:
        scroll.into_view(CONFIG_RESULT, nonce=f"plan {st.session_state[CONFIG_PLANS]}")


def show_config_plan(result: dict | None) -> None:
    """The plan from a config (its table, the pick's terms, accelerate's view), or the one line saying why not."""
    if result is None:
        return
    if "error" in result:
        st.error(result["error"])
        return
    if result["reason"]:
        st.error(result["reason"])
    st.dataframe(pd.DataFrame(config_plan.shown_rows(result)).astype({"m": "Int64", "k": "Int64"}),
                 hide_index=True, key="config_plan_table")
    pick = result["rows"][0]
    st.markdown(f"**{config_plan.setting_label(pick)}**"
                + (f", m = {pick['micro_batch_size']}, k = {pick['grad_accum_steps']}" if pick["fits"] else
                   " (the smallest; it does not fit)") + ": its peak, term by term (GB)")
    st.bar_chart(pd.DataFrame([config_plan.stacked_terms(pick)], index=["peak"]), horizontal=True)
    weighing = result["normalisation"]
    st.markdown(f"**Accumulate by items** ({weighing['items']}), not by micro-batch: with Trainer, "
                f"{weighing['trainer']}; in a plain loop, {weighing['loop']}.")
    view = result["accelerate"]
    st.caption(f"`accelerate estimate-memory` for the same model (weights + gradients + Adam states, batch 1, no "
               f"activations): {units.format_bytes(view['adam_fp32_bytes'])} in fp32, "
               f"{units.format_bytes(view['adam_bf16_bytes'])} in mixed bf16.")


with st.expander("Plan a model you cannot run here (from its config)"):
    plan_from_config()


@st.cache_data(show_spinner=False, max_entries=64)
def measured_group(model: str, max_seq_length: int, checkpointing: bool, precision: str) -> list[dict]:
    """One model load: its forward/backward measured once, then each optimizer (see planner.measure_levers)."""
    warmup.wait_until_warm()  # it imports torch: never beside the warm-up's import (gradacc.serving.warmup)
    return planner.measure_levers(model, max_seq_length, grid=planner.lever_group(checkpointing, precision))


inputs.defaults({K + "max_seq_length": 64, K + "budget_mb": 100.0, K + "target_effective_batch": 256})
errors = inputs.FieldErrors()
model_column, length_column = st.columns([2, 1])
with model_column:
    model = inputs.model_input("planner", errors)
with length_column:
    max_seq_length = inputs.number_field(K, "max_seq_length", errors, step=16,
                                     help="Every example is padded to this length: the worst case of a batch.")

general = st.container()
try:
    limits.check(RunConfig(model=model, max_seq_length=max_seq_length).check())
    planner.check_plannable(model)
    measurable = True
except GradaccError as error:
    measurable = False
    errors.show(error.by_field, general)
if errors.empty and measurable:  # an emptied length: the check took the default; the field says it is empty
    measurable = False
    errors.show({}, general)

wanted = (model, max_seq_length)
if st.button("Measure", type="primary", key="measure", disabled=not measurable,
             help="Loads the model once per checkpointing and precision setting: activations of micro-batches of 1, "
                  "2, 4 and 8, a short timed run, and one step of each optimizer."):
    settings, groups = [], planner.LEVER_GROUPS
    with st.status(f"Measuring {model} at {max_seq_length} tokens under {len(planner.LEVER_GRID)} lever settings…",
                   expanded=True) as status:
        bar = st.progress(0.0)
        try:
            for done, (checkpointing, precision) in enumerate(groups):
                bar.progress(done / len(groups), text=f"Checkpointing {'on' if checkpointing else 'off'}, "
                                                      f"{precision} ({done + 1} of {len(groups)})")
                settings += measured_group(model, max_seq_length, checkpointing, precision)
            bar.progress(1.0, text="Done")
            status.update(label=f"Measured {len(settings)} lever settings of {model} at {max_seq_length} tokens",
                          state="complete", expanded=False)
            st.session_state[MEASUREMENT] = {"model": model, "max_seq_length": max_seq_length, "settings": settings}
        except Exception as error:  # noqa: BLE001 - a demo shows one line, never a traceback
            status.update(label=f"Could not measure {model}", state="error")
            general.error(error.message if isinstance(error, GradaccError)
                          else f"Could not measure {model}: {one_line(error)}")

measurement = st.session_state.get(MEASUREMENT)
if measurement is None or (measurement["model"], measurement["max_seq_length"]) != wanted:
    st.info("Press **Measure** to measure this model at this sequence length under every lever setting (seconds "
            "for tiny-bert, longer for larger models; the first time also loads the training libraries).")
    st.stop()

settings = measurement["settings"]
st.subheader(f"{measurement['model']} at {measurement['max_seq_length']} tokens: {len(settings)} settings measured")
budget_column, target_column = st.columns(2)
with budget_column:
    budget_mb = inputs.number_field(K, "budget_mb", errors, whole=False, step=50.0, format="%.0f")
with target_column:
    target = inputs.number_field(K, "target_effective_batch", errors, step=16)
if errors.empty:  # nothing to plan for until both are typed
    errors.show({}, general)
    st.stop()

try:
    plan = planner.plan_levers(settings, budget_mb, target)
except GradaccError as error:
    errors.show({error.field or "config": error.message}, general)
    st.stop()
if plan["reason"]:
    errors.show({"budget_mb": plan["reason"]}, general)


def advice(row: dict) -> str:
    return (f"**{planner.setting_label(row)}**: m = {row['micro_batch_size']}, k = {row['grad_accum_steps']}, "
            f"predicted peak {units.format_bytes(row['predicted_peak_bytes'])}, "
            f"{row['seconds_per_example'] * 1000:,.2f} ms per example")


optimizer = train_form.train_config().optimizer  # the Train form's: the planner keeps it unless allowed
change_optimizer = st.checkbox(f"Let the planner change the optimizer (the Train form uses {optimizer})",
                               key=K + "change_optimizer", persist_state="session",
                               help="A lighter optimizer keeps less state, but it trains differently: it takes "
                                    "its own learning rate, measured for the model's recipe (a model with none "
                                    "measured is not offered another optimizer).")
plan_model = measurement["model"]
allowed = planner.allowed_rows(plan, optimizer, change_optimizer, model=plan_model)
fitting = [row for row in allowed if row["fits"]]
top = planner.pick(plan, optimizer, change_optimizer, model=plan_model)
chosen = None
# The data the run will train on (the Train form's), and its epochs: the form's for this model, else the recipe's.
run_config = train_form.train_config()
train_examples, _ = inputs.train_examples(run_config)  # a data error is the Train page's to show
run_epochs = run_config.epochs if run_config.model == plan_model else None


def steps_advice(row: dict) -> dict | None:
    """The optimizer steps ``row`` gives on the run's data and the epochs it needs (None: size unknown yet)."""
    if train_examples is None:
        return None
    return learning_steps.advise(plan_model, train_examples, row["micro_batch_size"], row["grad_accum_steps"],
                                 run_epochs, max_epochs=limits.max_epochs)


def steps_text(found: dict | None) -> str:
    return found["text"] if found else ("The optimizer steps are counted once the run loads its data (the Train "
                                        f"form's {run_config.dataset} has no size known before).")


if plan["rows"] and not fitting and not plan["reason"]:
    unrated = planner.unrated_optimizers(plan, optimizer, plan_model)
    if change_optimizer and unrated:
        instead = (f"{' and '.join(unrated)} would, but {plan_model}'s recipe has no learning rate measured for "
                   f"{'them' if len(unrated) > 1 else 'it'}: raise the budget")
    else:
        instead = "let the planner change the optimizer, or raise the budget" if not change_optimizer \
            else "raise the budget"
    errors.show({"budget_mb": f"Nothing with {optimizer} fits {field_label('budget_mb')} {budget_mb:g}: "
                              f"{instead}."}, general)
if top:
    pick_column, lightest_column = st.columns(2)
    pick_column.success(f"Pick: {advice(top['row'])}. {top['why']} {steps_text(steps_advice(top['row']))}")
    lightest = min(fitting, key=lambda row: row["least_bytes"])
    lightest_column.info("Least memory that fits: " + advice(lightest)
                         + f"; needs only {units.format_bytes(lightest['least_bytes'])} at m = 1")
    ordered = [top["row"], *(row for row in fitting if row is not top["row"])]
    labels = {planner.setting_label(row): row for row in ordered}
    chosen = labels[st.selectbox("Setting to use", list(labels), key=K + "setting",
                                 help="The pick first, then the others that fit, fastest first (time per example "
                                      "from a short timed run: differences of a few per cent are noise).")]
    m_metric, k_metric, effective_metric, peak_metric = st.columns(4)
    m_metric.metric("Micro-batch size (m)", chosen["micro_batch_size"])
    k_metric.metric("Accumulation steps (k)", chosen["grad_accum_steps"])
    effective_metric.metric("Effective batch", chosen["micro_batch_size"] * chosen["grad_accum_steps"])
    peak_metric.metric("Predicted peak", units.format_bytes(chosen["predicted_peak_bytes"]))
    chosen_steps = steps_advice(chosen)
    epochs_metric, steps_metric = st.columns(2)
    epochs_metric.metric("Epochs", chosen_steps["epochs"] if chosen_steps else "—",
                         help="The run's epochs, raised where they give fewer optimizer steps than the model needs "
                              "to learn; the Train page gets them.")
    steps_metric.metric("Optimizer steps", chosen_steps["steps"] if chosen_steps else "—",
                        help="ceil(ceil(N / m) / k) per epoch, times the epochs (N: the Train form's training "
                             "examples).")
    if chosen is not top["row"]:
        st.caption(steps_text(chosen_steps))
    if st.button("Use these settings on the Train page", key="use_plan"):
        levers = planner.levers_of(chosen)
        if shares_learning_rate(optimizer, levers["optimizer"]):
            del levers["optimizer"]  # the same rule (adamw-fused stays fused), and the form's learning rate
        # Another optimizer takes its own rate from the recipe (measured for this model: allowed_rows offers no other).
        train_form.carry_train_settings(limits, "Memory planner", model=measurement["model"],
                                        max_seq_length=measurement["max_seq_length"],
                                        micro_batch_size=chosen["micro_batch_size"],
                                        grad_accum_steps=chosen["grad_accum_steps"],
                                        memory_budget_mb=float(budget_mb), **levers,
                                        **({"epochs": chosen_steps["epochs"]} if chosen_steps else {}))
        st.switch_page("pages/train.py")

st.caption(f"Every setting, for a budget of {budget_mb:,.0f} MB and an effective batch of {target} (fastest first; "
           "a setting that does not fit even at m = 1 last):")
st.dataframe(pd.DataFrame([{
    "checkpointing": "on" if row["gradient_checkpointing"] else "off", "precision": row["precision"],
    "optimizer": row["optimizer"], "m": row["micro_batch_size"], "k": row["grad_accum_steps"],
    "predicted peak": units.format_bytes(row["predicted_peak_bytes"]) if row["fits"] else "does not fit",
    "static": units.format_bytes(row["static_bytes"]), "ms per example": round(row["seconds_per_example"] * 1000, 2)}
    for row in plan["rows"]]).astype({"m": "Int64", "k": "Int64"}), hide_index=True)  # whole numbers, or empty

# The breakdown, the chart and the held-out check of one setting: the chosen one, else the lightest.
shown = chosen or min(plan["rows"], key=lambda row: row["static_bytes"])
setting = planner.measurement_of(settings, shown)
static, fit = setting["static"], planner.ActivationFit(**setting["fit"])
st.subheader(planner.setting_label(shown))
parameters, gradients, optimizer_state, per_example = st.columns(4)
parameters.metric("Parameters", units.format_bytes(static["parameters"]))
gradients.metric("Gradients", units.format_bytes(static["gradients"]))
optimizer_state.metric("Optimizer state", units.format_bytes(static["optimizer_state"]))
per_example.metric("Activations per example", units.format_bytes(fit.bytes_per_example),
                   help=f"Fitted line: {units.format_bytes(fit.fixed_bytes)} + m × "
                        f"{units.format_bytes(fit.bytes_per_example)}")

check = planner.held_out_check(setting)
activations = {int(m): b for m, b in setting["activations"].items()}
fitted_on = {m: static["total"] + activations[m] for m in check["fitted_on"]}
st.plotly_chart(charts.memory_plan_figure(
    planner.predicted_peaks(static["total"], fit, planner.chart_sizes(shown["micro_batch_size"])), fitted_on,
    budget_bytes=budget_mb * planner.MB, held_out={check["size"]: static["total"] + check["measured"]}),
    key="plan_chart")
st.markdown(f"**Checked on a micro-batch it was not fitted on:** the line through micro-batches of "
            f"{', '.join(map(str, check['fitted_on']))} predicts {units.format_bytes(check['predicted'])} of activations "
            f"for {check['size']} examples; measured {units.format_bytes(check['measured'])}, an error of "
            f"**{check['error']:+.2%}** (largest over all settings {plan['largest_held_out_error']:.2%}). Every "
            "example is padded to the same length, so activations grow in proportion to m; a recommended m far above "
            f"{check['size']} is an extrapolation of that line.")
st.dataframe([{"micro-batch size": m, "measured": units.format_bytes(b), "predicted": units.format_bytes(fit.predict(m)),
               "error": f"{(fit.predict(m) - b) / b:+.2%}" if b else "—",
               "used for": "the fit" if m in check["fitted_on"] else "the check"} for m, b in activations.items()],
             hide_index=True)

# Several processes: what each rank holds, replicated (DDP) or sharded (FSDP) with each way to sync.
st.markdown(f"### {planner.setting_label(shown)} on several processes, per rank")
processes = st.selectbox(field_label("num_processes"), PLANNED_PROCESSES, key=K + "processes", persist_state="session",
                         help="Replicated (DDP), every rank holds the whole model, its gradients and optimizer state. "
                              "Sharded (FSDP), each holds 1/P of them, and its gradients depend on when they are "
                              "synced: per window, the whole model's for the window; per micro-batch, its shard.")
if processes > 1:
    try:
        spread = sharding.plan_processes(setting, budget_mb, target, processes)
    except GradaccError as error:
        errors.show({error.field or "config": error.message}, st.container())
    else:
        st.table(pd.DataFrame([{
            "way": WAY_NAMES[name], "m": way["micro_batch_size"], "k": way["grad_accum_steps"],
            "static per rank": units.format_bytes(way["static_bytes"]),
            "predicted peak per rank": units.format_bytes(way["peak_bytes"]) if way["fits"] else "does not fit",
            "gradients sent per window": units.format_bytes(way["sent_bytes"])}
            for name, way in spread["ways"].items()]).astype({"m": "Int64", "k": "Int64"}))
        st.info(spread["verdict"])
        st.caption("Sharded figures come from the formula that `python -m gradacc bench fsdp` checks on measured "
                   "runs (docs/fsdp.md); bytes sent are what a ring puts on the wire.")
