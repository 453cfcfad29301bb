"""Audit a user's own accumulation: their ``Trainer`` (a callback) or their ``accelerator.accumulate`` loop.

On the run's first optimizer step with k > 1 the audit recomputes, on the same micro-batches and the same
weights, the gradient of the window's mean loss over its items (``reference``) and compares it with the
gradient the run accumulated and is about to apply:

    relative error = ‖g_run − g_reference‖ / ‖g_reference‖   (training.gradients, as the equivalence check)

and says what the error means: ≈ k − 1 is a k× gradient (a head that ignores ``num_items_in_batch``,
transformers #47688), a plain scale j/k a short window divided by the configured k, a residual that is no
scale at all micro-batches weighted equally instead of by their items. It also counts, over that window,
the learning-rate scheduler's steps (accelerate #963), the clipping calls, DDP's gradient syncs, and (for
Trainer) compares the loss Trainer logs with the window's mean loss.

The reference costs one forward+backward of one window, once: in one pass over the whole window when no
dropout is active (falling back to one pass per micro-batch when that runs out of memory), else one pass
per micro-batch replayed from the window's random state, so the dropout masks are the run's own and the
comparison stays exact. Gradients, buffers and every random state are put back before the run goes on:
the user's run continues bit-identical to a run without the audit. The gradient about to be applied is read in
place right before the optimizer step (no copy); clipping that ran after the window's last micro-batch is undone
by the factor it scaled by, so the comparison is with the accumulated gradient itself.

Laid out by idea: ``reference`` (the recomputed gradient), ``watch`` (what the window did, counted), ``verdict``
(what the difference means), ``trainer_audit`` and ``accelerate_audit`` (the two ways in). ``gradacc.audit`` is
the public face of this package (importable without torch).
"""

from gradacc.training.audit.accelerate_audit import AccelerateAudit, audit_accelerate
from gradacc.training.audit.trainer_audit import accumulation_audit_class, audit_stock_trainer, token_mean_loss

__all__ = ["AccelerateAudit", "accumulation_audit_class", "audit_accelerate", "audit_stock_trainer",
           "token_mean_loss"]
