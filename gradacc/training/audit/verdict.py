"""The verdict: the applied gradient against the reference and what the difference means (k× too large, a short
window ÷ the configured k, items miscounted, ...), with the scheduler, clipping, sync and logged-loss checks, and the
fix in the user's terms."""

from __future__ import annotations

import json
import logging

from gradacc.training.audit.watch import Tally
from gradacc.training.gradients import gradient_sums

logger = logging.getLogger("gradacc.audit")

# Relative error counted as exact: float32 recomputation in another batch shape differs by ~1e-7.
EXACT = 1e-4
EXACT_MIXED_PRECISION = 2e-2
# How far a measured scale may be from k (or j/k) and still be named as that cause.
SCALE_TOLERANCE = 0.02


def judge(applied: dict, reference: dict, *, k: int, micro_batches: int, tolerance: float, who: str,
          num_processes: int = 1, applied_scale: float = 1.0, items: tuple | None = None) -> dict:
    """The relative error of ``applied`` against ``reference`` and what it means, with the fix in ``who``'s
    terms (``trainer`` or ``accelerate``).

    On P processes Trainer also multiplies each loss by P (to undo DDP's average, ``average_tokens_across_devices``),
    so a head that ignores ``num_items_in_batch`` comes out k·P× too large there. ``applied_scale``: what
    ``applied`` is multiplied by first (undoing the window's clipping). ``items``: (the window's items as the
    model's loss counts them, what Trainer counted as ``num_items_in_batch``)."""
    import math

    sums = gradient_sums(applied, reference, gradient_scale=applied_scale)
    error = math.sqrt(sums["difference"] / sums["reference"])  # equivalence.relative_error, from the same sums
    # The best scale s of the reference, and what no scale explains: ‖a − s·r‖ / ‖r‖, with
    # ‖a − s·r‖² = a·a − 2s·a·r + s²·r·r (resolves residuals well below the 2 % that names a cause).
    scale = sums["dot"] / sums["reference"]
    residual = math.sqrt(max(0.0, sums["own"] - 2 * scale * sums["dot"] + scale * scale * sums["reference"])
                         / sums["reference"])
    result = {"rel_error": error, "scale": scale, "residual": residual}

    def near(value: float) -> bool:
        return residual <= SCALE_TOLERANCE and abs(scale - value) <= SCALE_TOLERANCE * value

    if error <= tolerance:
        return {**result, "gradient": "exact", "meaning": "the gradient of the window's mean loss", "fix": None}
    too_large = k * num_processes if who == "trainer" and num_processes > 1 and near(k * num_processes) else k
    if k > 1 and near(too_large):
        times = f"k·P = {k}·{num_processes}" if too_large != k else "k"
        meaning = (f"{scale:.3g}× the gradient of the window's mean loss (relative error ≈ {times} − 1 = "
                   f"{too_large - 1})")
        if who == "trainer":
            meaning += ("; the model's forward takes **kwargs, so Trainer skips its own ÷k, but its loss head "
                        "ignores num_items_in_batch (transformers #47688)")
            fix = ("pass compute_loss_func=gradacc.audit.token_mean_loss to Trainer (it divides the summed loss by "
                   "num_items_in_batch, the window's items)")
        else:
            meaning += "; the loss was back-propagated without Accelerate's ÷k"
            fix = "call accelerator.backward(loss) (it divides by k), not loss.backward()"
        return {**result, "gradient": "k× too large", "meaning": meaning, "fix": fix}
    if who == "trainer" and items and items[1] and items[1] != items[0] and near(items[0] / items[1]):
        return {**result, "gradient": "items miscounted",
                "meaning": (f"{scale:.3g}× the gradient of the window's mean loss: Trainer divided by "
                            f"num_items_in_batch = {items[1]:g}, but the model's loss averages over {items[0]:g} "
                            "items (a causal LM predicts from the second token; Trainer counts every label when "
                            "the model's loss_type does not name ForCausalLM, as GPT2LMHeadModel's does not)"),
                "fix": ("set model.loss_type = \"ForCausalLM\" before building the Trainer, so it counts "
                        "labels[..., 1:]")}
    if k > 1 and micro_batches < k and near(micro_batches / k):
        return {**result, "gradient": "short window ÷ configured k",
                "meaning": (f"{scale:.3g}× the gradient of the window's mean loss: a short window of {micro_batches} "
                            f"micro-batches divided by the configured k={k}"),
                "fix": ("weight each micro-batch's mean loss by its items ÷ the window's items × k before "
                        "accelerator.backward (gradacc's exact weights), or drop the last partial window")}
    if k > 1 and near(1 / k):
        return {**result, "gradient": "k× too small",
                "meaning": f"{scale:.3g}× the gradient of the window's mean loss: divided by k twice",
                "fix": ("pass the micro-batch's plain mean loss to accelerator.backward (it divides by k itself)"
                        if who == "accelerate" else "do not divide the loss by k yourself: Trainer does")}
    if residual > SCALE_TOLERANCE:
        fix = ("pass compute_loss_func=gradacc.audit.token_mean_loss to Trainer" if who == "trainer" else
               "multiply each micro-batch's mean loss by its items ÷ the window's items × k before accelerator.backward")
        return {**result, "gradient": "weighted by micro-batch, not by item",
                "meaning": (f"not a plain scale of the window's mean-loss gradient (residual {residual:.2g}): "
                            "micro-batches holding different numbers of items (tokens) were weighted equally, "
                            "as a mean per micro-batch ÷ k does"),
                "fix": fix}
    return {**result, "gradient": "scaled", "meaning": f"{scale:.3g}× the gradient of the window's mean loss",
            "fix": "divide the window's summed loss by its number of items, once"}


