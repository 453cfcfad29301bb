"""What the audited window did, counted as it ran: backwards, clipping (after which micro-batch, by what factor),
scheduler steps; and the instance patches that count them, each put back as it was."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class Tally:
    """What the audited window did, counted as it ran."""

    backwards: int = 0                                   # micro-batches back-propagated so far
    clipped_after: dict = field(default_factory=dict)    # micro-batch count after which clipping ran → its factor
    scheduler_steps: int = 0
    synced_micro_batches: int | None = None              # DDP: micro-batches whose backward all-reduced
    logged_loss: float = 0.0                             # Trainer: what it adds to the loss it logs


@contextlib.contextmanager
def counting_clips(counter: Tally):
    """Gradient clipping counted by the micro-batch it ran after, with the factor it scaled the gradients by:
    ``torch.nn.utils.clip_grad_norm_`` (a loop's own) and ``clip_grads_with_norm_`` (what Accelerate's, and so
    Trainer's, clipping calls). A call with an infinite norm only measures and is not counted."""
    import math

    import torch.nn.utils as utils

    originals = {name: getattr(utils, name) for name in ("clip_grad_norm_", "clip_grads_with_norm_")}

    def counted(name, original):
        def clip(parameters, max_norm, *args, **kwargs):
            result = original(parameters, max_norm, *args, **kwargs)
            if math.isfinite(float(max_norm)):
                # clip_grad_norm_ returns the norm; clip_grads_with_norm_(parameters, max_norm, total_norm) is given it.
                total = result if name == "clip_grad_norm_" else (args[0] if args else kwargs["total_norm"])
                # torch's own factor: max_norm / (norm + 1e-6), at most 1
                counter.clipped_after[counter.backwards] = min(1.0, float(max_norm) / (float(total) + 1e-6))
            return result

        return clip

    for name, original in originals.items():
        setattr(utils, name, counted(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(utils, name, original)


def unclipped(tally: Tally) -> float:
    """What undoes the clipping that ran after the window's last micro-batch: the gradient applied ÷ its factor is
    the gradient accumulated. Clipping of partial sums (earlier micro-batches) is left in: it changed the sum."""
    return 1.0 / tally.clipped_after.get(tally.backwards, 1.0)


def patch(owner, name: str, replacement):
    """Set ``owner.name`` on the instance for the audited window; returns what puts it back as it was (the
    class's method, or an instance attribute the user had set)."""
    missing = object()
    before = owner.__dict__.get(name, missing)
    setattr(owner, name, replacement)

    def restore():
        if before is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, before)

    return restore
