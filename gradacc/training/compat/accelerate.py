"""Accelerate's internals gradacc relies on (accelerate 1.16): its process-wide state singletons, what a prepared
scheduler was prepared with, and the torch DataLoader inside a prepared one."""

from __future__ import annotations

from accelerate.state import AcceleratorState, GradientState, PartialState

# The attributes of Accelerate's AcceleratedScheduler read here, and the Accelerator's list of them.
PREPARED_SCHEDULERS = "_schedulers"
SCHEDULER_SETTINGS = ("scheduler", "step_with_optimizer", "split_batches")
# A prepared DataLoader (DataLoaderShard, an adapter) iterates the torch DataLoader it keeps here.
WRAPPED_LOADER = "base_dataloader"


def reset_accumulation_state() -> None:
    """A fresh accumulation state for the next Accelerator (process-wide singletons); the process group stays."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def set_partial_state_type(distributed_type) -> None:
    """The distributed type every later PartialState in this process reads (Accelerate keeps it in a shared dict)."""
    PartialState._shared_state["distributed_type"] = distributed_type


def scheduler_steps_per_optimizer_step(accelerator, torch_schedulers: list) -> int | None:
    """How many times a scheduler Accelerate prepared steps the torch one per optimizer step: once per process
    unless batches are split (Accelerate's design: schedules sized in per-process steps). None: none of
    ``torch_schedulers`` was prepared by ``accelerator``."""
    for prepared in getattr(accelerator, PREPARED_SCHEDULERS, []):
        if getattr(prepared, "scheduler", None) in torch_schedulers:
            if prepared.step_with_optimizer and not prepared.split_batches:
                return accelerator.num_processes
            return 1
    return None


def draw_base_seeds_from(loader, generator) -> None:
    """Every pass over ``loader`` (a torch DataLoader, or one Accelerate prepared) draws its base seed from
    ``generator`` instead of torch's default one."""
    getattr(loader, WRAPPED_LOADER, loader).generator = generator