def verdict(gradient: dict, tally: Tally, *, k: int, micro_batches: int, expected_scheduler_steps: int,
            clipping: bool, who: str, reference_loss: float | None = None, mode: str = "", reference_seconds: float = 0.0,
            seconds: float = 0.0) -> dict:
    """One report: the gradient's finding plus the scheduler, clipping, sync and logged-loss checks."""
    problems, checks = [], {}
    if gradient["gradient"] != "exact":
        problems.append(f"gradient {gradient['gradient']}")
    steps = tally.scheduler_steps
    # No step seen: no scheduler given to the audit (or none in the loop): nothing to judge.
    checks["scheduler"] = {"steps": steps, "expected": expected_scheduler_steps,
                           "ok": None if steps == 0 else steps == expected_scheduler_steps}
    if checks["scheduler"]["ok"] is False:
        problems.append(f"scheduler stepped {steps}× per optimizer step (expected {expected_scheduler_steps}): "
                        "the schedule runs that much too fast; "
                        + ("let Trainer step it (once per optimizer step), not training_step" if who == "trainer" else
                           "step it after optimizer.step() only when accelerator.sync_gradients (or prepare it "
                           "with accelerator.prepare)"))
    clips = len(tally.clipped_after)
    checks["clipping"] = {"micro_batches_clipped_after": sorted(tally.clipped_after), "ok": None}
    if clipping or clips:
        ok = set(tally.clipped_after) == {tally.backwards}
        checks["clipping"]["ok"] = ok
        if not ok:
            problems.append(f"clipping ran {clips}× in a window of {micro_batches} micro-batches (expected once, "
                            "after the last): "
                            + ("let Trainer clip (max_grad_norm), not training_step" if who == "trainer" else
                               "clip only when accelerator.sync_gradients, right before optimizer.step()"))
    if tally.synced_micro_batches is not None:
        ok = tally.synced_micro_batches <= 1
        checks["sync"] = {"synced_micro_batches": tally.synced_micro_batches, "ok": ok}
        if not ok:
            problems.append(f"gradients all-reduced in {tally.synced_micro_batches} of {micro_batches} micro-batches "
                            "(expected once per window): run the forward and backward inside "
                            "accelerator.accumulate(model)")
    if who == "trainer" and reference_loss:
        ratio = tally.logged_loss / reference_loss
        ok = abs(ratio - 1) <= 1e-3 * max(1, k)
        checks["logged_loss"] = {"logged": tally.logged_loss, "window_mean": reference_loss, "ratio": ratio, "ok": ok}
        if not ok:
            problems.append(f"logged loss {ratio:.3g}× the window's mean loss")
    report = {"who": who, "k": k, "micro_batches": micro_batches, **gradient,
              "checks": checks, "problems": problems, "ok": not problems, "reference": mode,
              "reference_seconds": reference_seconds, "audit_seconds": seconds}
    report["line"] = summary_line(report)
    return report


def summary_line(report: dict) -> str:
    if report["ok"]:
        checked = [name.replace("_", " ") for name, check in report["checks"].items() if check["ok"] is not None]
        return (f"gradacc audit: exact — the step applies the gradient of the window's mean loss (relative error "
                f"{report['rel_error']:.1e}, k={report['k']})"
                + (f"; {', '.join(checked)}: as they should" if checked else ""))
    line = f"gradacc audit: {'; '.join(report['problems'])}"
    if report["gradient"] != "exact":
        line += f" — relative error {report['rel_error']:.3g}: {report['meaning']}. Fix: {report['fix']}"
    return line


def publish(report: dict, json_path) -> None:
    logger.warning(report["line"])
    if json_path:
        with open(json_path, "w", encoding="utf-8") as file:
            json.dump(report, file, default=str)
