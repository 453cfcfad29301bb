"""Memory planner: measure a model once, then pick the micro-batch that fits a budget and the k for a target."""

import streamlit as st

from gradacc.analysis import planner
from gradacc.app import charts, widgets as ui
from gradacc.config import RunConfig
from gradacc.errors import GradaccError, one_line

K = f"{ui.FORM}planner."

ui.run_manager()
limits = ui.limits()

st.title("Memory planner")
st.markdown("Training memory = **static** (parameters + gradients + AdamW state) + **activations** of one "
            "micro-batch (what autograd keeps for backward). Accumulation steps k do not add memory; only the "
            "micro-batch m does. The planner measures the model once, fits activations(m) as a line, and picks "
            "m and k for your budget and target effective batch.")


@st.cache_data(show_spinner=False, max_entries=16)
def measured(model: str, max_seq_length: int) -> planner.Measurement:
    return planner.measure(model, max_seq_length)


ui.defaults({K + "max_seq_length": 64, K + "budget_mb": 100.0, K + "target_effective_batch": 256})
errors = ui.FieldErrors()
model_column, length_column = st.columns([2, 1])
with model_column:
    model = ui.model_input("planner", errors)
with length_column:
    max_seq_length = ui.number_field(K, "max_seq_length", errors, step=16,
                                     help="Every example is padded to this length: the worst case of a batch.")

general = st.container()
try:
    limits.check(RunConfig(model=model, max_seq_length=max_seq_length).validate())
    measurable = True
except GradaccError as error:
    measurable = False
    errors.show({error.field or "config": error.message}, general)

wanted = (model, max_seq_length)
if st.button("Measure", type="primary", key="measure", disabled=not measurable,
             help="Loads the model and runs forward passes with micro-batches of 1, 2, 4 and 8."):
    with st.spinner(f"Measuring {model} at {max_seq_length} tokens…"):
        try:
            st.session_state["planner.measurement"] = measured(model, max_seq_length)
        except GradaccError as error:
            general.error(error.message)
        except Exception as error:  # noqa: BLE001 - a demo shows one line, never a traceback
            general.error(f"Could not measure {model}: {one_line(error)}")

measurement = st.session_state.get("planner.measurement")
if measurement is None or (measurement.model, measurement.max_seq_length) != wanted:
    st.info("Press **Measure** to measure this model at this sequence length (a few seconds; the first time also "
            "loads the training libraries).")
    st.stop()

fit = measurement.fit
static = measurement.static
st.subheader(f"{measurement.model} at {measurement.max_seq_length} tokens")
parameters, gradients, optimizer_state, per_example = st.columns(4)
parameters.metric("Parameters", ui.format_bytes(static["parameters"]))
gradients.metric("Gradients", ui.format_bytes(static["gradients"]))
optimizer_state.metric("Optimizer state", ui.format_bytes(static["optimizer_state"]))
per_example.metric("Activations per example", ui.format_bytes(fit.bytes_per_example),
                   help=f"Fitted line: {ui.format_bytes(fit.fixed_bytes)} + m × "
                        f"{ui.format_bytes(fit.bytes_per_example)}")

budget_column, target_column = st.columns(2)
with budget_column:
    budget_mb = st.number_input("Memory budget (MB)", step=50.0, format="%.0f", key=K + "budget_mb",
                                persist_state="session")
    errors.slot("budget_mb")
with target_column:
    target = ui.number_field(K, "target_effective_batch", errors, step=16)

try:
    plan = planner.recommend(static["total"], fit, budget_mb * planner.MB, target)
except GradaccError as error:
    plan = None
    errors.show({error.field or "config": error.message}, general)

if plan is not None:
    m_metric, k_metric, effective_metric, peak_metric = st.columns(4)
    m_metric.metric("Micro-batch size (m)", plan.micro_batch_size)
    k_metric.metric("Accumulation steps (k)", plan.grad_accum_steps)
    effective_metric.metric("Effective batch", plan.effective_batch)
    peak_metric.metric("Predicted peak", ui.format_bytes(plan.peak_bytes))
    st.success(f"Largest micro-batch that fits {budget_mb:,.0f} MB: {plan.largest_fitting_micro_batch}. "
               f"Use m = {plan.micro_batch_size} with k = {plan.grad_accum_steps} to reach an effective batch of "
               f"{plan.effective_batch} in {plan.grad_accum_steps} micro-batch(es) per optimizer step.")
    if st.button("Use these settings on the Train page", key="use_plan"):
        ui.suggest_train_settings(micro_batch_size=plan.micro_batch_size, grad_accum_steps=plan.grad_accum_steps,
                                  max_seq_length=measurement.max_seq_length, model=measurement.model)
        st.switch_page("pages/train.py")

sizes = planner.chart_sizes(plan)
activation_points = measurement.activations
st.plotly_chart(charts.memory_plan_figure(planner.predicted_peaks(static["total"], fit, sizes),
                                          {m: static["total"] + b for m, b in activation_points.items()},
                                          budget_bytes=budget_mb * planner.MB), key="plan_chart")
st.caption("Predicted vs measured activation bytes of one micro-batch:")
st.dataframe([{"micro-batch size": m, "measured": ui.format_bytes(b), "predicted": ui.format_bytes(fit.predict(m)),
               "error": f"{(fit.predict(m) - b) / b:+.1%}" if b else "—"} for m, b in activation_points.items()],
             hide_index=True)
