"""Audit: is Trainer's default right for a model? The stock-Trainer verdict (``gradacc audit --model``), its fix, and
the lines that audit one's own script. The audit trains in the background (gradacc.serving.audits)."""

import streamlit as st

from gradacc.app import audit_view, inputs, navigation, pacing, server
from gradacc.errors import GradaccError
from gradacc.serving import audits

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

K = f"{inputs.FORM}audit."

server.run_manager()  # warms the libraries up if this is the first page a visitor opens
runner = server.audit_runner()
limits = server.limits()

st.title("Is Trainer's default right for your model?")
st.markdown("A stock 🤗 `Trainer` (its defaults, the standard collator for the model's task: "
            "`DataCollatorWithPadding` for a classifier, `DataCollatorForLanguageModeling(mlm=False)` for a causal LM, "
            "labels the input ids as a user's run has them) trains one optimizer step of k micro-batches of the "
            "chosen data with gradacc's audit attached: it replays the window, computes "
            "the gradient of the window's mean loss, compares it with the gradient Trainer applies, and names the "
            "cause of any difference with its fix for this model.")

errors = inputs.FieldErrors()
model = inputs.model_input("audit", errors)
inputs.follow_recipe("audit", model, limits)  # tiny-gpt brings builtin-text, as on Train
dataset, text_column, label_column, data_problem = inputs.dataset_input("audit", errors, limits)
inputs.recipe_note("audit")
inputs.defaults({K + "micro_batch_size": 4, K + "grad_accum_steps": 4})
m_column, k_column = st.columns(2)
with m_column:
    micro_batch_size = inputs.number_field(K, "micro_batch_size", errors)
with k_column:
    grad_accum_steps = inputs.number_field(K, "grad_accum_steps", errors)

general = st.container()
config = None
try:
    if data_problem:
        raise GradaccError(data_problem, "dataset")
    config = audits.audit_config(model, dataset, text_column, label_column, micro_batch_size, grad_accum_steps)
except GradaccError as error:
    errors.show({error.field or "config": error.message}, general)

if st.button("Audit a stock Trainer", type="primary", key="run_audit", disabled=config is None,
             help="One optimizer step on this server's CPU: seconds for the built-in models."):
    runner.submit(config)
current = runner.get(config) if config is not None else None
pending = current is not None and not current.done


@st.fragment(run_every=pacing.POLL_SECONDS if pending else None)
def result():
    busy = ("waiting for its turn: it trains when no visitor's run is training"
            if audits.waits_for_a_run() else "training one step")
    audit = pacing.finished_job(runner, config, pending, "audit", busy=busy,
                                press="Press **Audit a stock Trainer** to see what Trainer's defaults do on this model.")
    if audit is None:
        return
    audit_view.draw(audit.report)


result()

st.subheader("Audit your own training")
audit_view.own_script()
st.caption("It watches the first optimizer step (k = 1 too), replays each micro-batch from the random state the run "
           "used, and leaves the run bit-identical to one without it. docs/audit.md lists every cause and fix.")
