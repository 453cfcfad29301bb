"""Accumulation windows: which micro-batches share an optimizer step, and how each is weighted.

``naive``: each micro-batch's mean loss ÷ k — the textbook recipe. Wrong when a window is short (the
epoch's last) or when micro-batches hold different numbers of items (tokens).
``exact``: each micro-batch weighted by its share of the window's items, so the accumulated gradient is
exactly the gradient of the mean loss over the whole window.
"""

from __future__ import annotations

from gradacc.data import item_count


def batch_item_counts(examples: list[dict], micro_batch_size: int) -> list[int]:
    """Items (examples, or labelled tokens) in each micro-batch of an epoch, in order."""
    return [sum(item_count(e) for e in examples[start:start + micro_batch_size])
            for start in range(0, len(examples), micro_batch_size)]


def window_totals(batch_items: list[int], grad_accum_steps: int) -> list[int]:
    """For each micro-batch, the items of the whole window it belongs to (the last window may be short)."""
    totals = []
    for start in range(0, len(batch_items), grad_accum_steps):
        window = batch_items[start:start + grad_accum_steps]
        totals.extend([sum(window)] * len(window))
    return totals


def loss_weight(normalization: str, batch_items: int, window_items: int, grad_accum_steps: int) -> float:
    """What a micro-batch's mean loss is multiplied by before backward()."""
    if normalization == "exact":
        return batch_items / window_items
    return 1.0 / grad_accum_steps
