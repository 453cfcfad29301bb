"""Step arithmetic: examples per optimizer step, micro-batches and optimizer steps per epoch.

The one place these products and ceilings are computed; the engine, the pages and the planner read them here.
"""

from __future__ import annotations

import math


def effective_batch(micro_batch_size: int, grad_accum_steps: int, num_processes: int = 1) -> int:
    """Examples behind one optimizer step: the one place this product is computed."""
    return micro_batch_size * grad_accum_steps * num_processes


def micro_batches_per_epoch(num_examples: int, micro_batch_size: int, num_processes: int = 1) -> int:
    """Micro-batches one process sees in an epoch (the last may be short)."""
    per_process = math.ceil(num_examples / num_processes)
    return math.ceil(per_process / micro_batch_size)


def optimizer_steps_per_epoch(num_examples: int, micro_batch_size: int, grad_accum_steps: int,
                              num_processes: int = 1) -> int:
    """ceil(ceil(N/m)/k): the short last window is flushed as a real step."""
    return math.ceil(micro_batches_per_epoch(num_examples, micro_batch_size, num_processes) / grad_accum_steps)


def total_optimizer_steps(config, num_examples: int) -> int:
    """Optimizer steps of a whole run (``config``: a ValidConfig, its epochs filled in), ``max_steps`` included."""
    per_epoch = optimizer_steps_per_epoch(num_examples, config.micro_batch_size, config.grad_accum_steps,
                                          config.num_processes)
    total = per_epoch * config.epochs
    return min(total, config.max_steps) if config.max_steps else total
