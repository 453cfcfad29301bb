"""The two gradients every equivalence check compares, each measured by a run of the engine.

``full_batch_gradient``: the gradient of the mean loss over a whole window in one forward/backward pass, in this
process; ``accumulated_gradient``: the gradient a backend holds right before its first optimizer step, and each
step's all-reduces; ``relative_error``: how far one is from the other. ``gradacc.analysis.equivalence`` (naive vs
exact, by window and by process) and ``gradacc.analysis.contrastive`` (in-batch negatives) both build on them.
"""

from __future__ import annotations

import threading

from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.events import Recorder
from gradacc.training import windows
from gradacc.training.gradients import gradient_sums
from gradacc.training.run.engine import quiet_libraries, train
from gradacc.training.run.job import prepare
from gradacc.training.run.options import RunOptions
from gradacc.training.sources import dropout as dropouts

# The app imports gradacc.analysis when a page loads, before torch: the two modules of the training layer that import
# torch (device, fsdp) are imported inside the functions that run a check.


def full_batch_gradient(config: RunConfig, token_level: bool, first_windows: int | None = None,
                        confinement=None) -> dict:
    """The gradient of the mean loss over the whole window in one forward/backward pass, in this process.

    The window is every rank's micro-batches together (on one process, simply all the examples); with
    ``first_windows``, only the micro-batches of the first that many accumulation windows. Refuses (GradaccError)
    a model whose output is not deterministic at the config's dropout: two gradients of it differ anyway.
    """
    from gradacc.training.backends.device import to_device  # torch: imported when a check runs, as the training is

    quiet_libraries()
    job = prepare(config, lambda event: None, threading.Event(),
                  RunOptions(token_level=token_level, whole_micro_batch=False, confinement=confinement))
    if job.variation.varies:
        raise GradaccError(dropouts.refusal(config.model, job.variation), "model")
    plan = windows.shard(len(job.train_examples), config.micro_batch_size, config.num_processes)
    # Global micro-batch order: rank 0's first, rank 1's first, ..., rank 0's second, ...
    micro_batches = [batch for round_ in zip(*plan) for batch in round_]
    if first_windows is not None:
        micro_batches = micro_batches[:first_windows * config.grad_accum_steps * config.num_processes]
    indices = [i for batch in micro_batches for i in batch]
    job.model.train()
    batch = to_device(job.collate([job.train_examples[i] for i in indices]), job.device)
    with job.precision.autocast():  # the same levers as the run it is compared with (bf16: a bf16 reference)
        loss = job.model(**batch).loss
    loss.backward()
    batch_items = windows.batch_item_counts(job.train_examples, micro_batches)
    return {"gradient": _gradients(job.model), "items": sum(batch_items), "batch_items": batch_items,
            "repeated_examples": max(0, len(indices) - len(job.train_examples))}


def accumulated_gradient(config: RunConfig, token_level: bool, trainer_library_default: bool = False,
                         sync_each_micro_batch: bool = False, confinement=None) -> dict:
    """The gradient a backend holds right before its first optimizer step, and each step's all-reduces."""
    # Read before the first step, the gradient owes nothing to the optimizer that then steps: plain SGD keeps no state
    # (AdamW made its state at that step: the in-batch-negatives check on all-MiniLM-L6-v2 took 6.8-7.2 s, now 5.9-6.8).
    config = config.replace(optimizer="sgd")
    captured = {}

    def capture(model):
        if not captured:  # the first optimizer step
            captured.update(_gradients(model))

    recorder = Recorder()
    ended = train(config, recorder, before_optimizer_step=capture, token_level=token_level, whole_micro_batch=False,
                  trainer_library_default=trainer_library_default, sync_each_micro_batch=sync_each_micro_batch,
                  confinement=confinement)
    if ended["status"] != "completed" or not captured:
        raise GradaccError(f"The equivalence run did not complete: {ended['reason']}", "backend")
    steps = recorder.of("step")
    return {"gradient": captured, "sync_rounds": [step["sync_rounds"] for step in steps],
            "sharding": [step.get("sharding") for step in steps],
            "activation_bytes": steps[0]["activation_bytes"] if steps else None}


def _gradients(model) -> dict:
    """Each parameter's whole gradient (a sharded one all-gathered: every rank asks for it at the same step)."""
    from gradacc.training.fsdp import full_gradient  # torch: imported when a check runs, as the training is

    # Wrappers (DDP) prefix names with "module."; strip it so every backend's names line up.
    return {name.removeprefix("module."): full_gradient(p).detach().float().flatten().clone()
            for name, p in model.named_parameters() if p.grad is not None}


def relative_error(gradient: dict, reference: dict) -> float:
    """‖gradient − reference‖ / ‖reference‖ over all parameters."""
    sums = gradient_sums(gradient, reference)
    return (sums["difference"] / sums["reference"]) ** 0.5
