"""One cause for what the step's gradient is, in its own words, and the fix for this model's kind and this way of
training: the catalogue (docs/audit.md lists it). A fix that does not apply to the model is never offered: a
regression head gets a squared-error fix, a causal LM its loss type, a loss of the user's own words about it."""

from __future__ import annotations

from dataclasses import dataclass

from gradacc.training.audit import losses
from gradacc.training.audit.verdict import (CLIPPED, DIVIDED_TWICE, EXACT, K_TIMES, MISCOUNTED, OTHER_LOSS, SCALED,
                                            SHORT_WINDOW, WEIGHTED, ZEROED, Fit)
from gradacc.training.audit.vocabulary import ROUTER_LOSS_TERM, ROUTER_TERM, Integration, kind_words

# The compute_loss_func gradacc ships for each kind of head (gradacc.audit.<name>).
LOSS_FUNCS = {losses.CLASSIFICATION: "classifier_mean_loss", losses.TOKEN: "token_mean_loss",
              losses.REGRESSION: "regression_mean_loss", losses.MULTI_LABEL: "multi_label_mean_loss",
              losses.CAUSAL: "causal_lm_mean_loss"}
# The kinds whose items are examples: a fixed micro-batch holds as many each time.
PER_EXAMPLE = (losses.CLASSIFICATION, losses.REGRESSION, losses.MULTI_LABEL)
# A micro-batch's loss summed over its items, as a plain loop writes it, by kind.
SUMMED_LOSS = {
    losses.CLASSIFICATION: "F.cross_entropy(logits, labels, reduction='sum')",
    losses.TOKEN: "F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction='sum')",
    losses.CAUSAL: "F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, "
                   "reduction='sum')",
    losses.REGRESSION: "F.mse_loss(logits.squeeze(-1), labels, reduction='sum')",
    losses.MULTI_LABEL: "F.binary_cross_entropy_with_logits(logits, labels, reduction='sum')",
    losses.USER_LOSS: "the summed loss your loss_fn returns"}
# A plain loop's clipping: once per window, on the whole window's gradient.
CLIP_ONCE = "clip once per window: after the window's last backward, right before optimizer.step()"
# A trainer whose loss is a mean per micro-batch and that gets no num_items_in_batch (TRL's DPO): no setting weights a
# short micro-batch by its items; dropping it does.
SHORT_MICRO_BATCH = ("drop the short micro-batch: TrainingArguments(dataloader_drop_last=True), or a dataset whose "
                     "size is a multiple of per_device_train_batch_size (the trainer passes compute_loss no "
                     "num_items_in_batch, so no setting weights a micro-batch by its items)")


class WithRouterTerm(str):
    """A fix whose code adds an MoE model's router term itself, at its right weight: the router_loss check then points
    to it instead of naming a fix of its own. A ``str`` (the verdict's fix, its JSON) that says so by its type."""


