"""Accumulation windows: which micro-batches share an optimizer step, and how each is weighted.

``naive``: each micro-batch's mean loss ÷ k — the textbook recipe. Wrong when a window is short (the
epoch's last) or when micro-batches hold different numbers of items (tokens).
``exact``: each micro-batch weighted by its share of the window's items, so the accumulated gradient is
exactly the gradient of the mean loss over the whole window.

With P processes a window is k micro-batches on every rank: k × P micro-batches in all, and DDP averages
the ranks' gradients, so ``exact`` weighs a micro-batch by its items over the items of the window on all
ranks, × P.
"""

from __future__ import annotations

import math

from gradacc.training.sources.data import item_count


def shard(num_examples: int, micro_batch_size: int, num_processes: int = 1) -> list[list[list[int]]]:
    """Each rank's micro-batches of an epoch, as example indices: ``shard(...)[rank][j]``.

    One process: consecutive micro-batches of m. P processes: global micro-batch i goes to rank i % P —
    the split Accelerate's prepared DataLoader (and so Trainer) makes, so the three backends train on the
    same micro-batches. Like Accelerate's default ``even_batches``, the last round is filled with examples
    from the start of the epoch, so every rank takes the same number of full micro-batches (a rank with
    one micro-batch fewer would wait forever for the others' all-reduce).
    """
    m, p = micro_batch_size, num_processes
    if p == 1:
        return [[list(range(start, min(start + m, num_examples))) for start in range(0, num_examples, m)]]
    per_rank = math.ceil(math.ceil(num_examples / m) / p)
    order = [i % num_examples for i in range(per_rank * p * m)]
    batches = [order[start:start + m] for start in range(0, len(order), m)]
    return [batches[r::p] for r in range(p)]


def batch_item_counts(examples: list[dict], micro_batches: list[list[int]]) -> list[int]:
    """Items (examples, or labelled tokens) in each micro-batch, in order."""
    return [sum(item_count(examples[i]) for i in batch) for batch in micro_batches]


def window_totals(rank_items: list[list[int]], grad_accum_steps: int) -> list[int]:
    """For each micro-batch of a rank, the items of its whole window summed over all ranks.

    ``rank_items[r]``: items of rank r's micro-batches (every rank has as many). The last window may be short.
    """
    totals = []
    for start in range(0, len(rank_items[0]), grad_accum_steps):
        window = sum(sum(items[start:start + grad_accum_steps]) for items in rank_items)
        totals.extend([window] * len(rank_items[0][start:start + grad_accum_steps]))
    return totals


class WindowRule:
    """Which micro-batch closes its window: its backward is the last before the optimizer step."""

    def __init__(self, grad_accum_steps: int):
        self.grad_accum_steps = grad_accum_steps

    def closes(self, index: int, num_micro_batches: int) -> bool:
        """Every k-th micro-batch of the epoch (``index`` from 0), and the epoch's last: a short last window steps
        too, or its examples never train."""
        return (index + 1) % self.grad_accum_steps == 0 or index + 1 == num_micro_batches


def loss_weight(normalization: str, batch_items: int, window_items: int, grad_accum_steps: int,
                num_processes: int = 1) -> float:
    """What a micro-batch's mean loss is multiplied by before backward().

    ``window_items`` counts the window on all ranks; × ``num_processes`` undoes DDP's average over ranks.
    """
    if normalization == "exact":
        return batch_items / window_items * num_processes
    return 1.0 / grad_accum_steps
