"""Audit your own accumulation::

    from gradacc.audit import AuditCallback, audit_accelerate, audit_loop, audit_trainer

    audit = audit_trainer(trainer)                          # before trainer.train() (TRL's trainers too)
    audit = audit_accelerate(accelerator, model, optimizer)  # one line before your Accelerate loop
    audit = audit_loop(model, optimizer)                    # one line before your plain PyTorch loop
    lightning.Trainer(accumulate_grad_batches=k, callbacks=[audit := AuditCallback()])  # gradacc[lightning]
    ...
    print(audit.verdict.line)                               # after the first optimizer step

``audit_loop(model, optimizer, loss_fn=...)``: ``loss_fn(model, batch) -> (summed loss, items)`` for a model whose
loss is not a 🤗 head's from labels (nanoGPT's ``model(x, y)``).

``audit.verdict`` is a ``Verdict``: ``gradient`` (the cause, a ``Cause``: "exact", "k_times_too_large", ...; the line
says it in words), ``meaning``, ``fix``, ``fit`` (scale, residual, its standard error, relative error), ``checks``
(clipping, scheduler, logged loss), ``ok``, ``line`` and ``as_dict()``. The fixes it names for Trainer:
``classifier_mean_loss`` (sequence classifiers), ``token_mean_loss`` (token classifiers), ``regression_mean_loss``,
``multi_label_mean_loss``, ``causal_lm_mean_loss``: ``compute_loss_func``s that divide the summed loss by
``num_items_in_batch`` (transformers #47688).

docs/audit.md is the guide; ``gradacc.training.audit`` the how. Importing this module imports neither torch nor
transformers: they load when a name is first used.
"""

from __future__ import annotations

import importlib

_HOMES = {"audit_trainer": "trainer_audit", "AccumulationAudit": "trainer_audit",
          "audit_accelerate": "accelerate_audit", "AccelerateAudit": "accelerate_audit",
          "audit_loop": "loop_audit", "LoopAudit": "loop_audit", "AuditCallback": "lightning_audit",
          "token_mean_loss": "fixes", "classifier_mean_loss": "fixes", "regression_mean_loss": "fixes",
          "multi_label_mean_loss": "fixes", "causal_lm_mean_loss": "fixes", "Verdict": "verdict"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'gradacc.audit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gradacc.training.audit.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