# How a loop counts a micro-batch's items, by kind, in words.
ITEMS = {losses.CLASSIFICATION: "its labels other than -100", losses.TOKEN: "its labels other than -100",
         losses.REGRESSION: "its label values", losses.MULTI_LABEL: "its label values",
         losses.CAUSAL: "the tokens it predicts, (labels[:, 1:] != -100).sum()",
         losses.FUSED_CAUSAL: "the tokens it predicts, (labels[:, 1:] != -100).sum()"}


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the audit knows when it names the cause."""

    who: Integration
    kind: losses.LossKind | None
    k: int
    micro_batches: int
    num_processes: int
    fit: Fit
    weighted_fit: Fit | None      # against each micro-batch's mean counted equally (÷ the micro-batches)
    window_items: float
    counted_items: float | None   # what the loop divided the window's loss by (Trainer's num_items_in_batch)
    clips: tuple
    zero_grads: tuple             # micro-batch counts after which an effective zero_grad ran
    backwards: int | None         # Accelerate: accelerator.backward calls in the window
    # "compute_loss_func", "compute_loss" (a framework's own, replayed), "loss_fn", or the user's override of
    # Trainer's: "TheirTrainer.compute_loss" / "TheirTrainer.training_step"
    custom_loss: str | None = None
    loss_ratio: float | None = None   # an override's returned loss ÷ the model's mean loss (constant over the window)
    override: str | None = None       # the user's own Trainer method, "TheirTrainer.training_step" (or compute_loss)
    router_term: bool = False         # an MoE model's router loss is in the step: a loss from the logits must add it


def name(e: Evidence) -> tuple[str, str, str | None]:
    """(the cause, what it means, the fix) for the step's gradient before its final clipping."""
    fit, k, j = e.fit, e.k, e.micro_batches
    if e.zero_grads:
        return (ZEROED, f"zero_grad ran after micro-batch {', '.join(map(str, e.zero_grads))} of {j}: the step "
                        f"applies only the micro-batches after it", _fix_zero_grad(e))
    early = [c for c in e.clips if c.after_micro_batch < j and c.factor < 1]
    if early:
        return (CLIPPED, "clipping scaled the partial sum down inside the window ("
                + ", ".join(f"after micro-batch {c.after_micro_batch}: norm {c.norm_before:.3g} → {c.norm_after:.3g}"
                            for c in early) + f"), so the micro-batches count unequally ({fit.scale:.3g}× the "
                f"reference, residual {fit.residual:.2g})", _fix_clipping(e))
    if fit.plain_scale:
        return _plain_scale(e)
    weighted = e.weighted_fit
    if weighted is not None and weighted.plain_scale:
        times = (f", and {weighted.scale:.3g}× that: not divided by k" if k > 1 and weighted.near(k) else
                 "" if weighted.near(1) else f", {weighted.scale:.3g}× that")
        return (WEIGHTED, f"each micro-batch's mean loss counted equally ÷ {j}{times}, though they hold "
                          "different numbers of items; the window's mean loss weights each by its items "
                          f"(residual {fit.residual:.2g} against the reference, {weighted.residual:.2g} against "
                          "equal weights)", _fix_weighting(e))
    return (OTHER_LOSS, f"no scale of the window's mean {kind_words(e.kind)} loss (residual {fit.residual:.2g}, "
                        f"scale {fit.scale:.3g}) nor of equally weighted micro-batches", _fix_other(e))


def _plain_scale(e: Evidence) -> tuple[str, str, str | None]:
    fit, k, j, p = e.fit, e.k, e.micro_batches, e.num_processes
    s = f"{fit.scale:.4g}×"
    if fit.near(1):
        return EXACT, "the step applies the gradient of the window's mean loss", None
    large = k * p if e.who == Integration.TRAINER and p > 1 and fit.near(k * p) else k
    if k > 1 and fit.near(large) or k == 1 and e.who == Integration.TRAINER and p > 1 and fit.near(p):
        times = f"k·P = {k}·{p}" if large != k else f"k = {k}"
        return K_TIMES, f"{s} the window's mean-loss gradient ({times}): {_why_k_times(e)}", _fix_k_times(e)
    if e.counted_items and abs(e.counted_items - e.window_items) > 0.5 and fit.near(e.window_items / e.counted_items):
        return (MISCOUNTED, f"{s} the window's mean-loss gradient = {e.window_items:g} items ÷ "
                            f"{e.counted_items:g} counted: the loss was divided by num_items_in_batch = "
                            f"{e.counted_items:g}, but it sums over {e.window_items:g} items"
                + (" (a causal LM predicts from the second token; Trainer counts every label when the model's "
                   "loss_type does not name ForCausalLM)" if e.kind in (losses.CAUSAL, losses.FUSED_CAUSAL) else ""),
                _fix_miscount(e))
    if k > 1 and j < k and fit.near(j / k):
        return (SHORT_WINDOW, f"{s} the window's mean-loss gradient: a short window of {j} micro-batches divided "
                              f"by the configured k = {k}", _fix_short_window(e))
    if k > 1 and fit.near(1 / k):
        return DIVIDED_TWICE, f"{s} the window's mean-loss gradient: divided by k = {k} twice", _fix_twice(e)
    return (SCALED, f"{s} the window's mean-loss gradient (within ±{fit.tolerance:.1g}): as if the loss were "
                    f"divided by {1 / fit.scale:.4g}× the window's {e.window_items:g} items", _fix_scaled(e))


def overrides(custom_loss: str | None) -> bool:
    """Whether the loss code is the user's override of a Trainer method ("TheirTrainer.compute_loss")."""
    return bool(custom_loss) and "." in custom_loss


