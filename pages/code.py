"""Code: the training loop each backend really runs, read from gradacc's own source, settings filled in."""

import streamlit as st

from gradacc.app import codeview, inputs, navigation, server, train_form
from gradacc.training.backends import DESCRIPTIONS, MODULES
from gradacc.choices import LOSS_NORMALIZATIONS
from gradacc.config import RunConfig
from gradacc.errors import GradaccError

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

K = f"{inputs.FORM}code."

server.run_manager()
st.title("The code behind each backend")
st.caption("Not a sketch: this is the `train` function gradacc runs, read from its own source file when the page "
           "draws, so it cannot drift. The values of your settings are filled in where the loop reads them.")

# Start from the Train page's settings (RunConfig's defaults if the visitor has not been there).
train_config = train_form.train_config()
inputs.defaults({K + name: getattr(train_config, name)
             for name in ("backend", "micro_batch_size", "grad_accum_steps", "loss_normalization", "pitfalls")})
errors = inputs.FieldErrors()
backend, micro_batch_size, grad_accum_steps, (_, normalization_column) = inputs.accumulation_inputs(
    K, errors, [2, 1, 1, 2])
with normalization_column:
    loss_normalization = st.radio("Loss normalisation", LOSS_NORMALIZATIONS, key=K + "loss_normalization",
                                  persist_state="session", horizontal=True)

pitfalls = []
if backend == "pytorch":  # only the plain loop can be broken on purpose
    pitfalls = inputs.pitfall_input(K, "Break it on purpose: show the hooks these mistakes add",
                                help="Each is one real upstream mistake, added to the right loop as a hook: its "
                                     "wrong line is drawn in red, the loop's line it gets wrong outlined in green. "
                                     "A Train run with the same choice measures what it breaks.")

try:
    # The loop's other settings shown in the header: the Train form's epochs, learning rate and seed.
    config = RunConfig(backend=backend, micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                       loss_normalization=loss_normalization, epochs=train_config.epochs,
                       learning_rate=train_config.learning_rate, seed=train_config.seed,
                       pitfalls=pitfalls).check()
except GradaccError as error:
    errors.show(error.by_field, st.container())
    st.stop()

st.info(DESCRIPTIONS[backend])
module_name = MODULES[backend]
# Reading the source parses it, which waits while the libraries import (see gradacc.serving.warmup): say so.
with st.spinner("Waiting for the training libraries to finish importing…", show_time=True):
    docstring = codeview.module_docstring(module_name)
st.markdown(docstring)
code = codeview.backend_code(config)
roles = codeview.line_roles(code)
st.markdown("What accumulation adds to a training loop, highlighted: "
            + " · ".join(f"**{number}** {codeview.ROLE_TITLES[role]}" for number, role in codeview.ROLES.items())
            + ". Measuring and reporting (gradacc's instrumentation) is dimmed.")
right_rows = set()
if config.pitfalls:
    with st.container(border=True):
        st.markdown("**What “Break it on purpose” changes.** Not a line of the loop below: it stays the right one. "
                    "Each mistake is a hook gradacc adds to the loop's objects (its model, optimizer, scheduler, "
                    "window rule or loss log), from `gradacc/training/backends/pitfalls.py`.")
        for name in config.pitfalls:
            note, row = codeview.pitfall_note(code, name)
            right_rows |= {row} - {None}
            st.markdown(note)
            st.html(codeview.highlighted_html(codeview.pitfall_source(name), codeview.pitfall_roles(name)))
st.html(codeview.highlighted_html(code, roles, right_rows))
with st.expander("The same code as plain text, to copy"):
    st.code(code, language="python")
with st.expander("Helpers this loop calls"):
    for name, source in codeview.helpers(module_name):
        st.code(source, language="python")
