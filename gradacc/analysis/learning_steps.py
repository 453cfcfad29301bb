"""How many optimizer steps a planned setting gives on the run's data, and the epochs its model needs to learn.

The memory planner picks m and k for a target effective batch; the larger that batch, the fewer optimizer steps an
epoch holds (2,000 examples at 256 a step: 8), and a run of too few steps ends on one label for every example. Each
built-in classifier's recipe holds the fewest steps from which it learnt (measured by ``python -m gradacc bench
learning-steps``); ``advise`` counts the steps with gradacc.steps and proposes the epochs, or a smaller target.
"""

from __future__ import annotations

import math

from gradacc.recipes import recipe_for, recipe_named
from gradacc.steps import effective_batch, optimizer_steps_per_epoch


def advise(model: str, train_examples: int, micro_batch_size: int, grad_accum_steps: int,
           epochs: int | None = None, *, num_processes: int = 1, max_epochs: int | None = None) -> dict:
    """How many optimizer steps a setting gives on ``train_examples``, and the epochs it needs to learn.

    A large effective batch leaves few optimizer steps in an epoch, and a model trained for too few ends on one label
    for every example. ``model``'s recipe holds the fewest steps from which it learnt on every seed tried, at its
    learning rate (``Recipe.min_optimizer_steps``, ``python -m gradacc bench learning-steps``). ``epochs``: the run's
    (None: the recipe's). Returns the counts, ``epochs`` (the run's, raised to give the minimum, at most
    ``max_epochs``), ``steps`` at those epochs, ``enough`` (None where no minimum was measured),
    ``smaller_target``: the largest power-of-two effective batch that gives the minimum at the run's own epochs
    (None when they already do), and ``text``, one or two sentences for the page and the CLI."""
    recipe = recipe_for(model)
    asked = epochs or recipe.epochs
    per_epoch = optimizer_steps_per_epoch(train_examples, micro_batch_size, grad_accum_steps, num_processes)
    minimum = recipe.min_optimizer_steps
    needed = asked if minimum is None else max(asked, math.ceil(minimum / per_epoch))
    proposed = min(needed, max_epochs) if max_epochs else needed
    target = effective_batch(micro_batch_size, grad_accum_steps, num_processes)
    found = {"train_examples": train_examples, "effective_batch": target, "steps_per_epoch": per_epoch,
             "asked_epochs": asked, "asked_steps": per_epoch * asked, "min_steps": minimum, "epochs": proposed,
             "steps": per_epoch * proposed, "enough": None if minimum is None else per_epoch * proposed >= minimum,
             "smaller_target": None}
    if minimum is not None and per_epoch * asked < minimum:
        found["smaller_target"] = _smaller_target(train_examples, target, asked, minimum, num_processes)
    found["text"] = _steps_text(model, found, asked == recipe.epochs, max_epochs)
    return found


def _smaller_target(train_examples: int, target: int, epochs: int, minimum: int, num_processes: int) -> int | None:
    """The largest effective batch below ``target``, a power of two per process, whose ``epochs`` give ``minimum``
    optimizer steps (counted at one micro-batch a step: accumulation never adds steps); None when none does."""
    per_process = 1 << max(0, (target // num_processes).bit_length() - 1)
    while per_process >= 1:
        steps = optimizer_steps_per_epoch(train_examples, per_process, 1, num_processes) * epochs
        if per_process * num_processes < target and steps >= minimum:
            return per_process * num_processes
        per_process //= 2
    return None


def _steps_text(model: str, found: dict, recipe_epochs: bool, max_epochs: int | None) -> str:
    asked, epochs = found["asked_epochs"], found["epochs"]
    counts = (f"{found['train_examples']:,} training examples at {found['effective_batch']:,} a step: "
              f"{found['steps_per_epoch']:,} optimizer step{'s' if found['steps_per_epoch'] != 1 else ''} an epoch, "
              f"{found['asked_steps']:,} in the {_epochs(asked)} of "
              f"{recipe_named(model) if recipe_epochs else 'the run'}")
    minimum = found["min_steps"]
    if minimum is None:
        return (f"{counts}. No minimum of optimizer steps is measured for {model} (python -m gradacc bench "
                "learning-steps measures the built-in classifiers).")
    learns = f"{model} learns from {minimum:,} steps at its recipe's learning rate (measured)"
    if found["asked_steps"] >= minimum:
        return f"{counts}; {learns}: enough."
    smaller = found["smaller_target"] and f"an effective batch of {found['smaller_target']:,} in {_epochs(asked)}"
    if found["enough"]:
        return (f"{counts}, too few: {learns}. Train {_epochs(epochs)} ({found['steps']:,} steps)"
                + (f", or {smaller}." if smaller else "."))
    limit = f"this deployment allows at most {max_epochs} epochs ({found['steps']:,} steps)"
    return (f"{counts}, too few: {learns}, and {limit}: "
            + (f"use {smaller}." if smaller else "use more training examples."))


def _epochs(count: int) -> str:
    return f"{count} epoch{'s' if count != 1 else ''}"
