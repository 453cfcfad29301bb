"""Equivalence: is the accumulated gradient the full-batch gradient? Naive vs exact, three cases."""

import streamlit as st

from gradacc.analysis import grpo_scale
from gradacc.app import charts, coupled_view, equivalence_view, inputs, navigation, pacing, server
from gradacc.training.backends import DESCRIPTIONS
from gradacc.errors import GradaccError
from gradacc.serving import checks

navigation.under_navigation()  # a page opened alone on a fresh server: run the app instead

K = f"{inputs.FORM}equivalence."
GRPO_CASE = grpo_scale.GRPOCase()

server.run_manager()  # warms the libraries up if this is the first page a visitor opens
runner = server.check_runner()

st.title("Is accumulation the full-batch gradient?")
st.markdown("One accumulation window, trained one optimizer step with the chosen backend; the gradient just "
            "before `optimizer.step()` is compared with the gradient of the mean loss over the whole window in "
            "one batch: relative error = ‖g_accumulated − g_full‖ / ‖g_full‖ (tiny-bert, dropout off, "
            "no clipping). Four windows: **equal windows** (m × k examples), a **short last window** (the end of "
            "an epoch), a **token-level loss** (micro-batches hold different numbers of tokens) and a **language "
            "model** (tiny-gpt's next-token loss on texts of very uneven lengths: the October 2024 accumulation "
            "bug).")

inputs.defaults({K + "backend": "pytorch", K + "micro_batch_size": 4, K + "grad_accum_steps": 4})
errors = inputs.FieldErrors()
backend, micro_batch_size, grad_accum_steps, (backend_column,) = inputs.accumulation_inputs(K, errors, [2, 1, 1])
backend_column.caption(DESCRIPTIONS[backend])

general = st.container()
try:
    config = checks.check_config(backend, micro_batch_size, grad_accum_steps)
except GradaccError as error:
    config = None
    errors.show(error.by_field, general)  # a bad m and a bad k: both, each under its field

if st.button("Run the check", type="primary", key="run_check", disabled=config is None,
             help="Seconds with PyTorch or Accelerate; Trainer's setup makes it about half a minute."):
    runner.submit(config)
current = runner.get(config) if config is not None else None
pending = current is not None and not current.done


@st.fragment(run_every=pacing.POLL_SECONDS if pending else None)
def result():
    check = pacing.finished_job(runner, config, pending, "check", busy="running",
                                press="Press **Run the check** to measure these settings.")
    if check is None:
        return
    report = check.report
    for sentence in equivalence_view.explanation(report):
        st.markdown(f"- {sentence}")
    st.plotly_chart(charts.equivalence_figure(equivalence_view.rows(report)), key="equivalence_chart")
    st.dataframe(equivalence_view.table(report), hide_index=True,
                 column_config={name: st.column_config.NumberColumn(format="%.2e")
                                for name in ("naive", "exact", "Trainer library default")})


result()

st.subheader("Trainer's default, by model family")
family_caption, family_rows = equivalence_view.family_table()
st.caption(family_caption)
st.dataframe(family_rows, hide_index=True, key="family_table",
             column_config={**{name: st.column_config.NumberColumn(format="%.2e")
                               for name in ("exact", "naive", "Trainer library default")},
                            equivalence_view.AUDIT_COLUMN: st.column_config.TextColumn(
                                help=equivalence_view.AUDIT_HELP)})

st.header("GRPO: a loss type whose scale moves with k")
st.markdown("TRL's `GRPOTrainer` normalises its loss by `loss_type`. `dapo` (its default) is documented as the "
            "window's token sum ÷ the window's token count, but one generation of `steps_per_generation` "
            "micro-batches feeds `steps_per_generation ÷ k` optimizer steps, each divided by the generation's token "
            "count × k / `steps_per_generation`. The check trains the bench's tiny Qwen2 one generation at "
            f"`steps_per_generation = {GRPO_CASE.steps_per_generation}` for k = "
            f"{', '.join(map(str, GRPO_CASE.ks))}, and projects each step's gradient on the gradient of its window's "
            "documented objective (a float64 replay from the stored completions); gradacc's audit gives its verdict "
            "on the first step.")
grpo_runner = server.grpo_runner()
grpo_pending = (grpo_runner.get(GRPO_CASE) is not None and not grpo_runner.get(GRPO_CASE).done)
if st.button("Run the GRPO check", key="run_grpo_check", disabled=grpo_pending,
             help="Seven optimizer steps of TRL's GRPOTrainer on a tiny model: about half a minute on 2 vCPUs."):
    grpo_runner.submit(GRPO_CASE)
    grpo_pending = True


@st.fragment(run_every=pacing.POLL_SECONDS if grpo_pending else None)
def grpo_result():
    check = pacing.finished_job(grpo_runner, GRPO_CASE, grpo_pending, "GRPO check", busy="running",
                                press="Press **Run the GRPO check** to measure dapo's scale at each k.")
    if check is None:
        return
    st.markdown(f"**{grpo_scale.headline(check.report)}**")
    st.dataframe(grpo_scale.table(check.report), hide_index=True, key="grpo_table",
                 column_config={"scale": st.column_config.NumberColumn(format="%.4f"),
                                "residual": st.column_config.NumberColumn(format="%.1e")})


grpo_result()

st.header("When accumulation is *not* a big batch")
st.markdown("Everything above assumes a loss that is a sum over examples. Two common losses couple the examples of "
            "a batch, and then no weighting makes k micro-batches of m the batch of m × k:\n\n"
            "- **In-batch negatives** (sentence-transformers' `MultipleNegativesRankingLoss`, CLIP): each query is "
            "scored against every positive of its batch. all-MiniLM-L6-v2 at effective batch 64: one batch gives "
            "each query 63 negatives, 16 accumulated 4 times give 15. `CachedMultipleNegativesRankingLoss` "
            "(GradCache) computes the batch-64 loss with the activations of mini-batches of 16 (`gradacc train "
            "--task contrastive --gradcache-mini-batch 16`).\n"
            "- **BatchNorm** normalises with the micro-batch's mean and variance (bow-batchnorm); LayerNorm, per "
            "example, does not couple them (bow-layernorm).")
coupled_checking = coupled_view.pending(runner)
if st.button("Run the coupled checks", key="run_coupled_checks", disabled=coupled_checking,
             help="all-MiniLM-L6-v2 three ways, then the two norms: about half a minute on 2 vCPUs."):
    coupled_view.submit(runner)
    coupled_checking = True


@st.fragment(run_every=pacing.POLL_SECONDS if coupled_checking else None)
def coupled_result():
    if coupled_checking and not coupled_view.pending(runner):
        st.rerun()  # just finished: redraw once without polling
    coupled_view.draw(runner, None, key="equivalence")


coupled_result()
