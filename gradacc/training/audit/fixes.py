"""The fixes gradacc ships, as Trainer ``compute_loss_func``s: each sums its head's loss over the labelled items and
divides by ``num_items_in_batch``, which Trainer counts over the whole accumulation window (on all ranks). Each
micro-batch then counts by its items and the window's gradient is that of its mean loss, whatever k or the
window's length. One per kind of head, because the loss differs (transformers #47688: heads that ignore
``num_items_in_batch`` get k× the gradient under Trainer's defaults).

Without ``num_items_in_batch`` (evaluation) each returns the batch's own mean. Trainer does not apply its
``label_smoothing_factor`` to a ``compute_loss_func``: the cross-entropies take it as ``label_smoothing``
(``functools.partial(token_mean_loss, label_smoothing=0.1)``), defined as Trainer's.
"""

from __future__ import annotations

import torch.nn.functional as F

from gradacc.conventions import IGNORE_INDEX


def _logits(outputs):
    return (outputs["logits"] if isinstance(outputs, dict) else outputs.logits).float()


def _divided(total, count, num_items_in_batch):
    return total / (count if num_items_in_batch is None else num_items_in_batch)


def token_mean_loss(outputs, labels, num_items_in_batch=None, label_smoothing=0.0):
    """A classifier's or a token classifier's cross-entropy (labels line up with the logits, -100 ignored)."""
    logits = _logits(outputs)
    flat = labels.reshape(-1)
    total = F.cross_entropy(logits.reshape(flat.numel(), -1), flat, ignore_index=IGNORE_INDEX, reduction="sum",
                            label_smoothing=label_smoothing)
    return _divided(total, (flat != IGNORE_INDEX).sum(), num_items_in_batch)


def classifier_mean_loss(outputs, labels, num_items_in_batch=None, label_smoothing=0.0):
    """A sequence classifier's cross-entropy, one item per example: ``token_mean_loss`` under the name that fits the
    head (its items are examples, not tokens)."""
    return token_mean_loss(outputs, labels, num_items_in_batch, label_smoothing)


def regression_mean_loss(outputs, labels, num_items_in_batch=None):
    """A regression head's squared error (``num_labels=1`` or ``problem_type="regression"``)."""
    logits = _logits(outputs)
    values = logits.reshape(labels.shape) if logits.numel() == labels.numel() else logits
    return _divided(F.mse_loss(values, labels.float(), reduction="sum"), labels.numel(), num_items_in_batch)


def multi_label_mean_loss(outputs, labels, num_items_in_batch=None):
    """A multi-label head's binary cross-entropy, per (example, label): Trainer counts every label value."""
    total = F.binary_cross_entropy_with_logits(_logits(outputs), labels.float(), reduction="sum")
    return _divided(total, labels.numel(), num_items_in_batch)


def causal_lm_mean_loss(outputs, labels, num_items_in_batch=None, label_smoothing=0.0):
    """A causal LM's next-token cross-entropy (logits at t against labels at t + 1), for a model whose own loss
    ignores ``num_items_in_batch``; set ``model.loss_type = "ForCausalLM"`` too, so Trainer counts labels[..., 1:]."""
    logits = _logits(outputs)[..., :-1, :]
    target = labels[..., 1:]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX,
                            reduction="sum", label_smoothing=label_smoothing)
    return _divided(total, (target != IGNORE_INDEX).sum(), num_items_in_batch)