def _override_fix(e: Evidence) -> str:
    """The fix in the user's own override: the place in their code that decides the scale."""
    where = e.custom_loss
    if e.loss_ratio is not None and e.k > 1 and abs(e.loss_ratio - e.k) <= 1e-3 * e.k:
        return (f"remove the factor of k from {where}: it returns {e.k}× the model's mean loss, and Trainer divides "
                "by k itself")
    if where.endswith("training_step"):
        return f"return from {where} the loss compute_loss gives, on the scale Trainer gave it"
    if e.kind in (losses.CAUSAL, losses.FUSED_CAUSAL):
        return (f"in {where}, pass num_items_in_batch to the model, model(**inputs, "
                "num_items_in_batch=num_items_in_batch).loss: its loss then sums over the window's tokens (Trainer "
                "divides by k only for a model that does not take it)")
    return (f"in {where}, return the micro-batch's loss summed over its items ÷ num_items_in_batch (the argument "
            "Trainer passes it, counted over the whole window)")


def _why_k_times(e: Evidence) -> str:
    if e.who == Integration.LOOP:
        return "each micro-batch's mean loss was back-propagated as it is, and the window adds up k of them"
    if e.who == Integration.ACCELERATE:
        return ("the loss was back-propagated without Accelerate's ÷k (loss.backward())" if not e.backwards else
                "the loss handed to accelerator.backward was k× each micro-batch's mean")
    if overrides(e.custom_loss):
        return f"{e.custom_loss} returns {e.loss_ratio:.4g}× the model's mean loss per micro-batch"
    if e.custom_loss == "compute_loss_func":
        return "your compute_loss_func returns a mean per micro-batch, and Trainer leaves the ÷k to it"
    if e.custom_loss == "compute_loss":
        return "the trainer's compute_loss returns a mean per micro-batch, and Trainer did not divide it by k"
    return ("the model's forward takes **kwargs, so Trainer skips its own ÷k, but its loss ignores "
            "num_items_in_batch (transformers #47688)")


def _loss_func_fix(e: Evidence) -> str | None:
    """Trainer: the compute_loss_func for this kind, or words about the user's own loss."""
    if overrides(e.custom_loss):
        return _override_fix(e)
    if e.custom_loss == "compute_loss_func":
        return ("make your compute_loss_func return the loss summed over the micro-batch's items ÷ "
                "num_items_in_batch (Trainer counts it over the whole window)")
    if e.custom_loss == "compute_loss":
        return ("set loss_is_scaled_for_ga = False on your Trainer (it then divides each micro-batch's mean by the "
                "window's micro-batches), or return the summed loss ÷ num_items_in_batch from compute_loss")
    func = LOSS_FUNCS.get(e.kind)
    if func is None:
        return None
    fix = f"pass compute_loss_func=gradacc.audit.{func} to Trainer"
    if e.kind == losses.CAUSAL:
        fix += ' and set model.loss_type = "ForCausalLM" before building it (so it counts labels[..., 1:])'
    return fix


def _fix_k_times(e: Evidence) -> str | None:
    if e.who == Integration.LOOP:
        if e.kind in PER_EXAMPLE:  # equal micro-batches: ÷k is exact; a short last window still needs the items
            return ("divide each micro-batch's mean loss by k before backward(): (loss / k).backward(); on a short "
                    "last window, weight by items instead: " + _loop_items_fix(e))
        return _loop_items_fix(e)
    if e.who == Integration.ACCELERATE:
        return ("call accelerator.backward(loss), which divides by k, not loss.backward()" if not e.backwards else
                "pass each micro-batch's mean loss to accelerator.backward, as it is")
    return _loss_func_fix(e)


def _loop_items_fix(e: Evidence) -> str:
    """The plain loop's fix in its own lines: weight each micro-batch by its items."""
    items = "what your loss_fn counts" if e.kind == losses.USER_LOSS else ITEMS.get(e.kind, "its items")
    summed = SUMMED_LOSS.get(e.kind, "its loss with reduction='sum'")
    processes = ("; under DDP, all_reduce the count and multiply the loss by the world size (DDP averages the "
                 "ranks' gradients)" if e.num_processes > 1 else "")
    router = f" + {ROUTER_TERM.format(k=e.k)}" if e.router_term else ""
    fix = ("sum each micro-batch's loss over its items and divide by the window's items: before the window's first "
           f"backward, count window_items, the sum over its micro-batches of {items}{processes}; then per "
           f"micro-batch loss = {summed} / window_items{router}; loss.backward()")
    return WithRouterTerm(fix) if e.router_term else fix


