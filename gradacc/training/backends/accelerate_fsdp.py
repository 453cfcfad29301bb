"""Accelerate's FSDP2 plugin on the CPU: the plugin gradacc's groups map to, the switch Accelerate 1.16 does not make
for MULTI_CPU (it drops the plugin and wraps the model in DDP), undone before the next run of a process, and the check
that prepare() really sharded. The Accelerate and Trainer backends share it."""

from __future__ import annotations

import threading

from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from gradacc.errors import RunFailed
from gradacc.training import fsdp, process_state
from gradacc.training.compat import accelerate as compat


def fsdp_plugin(model):
    """Accelerate's FSDP2 plugin: each of the model's repeated blocks its own group (as gradacc.training.fsdp.shard
    does), parameters resharded after forward."""
    block_classes = sorted({type(block).__name__ for block in fsdp.blocks(model)})
    return FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                          auto_wrap_policy="transformer_based_wrap" if block_classes else "no_wrap",
                                          transformer_cls_names_to_wrap=block_classes or None)


def keep_fsdp_on_cpu(plugin) -> None:
    """Accelerate 1.16 turns its FSDP plugin on only for accelerator devices (state.py: DistributedType.MULTI_CPU is not
    among the types that become FSDP): on the CPU it drops the plugin without a word and prepare() wraps the model in
    DDP. FSDP2 itself runs on the CPU with gloo, so the state is switched to FSDP here, before prepare(); prepare()
    then shards the model with fully_shard, and ``prepared_sharded`` checks that it did."""
    with process_state.guard(accelerate=True):
        state = AcceleratorState()
        if state.distributed_type == DistributedType.MULTI_CPU:
            state.distributed_type = DistributedType.FSDP
            compat.set_partial_state_type(DistributedType.FSDP)
            state.fsdp_plugin = plugin
            _SWITCHED_TO_FSDP.set()


# Set while the process-wide PartialState says FSDP because keep_fsdp_on_cpu said so.
_SWITCHED_TO_FSDP = threading.Event()


def forget_fsdp_on_cpu() -> None:
    """The next run in this process (the equivalence check makes several) starts from the state Accelerate made:
    PartialState outlives a run, and a DDP run must not find it switched to FSDP."""
    with process_state.guard(accelerate=True):
        if _SWITCHED_TO_FSDP.is_set():
            compat.set_partial_state_type(DistributedType.MULTI_CPU)
            _SWITCHED_TO_FSDP.clear()


def prepared_sharded(accelerator, model) -> None:
    """RunFailed when a run asked for FSDP and the library prepared something else (a silent fallback to DDP)."""
    if not fsdp.is_sharded(model):
        raise RunFailed(f"Accelerate did not shard the model (its state is {accelerator.distributed_type}, the model "
                        f"a {type(model).__name__}); this run asked for FSDP")
