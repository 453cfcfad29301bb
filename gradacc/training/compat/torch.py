"""torch's internals gradacc relies on (torch 2.13): the LR scheduler's mark on ``optimizer.step``, DDP's sync flag,
FSDP2's per-parameter records (FSDP2 has no public API for the unsharded gradients it accumulates), and autograd's
end-of-backward callbacks (no public hook runs once every gradient of a backward is in ``.grad``)."""

from __future__ import annotations

from torch.autograd import Variable

# FSDP2's default collectives (private module): gradacc's ledger subclasses them to count what each rank sends.
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter  # noqa: F401

# torch.optim.lr_scheduler marks the optimizer.step it wraps with this; a step without it makes the scheduler warn
# "optimizer.step() has been overridden after learning rate scheduler initialization".
SCHEDULER_MARK = "_wrapped_by_lr_sched"


def keep_scheduler_mark(replacement, original) -> None:
    """``replacement`` (a function standing in for ``original``, an optimizer's step) carries the scheduler's mark."""
    if getattr(original, SCHEDULER_MARK, False):
        setattr(replacement, SCHEDULER_MARK, True)


def at_end_of_backward(callback) -> None:
    """Run ``callback`` when the backward now running ends, once every gradient is added to ``.grad`` (FSDP1's
    post-backward works this way). Only from a hook that runs during that backward."""
    Variable._execution_engine.queue_callback(callback)


def ddp_syncs_next_backward(ddp_model) -> bool:
    """Whether DDP all-reduces in the backward of the forward now running: its ``require_backward_grad_sync``, which
    ``no_sync()`` clears (and nanoGPT sets by hand)."""
    return bool(ddp_model.require_backward_grad_sync)


def local_tensor(dtensor):
    """A DTensor's shard on this rank."""
    return dtensor._local_tensor


def fsdp_params(module) -> list:
    """FSDP2's per-parameter records (``FSDPParam``) of one sharded module."""
    return [p for group in module._get_fsdp_state()._fsdp_param_groups for p in group.fsdp_params]


def unsharded_grad(fsdp_param):
    """The unsharded gradient an FSDPParam accumulates into while a window runs without sync (None before FSDP's
    lazy init, or when nothing accumulated)."""
    unsharded = getattr(fsdp_param, "_unsharded_param", None)
    return None if unsharded is None else unsharded.grad
