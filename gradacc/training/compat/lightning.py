"""Lightning's internals gradacc relies on (lightning 2.6): how it calls a LightningModule's hooks, in which order
around the optimizer step, and what ``self.optimizers()`` hands ``training_step``. Lightning documents the hooks,
not that they are looked up on the instance, nor its optimizer wrapper's copy of the optimizer's attributes."""

from __future__ import annotations

# The LightningModule's hooks the audit stands in for: Lightning calls each as getattr(module, name), so an instance
# attribute replaces the method for the module it is set on. on_before_optimizer_step runs after the callbacks' own,
# after AMP's unscale and before configure_gradient_clipping (Precision._after_closure).
INSTANCE_HOOKS = ("training_step", "on_before_optimizer_step")


def lightning_optimizers(pl_module) -> list:
    """The ``LightningOptimizer``s ``self.optimizers()`` hands ``training_step``: each holds its own copy of the torch
    optimizer's attributes (its ``__init__`` copies ``__dict__``), so a method patched on the torch optimizer
    instance is not seen through it and must be patched on these too."""
    wrapped = pl_module.optimizers(use_pl_optimizer=True)
    return list(wrapped) if isinstance(wrapped, (list, tuple)) else [wrapped]
