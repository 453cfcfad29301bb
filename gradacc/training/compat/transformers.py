"""transformers' internals gradacc relies on (transformers 5.24): how Trainer calls ``compute_loss``."""

from __future__ import annotations

# Trainer.compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None): after model and inputs,
# num_items_in_batch is the second positional argument when a caller passes it by position.
NUM_ITEMS_POSITION = 1


def num_items_in_batch(args: tuple, kwargs: dict):
    """The ``num_items_in_batch`` a ``compute_loss`` call was given (after ``model, inputs``), or None."""
    if "num_items_in_batch" in kwargs:
        return kwargs["num_items_in_batch"]
    return args[NUM_ITEMS_POSITION] if len(args) > NUM_ITEMS_POSITION else None
