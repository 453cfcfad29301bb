"""Fully sharded data parallelism (FSDP2: ``torch.distributed.fsdp.fully_shard``) for the three loops, and what it
measures on each rank.

Sharding: every repeated block of the model (a BERT layer, a GPT-2 block) is its own ``fully_shard`` group, then
the root takes the rest (embeddings, the tied LM head, norms, classifier). Each rank keeps 1/P of every parameter,
gradient and optimizer state; a group's parameters are all-gathered for its forward and backward, and its gradients
reduce-scattered after its backward.

Accumulation has two ways to sync (``RunConfig.grad_sync``):

- ``per-window``: ``set_requires_gradient_sync(False)`` on every micro-batch but the window's last. Gradients add up
  unsharded on each rank (the whole model's, N·b bytes) and are reduce-scattered once per window: the sharding of
  gradients is undone for the window.
- ``per-micro-batch``: reduce-scatter after every backward. Each rank holds only its shard (N·b/P), and sends k
  times the gradient bytes per window.

What a rank measures (never computed from parameter counts): the gradient bytes alive after each backward, read
from the tensors (``gradient_bytes``); the bytes FSDP hands to each reduce-scatter and all-gather, counted inside
the call through FSDP's own hooks (``set_custom_reduce_scatter`` / ``set_custom_all_gather``); the window's seconds.
``ShardingProbe`` gathers them per rank into the ``step`` event's ``sharding`` figures.

FSDP2 reduce-scatters with ``ReduceOp.AVG``, as DDP averages its all-reduce: the loss weights of
``gradacc.training.windows`` (× P over the window's items on all ranks) are exact for both.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from gradacc.errors import GradaccError, one_line
from gradacc.training import distributed
from gradacc.training.compat.torch import (DefaultAllGather, DefaultReduceScatter, fsdp_params, local_tensor,
                                           unsharded_grad)


# ---- wrapping ---------------------------------------------------------------------------------------

def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the children of its largest ``nn.ModuleList`` of one class that hold parameters
    (``bert.encoder.layer``, ``transformer.h``, ``model.layers``); none for a model without such a list."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            children = list(module)
            if len({type(child) for child in children}) == 1 and any(p.requires_grad for p in module.parameters()):
                best = children
    return best


def unwrappable(model: nn.Module) -> str | None:
    """Why FSDP cannot shard ``model`` as gradacc trains it, in a few words; None when it can. Checked before
    wrapping: FSDP itself refuses some of these only at the first synced backward (a sparse embedding)."""
    for name, parameter in model.named_parameters():
        if parameter.dim() == 0:
            return f"its parameter {name} is a scalar (FSDP shards tensors along their first dimension)"
    for name, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            return f"{name} makes sparse gradients, which FSDP cannot reduce-scatter"
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            return (f"its BatchNorm ({name}) keeps running statistics, buffers FSDP neither shards nor synchronises "
                    "across processes")
    return None


def group_sizes(model: nn.Module) -> dict:
    """Parameters per ``fully_shard`` group as ``shard`` makes them: the whole model (N), the largest group, the group
    backward reduces first (the last block) and the root's (what the blocks leave); the formula of
    ``gradacc.analysis.sharding`` takes them. A sharded model's parameters count whole (a DTensor's global size)."""
    total = sum(p.numel() for p in model.parameters())
    block_sizes = [sum(p.numel() for p in block.parameters()) for block in blocks(model)]
    root = total - sum(block_sizes)
    return {"parameters": total, "largest_group": max([root, *block_sizes]),
            "first_reduced": block_sizes[-1] if block_sizes else root, "root": root, "groups": len(block_sizes) + 1}


def shard(model: nn.Module, device, name: str) -> nn.Module:
    """``fully_shard`` each block, then the root, over all ranks (a 1-D mesh on the run's device type); the same
    module comes back, its parameters now DTensors holding this rank's shard. GradaccError (field ``model``)
    for a model FSDP cannot shard."""
    check_shardable(model, name)
    mesh = init_device_mesh(torch.device(device).type, (distributed.world_size(),))
    try:
        for block in blocks(model):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    except ValueError as error:  # a parameter tied across two groups, say: FSDP's own reason, in one line
        raise GradaccError(f"Model {name} cannot be sharded with FSDP: {one_line(error, with_type=False)}",
                           "model") from None
    return model


def check_shardable(model: nn.Module, name: str) -> None:
    """GradaccError (field ``model``) with ``unwrappable``'s reason, in the words the config's check uses."""
    problem = unwrappable(model)
    if problem:
        raise GradaccError(f"Model {name} cannot be sharded with FSDP: {problem}.", "model")


def is_sharded(model) -> bool:
    return isinstance(model, FSDPModule)


def set_grad_sync(model, synced: bool) -> None:
    """Whether the next backward reduce-scatters (sticky in FSDP: set before every micro-batch)."""
    model.set_requires_gradient_sync(synced)


def full_gradient(parameter) -> torch.Tensor | None:
    """A parameter's whole gradient: a sharded one is all-gathered (a collective: every rank must ask, in the same
    order)."""
    grad = parameter.grad
    if isinstance(grad, DTensor):
        return grad.full_tensor()
    return grad


# ---- measuring ----------------------------------------------------------------------------------------

def _nbytes(tensor) -> int:
    if tensor is None:
        return 0
    if isinstance(tensor, DTensor):
        tensor = local_tensor(tensor)
    return tensor.numel() * tensor.element_size()


def _fsdp_params(model) -> list:
    """FSDP's per-parameter records (internal: ``FSDPParam``), which own the unsharded accumulation buffers."""
    return [p for module in model.modules() if isinstance(module, FSDPModule) for p in fsdp_params(module)]


