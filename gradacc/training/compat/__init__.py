"""Every use of another project's internals, one module per project: what gradacc reads or patches that the project
does not document as its API. Each name here is held to its contract by tests/training/test_compat.py, which fails
naming the project's version and the internal that moved; scripts/compat_newest.sh runs those tests and the audit's
against the newest releases on the package registry.

``accelerate`` (its process-wide state, a prepared scheduler's settings), ``transformers`` (Trainer's compute_loss
arguments), ``trl`` (what a replay of a TRL trainer's compute_loss changes, its trainer classes), ``torch`` (the LR
scheduler's mark on ``optimizer.step``, DDP's sync flag, FSDP2's per-parameter records), ``lightning`` (which
LightningModule hooks are looked up on the instance, and the optimizer wrapper ``self.optimizers()`` returns).
"""
