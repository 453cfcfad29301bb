"""What the Audit page shows of a verdict (``gradacc.audit.Verdict.as_dict``): the cause in words, its fix, the
numbers behind it, the window's other checks, and the lines that audit a visitor's own script."""

from __future__ import annotations

import streamlit as st

OWN_TRAINER = '''from gradacc.audit import audit_trainer

audit = audit_trainer(trainer)  # before trainer.train(): Trainer, SFTTrainer, DPOTrainer
trainer.train()
print(audit.verdict.line)       # the cause, and its fix for your model'''
OWN_ACCELERATE = '''from gradacc.audit import audit_accelerate

audit = audit_accelerate(accelerator, model, optimizer)  # one line before your loop
for batch in train_dataloader:                           # the loop, unchanged
    ...
print(audit.verdict.line)'''
OWN_LOOP = '''from gradacc.audit import audit_loop

audit = audit_loop(model, optimizer)  # one line before your loop: loss.backward() per micro-batch, step every k
for batch in loader:                  # the loop, unchanged
    ...
print(audit.verdict.line)'''
OWN_SCRIPT = '''pip install gradacc
gradacc audit --strict -- python train.py --your-args  # unchanged; exits 3 when wrong, 4 when nothing was judged'''


# Where the Audit page and the Equivalence page's family table seem to disagree: a causal LM whose items this stock
# Trainer miscounts, which the table, on gradacc's own batches, shows right. Both are measured; the first label of
# each text differs.
OTHER_PAGE = ("Why the Equivalence page's table by model family shows Trainer's default right for causal LMs: it "
              "trained on gradacc's own batches, where each text's first label is already -100, so Trainer's count "
              "of labels is the tokens the loss predicts. Here the batches are a stock Trainer's, from 🤗's "
              "DataCollatorForLanguageModeling, which keeps the first label; on this model Trainer counts it, one "
              "item per text too many.")
# The audit's words for a miscount and for a causal LM's loss (gradacc.training.audit.verdict.MISCOUNTED and
# losses.CAUSAL, written out: losses imports torch, and this page paints before torch loads).
MISCOUNTED, CAUSAL = "items miscounted", "causal LM"


def draw(verdict: dict) -> None:
    """The verdict: green when exact, red when something is wrong, yellow when it could not be judged."""
    if not verdict["judged"]:
        st.warning(f"Not judged: {verdict['meaning']}", icon="⚠️")
        return
    if verdict["ok"]:
        st.success(f"**Exact.** Trainer's defaults are right for this model: {verdict['meaning']}.", icon="✅")
    else:
        st.error(f"**{headline(verdict)}** {verdict['meaning']}.", icon="❌")
    if verdict["fix"]:
        st.markdown(f"**The fix:** {verdict['fix']}.")
    problems = [check for check in verdict["checks"] if check["ok"] is False and check["fix"]]
    for check in problems:
        st.markdown(f"**Also:** {check['detail']}. Fix: {check['fix']}.")
    if verdict["gradient"] == MISCOUNTED and (verdict["kind"] or "").startswith(CAUSAL):
        st.info(OTHER_PAGE, icon="⚖️")
    st.dataframe(numbers(verdict), hide_index=True, key="audit_numbers")
    st.markdown("\n".join(f"- {check['name'].replace('_', ' ').capitalize()}: {check['detail']}."
                          for check in verdict["checks"]))


def headline(verdict: dict) -> str:
    gradient = verdict["gradient"]
    return "Something else is wrong." if gradient == "exact" else f"The gradient is {gradient}:"


def numbers(verdict: dict) -> list[dict]:
    """The measurement behind the verdict, one row each: what was measured, and its value."""
    fit = verdict["fit"] or {}
    rows = [("model", verdict["model"]), ("the model's loss", verdict["kind"]),
            ("the window", f"{verdict['micro_batches']} micro-batches, k = {verdict['k']}, {verdict['precision']}"),
            ("step's gradient ÷ the window's mean-loss gradient (scale)",
             f"{fit.get('scale', float('nan')):.5g} ± {fit.get('se', float('nan')):.1g}"),
            ("what no scale explains (residual)", f"{fit.get('residual', float('nan')):.2g}"),
            ("relative error", f"{fit.get('rel_error', float('nan')):.3g}"),
            ("items per micro-batch", ", ".join(str(n) for n in verdict["items"])),
            ("items in the window", f"{verdict['window_items']:g}")]
    if verdict["counted_items"] is not None:
        rows.append(("items Trainer divided by (num_items_in_batch)", f"{verdict['counted_items']:g}"))
    return [{"what": what, "value": str(value)} for what, value in rows]


def own_script() -> None:
    """The lines that audit a visitor's own training, four ways."""
    st.markdown("Your own `Trainer` (TRL's trainers too):")
    st.code(OWN_TRAINER, language="python")
    st.markdown("Your own Accelerate loop:")
    st.code(OWN_ACCELERATE, language="python")
    st.markdown("Your own plain PyTorch loop:")
    st.code(OWN_LOOP, language="python")
    st.markdown("Or your script as it is, in CI:")
    st.code(OWN_SCRIPT, language="bash")