def gradient_bytes(model) -> int:
    """Bytes of gradient tensors alive on this rank now, read from the tensors: the sharded ``.grad`` (what the
    optimizer steps) and, while a window accumulates without sync, the unsharded gradients FSDP accumulates into
    (``FSDPParam._unsharded_param.grad``, or ``unsharded_accumulated_grad`` under a mixed-precision reduce dtype).
    FSDP2 has no public API for the latter: tests/training/test_fsdp.py pins what they hold."""
    held = 0
    for fsdp_param in _fsdp_params(model):
        held += _nbytes(unsharded_grad(fsdp_param))
        held += _nbytes(getattr(fsdp_param, "unsharded_accumulated_grad", None))
        held += _nbytes(fsdp_param.sharded_param.grad)
    return held


class CollectiveLedger:
    """What this rank handed to FSDP's collectives since the last ``take``: reduce-scatter input bytes (gradients)
    and calls, all-gather input bytes (parameters), and the gradient bytes alive at each reduce-scatter plus its
    buffers (the transient peak)."""

    def __init__(self, model):
        self.model = model
        self.grad_bytes = self.grad_calls = self.param_bytes = self.peak_in_reduce = 0

    def reduce_scatter(self, output_tensor, input_tensor) -> None:
        self.grad_calls += 1
        self.grad_bytes += _nbytes(input_tensor)
        alive = gradient_bytes(self.model) + _nbytes(input_tensor) + _nbytes(output_tensor)
        self.peak_in_reduce = max(self.peak_in_reduce, alive)

    def take(self) -> dict:
        taken = {"grad_comm_bytes": self.grad_bytes, "grad_comm_calls": self.grad_calls,
                 "param_comm_bytes": self.param_bytes, "peak_in_reduce": self.peak_in_reduce}
        self.grad_bytes = self.grad_calls = self.param_bytes = self.peak_in_reduce = 0
        return taken


class _CountingReduceScatter(DefaultReduceScatter):
    def __init__(self, ledger: CollectiveLedger):
        self.ledger = ledger

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.ledger.reduce_scatter(output_tensor, input_tensor)
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


class _CountingAllGather(DefaultAllGather):
    def __init__(self, ledger: CollectiveLedger):
        self.ledger = ledger

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.ledger.param_bytes += _nbytes(input_tensor)
        return super().__call__(output_tensor, input_tensor, group, async_op)


def count_collectives(model) -> CollectiveLedger:
    """Counting hooks on every FSDP group of ``model`` (each group owns its collectives), through FSDP's own
    ``set_custom_reduce_scatter`` / ``set_custom_all_gather``: they then call the default collective."""
    ledger = CollectiveLedger(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(_CountingReduceScatter(ledger))
            module.set_custom_all_gather(_CountingAllGather(ledger))
    return ledger


class ShardingProbe:
    """Per window, on every rank: the peak gradient bytes held after a backward, the collectives' bytes, the
    window's seconds; ``take`` gathers them from every rank (one all-gather) into the ``step`` event's figures."""

    def __init__(self, model, grad_sync: str, device):
        self.model = model
        self.grad_sync = grad_sync
        self.device = device
        self.ledger = count_collectives(model)
        self.held = 0
        self.window_started: float | None = None

    @classmethod
    def attach(cls, model, config, device) -> "ShardingProbe | None":
        """A probe on a sharded ``model``; None otherwise (a run without FSDP)."""
        return cls(model, config.grad_sync, device) if is_sharded(model) else None

    def micro_batch_started(self) -> None:
        if self.window_started is None:
            self.window_started = time.perf_counter()

    def after_backward(self) -> None:
        self.held = max(self.held, gradient_bytes(self.model))

    def discard(self) -> None:
        """Forget what was counted since the last step (an evaluation's all-gathers belong to no window)."""
        self.ledger.take()
        self.held, self.window_started = 0, None

    def take(self) -> dict:
        """Every rank's figures for the window that just stepped (a collective: every rank calls it at each step)."""
        seconds = time.perf_counter() - self.window_started if self.window_started is not None else 0.0
        counted = self.ledger.take()
        mine = [self.held, max(self.held, counted["peak_in_reduce"]), counted["grad_comm_bytes"],
                counted["grad_comm_calls"], counted["param_comm_bytes"], seconds]
        self.held, self.window_started = 0, None
        ranks = distributed.gather_from_ranks(mine, self.device)
        column = list(zip(*ranks))
        return {"grad_sync": self.grad_sync, "grad_bytes": [int(v) for v in column[0]],
                "grad_peak_bytes": [int(v) for v in column[1]], "grad_comm_bytes": [int(v) for v in column[2]],
                "grad_comm_calls": [int(v) for v in column[3]], "param_comm_bytes": [int(v) for v in column[4]],
                "window_s": [float(v) for v in column[5]]}

