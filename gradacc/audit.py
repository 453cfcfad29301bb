"""Audit your own accumulation: ``from gradacc.audit import AccumulationAudit, audit_accelerate, token_mean_loss``.

- ``trainer.add_callback(AccumulationAudit())``: a ``TrainerCallback`` for your own ``Trainer``;
- ``with audit_accelerate(accelerator, model, optimizer, batches, loss_fn, lr_scheduler) as audit:`` around the
  first window of your own ``accelerator.accumulate`` loop;
- ``token_mean_loss``: a ``compute_loss_func`` that divides by ``num_items_in_batch`` (transformers #47688).

What they check and how: ``gradacc.training.audit``. This module imports torch and transformers only when one
of these names is first used.
"""

from __future__ import annotations

__all__ = ["AccumulationAudit", "audit_accelerate", "token_mean_loss", "AccelerateAudit"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'gradacc.audit' has no attribute {name!r}")
    from gradacc.training import audit

    value = audit.accumulation_audit_class() if name == "AccumulationAudit" else getattr(audit, name)
    globals()[name] = value  # built once
    return value