def _fix_weighting(e: Evidence) -> str | None:
    if e.who == Integration.LOOP:
        return _loop_items_fix(e)
    if e.who == Integration.TRAINER and e.kind in (losses.DPO, losses.TRAINER_LOSS) and not overrides(e.custom_loss):
        return SHORT_MICRO_BATCH
    if e.who == Integration.TRAINER:
        return _loss_func_fix(e)
    items = ITEMS.get(e.kind, "its items")
    if e.router_term and e.kind in SUMMED_LOSS:
        # Rescaling the gradients at the step would rescale the router term too: the items are counted first, as
        # accelerate's examples/by_feature/gradient_accumulation_for_autoregressive_models.py counts them.
        return WithRouterTerm(
            "weight by items, this MoE model's router term apart: before the window's first backward, count "
            f"window_items, the sum over its micro-batches of {items} (accelerator.reduce it over processes); then "
            f"per micro-batch accelerator.backward({SUMMED_LOSS[e.kind]} / window_items * k * processes + "
            f"{ROUTER_LOSS_TERM})")
    return ("weight by items: back-propagate each micro-batch's loss summed over its items (reduction='sum'), count "
            f"the window's items ({items} per micro-batch; accelerator.reduce the count over processes), and when "
            "accelerator.sync_gradients multiply the gradients by k × processes ÷ the window's items before "
            "optimizer.step()")


def _fix_miscount(e: Evidence) -> str | None:
    if e.who == Integration.LOOP:
        return _loop_items_fix(e)
    if e.kind in (losses.CAUSAL, losses.FUSED_CAUSAL):
        return ('set model.loss_type = "ForCausalLM" on the transformers model before building the trainer '
                "(before get_peft_model with PEFT), so Trainer counts labels[..., 1:]")
    return f"divide the window's summed loss by its {e.window_items:g} items ({ITEMS.get(e.kind, 'its items')})"


def _fix_short_window(e: Evidence) -> str:
    if e.who == Integration.LOOP:
        return _loop_items_fix(e)
    if e.who == Integration.TRAINER:
        return "divide by the window's items (num_items_in_batch), not by k"
    return ("when a window ends early (the epoch's last), multiply its gradients by k ÷ its micro-batches before "
            "optimizer.step(), or weight by items (each micro-batch's summed loss ÷ the window's items × k)")


def _fix_twice(e: Evidence) -> str:
    if e.who == Integration.LOOP:
        return "divide the loss by k once, not twice"
    if e.override:
        return f"remove the ÷k from {e.override}: Trainer divides by k (or num_items_in_batch does)"
    return ("drop your own ÷k: accelerator.backward(loss) divides by k" if e.who == Integration.ACCELERATE else
            "do not divide the loss by k yourself: Trainer does (or num_items_in_batch does)")


def _fix_scaled(e: Evidence) -> str:
    if e.who == Integration.LOOP:
        return _loop_items_fix(e)
    if overrides(e.custom_loss):
        return _override_fix(e)
    return (f"divide the window's summed loss by its {e.window_items:g} items "
            f"({ITEMS.get(e.kind, 'its items')}), once per window")


def _fix_clipping(e: Evidence) -> str:
    if e.who == Integration.LOOP:
        return CLIP_ONCE
    if e.override:
        return (f"remove the clipping from {e.override} and let Trainer clip once per window "
                "(TrainingArguments(max_grad_norm=...))")
    return ("let Trainer clip once per window (TrainingArguments(max_grad_norm=...)) and remove the clipping from "
            "training_step" if e.who == Integration.TRAINER else
            "clip only when accelerator.sync_gradients, right before optimizer.step()")


def _fix_zero_grad(e: Evidence) -> str:
    if e.override:
        return f"remove zero_grad from {e.override}: Trainer zeroes the gradients after each optimizer step"
    if e.who == Integration.LOOP:
        return "call optimizer.zero_grad() right after optimizer.step() only, not before each micro-batch"
    return ("remove zero_grad from training_step: Trainer zeroes the gradients after each optimizer step"
            if e.who == Integration.TRAINER else
            "zero the gradients after optimizer.step() only (the prepared optimizer's zero_grad skips while "
            "accumulating; model.zero_grad() does not)")


def _fix_other(e: Evidence) -> str:
    if e.custom_loss == "loss_fn":
        return "check that loss_fn returns the mean loss over the batch's items the training loss uses"
    return ("if your objective is another loss on purpose, give the audit its per-batch mean (loss_fn=...); else "
            "compute the window's loss as the mean over its items: "
            + (_loss_func_fix(e) or "each item counted once") if e.who == Integration.TRAINER else
            "if your objective is another loss on purpose, give the audit its per-batch mean (loss_fn=...)")
