"""Where this process stands in a data-parallel launch, and the few collectives gradacc needs.

``accelerate launch`` and ``torchrun`` start one process per rank and set RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; everything here reads those. torch is imported only inside functions: the
CLI asks for the world size before anything heavy is loaded.
"""

from __future__ import annotations

import datetime
import os
import sys


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """Processes of the launch on this machine."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def is_main_process() -> bool:
    return rank() == 0


def launch_warning() -> str | None:
    """A sentence when ``accelerate launch --cpu --num_processes N`` started one process instead of N.

    Accelerate's ``--cpu`` launcher runs several processes only through MPI (``--mpirun_hostfile``); without
    it, it starts one process and sets MASTER_ADDR (only done for N > 1) but no WORLD_SIZE.
    """
    if ("WORLD_SIZE" not in os.environ and "MASTER_ADDR" in os.environ
            and os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"):
        return ("accelerate launch --cpu started a single process (Accelerate starts several CPU processes only "
                "through MPI); gradacc's own commands run on N CPU processes under accelerate launch --multi_gpu "
                "--num_processes N or torchrun --nproc_per_node N; a script of your own under "
                + CPU_LAUNCH.format(processes="N") + " (accelerate launch --multi_gpu starts N separate copies of it "
                "there, each training alone).")
    return None


# How long a collective waits for the other ranks before it fails the run: a rank that hangs (alive, but no longer
# calling collectives) would otherwise hold the others for torch's default of 30 minutes. Every rank does the
# same work between two collectives, except evaluation without FSDP (rank 0 alone, the others wait).
PROCESS_GROUP_TIMEOUT_S = 600


def init_process_group(device) -> None:
    """Join the launch's process group (gloo on CPU, nccl on CUDA) unless Accelerate already did."""
    import torch.distributed as dist  # here: the app and `gradacc --help` import this module before torch loads

    if world_size() > 1 and not dist.is_initialized():
        if device.type == "cuda":  # NCCL's own calls (a barrier, an object's broadcast) use the current device
            import torch

            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))


def leave_process_group() -> None:
    """Leave the launch's process group before the interpreter exits (the CLI registers this at exit). Left to the
    C++ destructors at exit, a process that completed its run sometimes aborts there ("terminate called without an
    active exception", SIGABRT), and its launch then reads as failed."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> None:
    """End a launched rank: flush, leave the process group, and exit without the interpreter's teardown.

    Leaving the group is not enough after FSDP: the gloo group lives on in FSDP's mesh, and a worker thread of it
    that drops a finished collective's tensor while the interpreter finalises calls pthread_exit from a noexcept
    destructor: std::terminate, "terminate called without an active exception", SIGABRT (seen in a core dump), so a
    completed launch reads as failed. ``os._exit`` skips the finalisation; what must be written is flushed first.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    leave_process_group()
    os._exit(code)


def is_distributed() -> bool:
    import torch.distributed as dist  # here: the app and `gradacc --help` import this module before torch loads

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def separate_copies(sharing: int) -> int | None:
    """P when a launcher started P processes but the loop shares its gradients over ``sharing`` = 1 of them, so each
    trains alone: ``accelerate launch --multi_gpu`` on a machine without GPUs starts such copies (a process group
    may exist, but Accelerate trains without it). None otherwise."""
    launched = max(world_size(), _group_size())
    return launched if launched > 1 and sharing == 1 else None


def _group_size() -> int:
    import torch.distributed as dist  # here: the app and `gradacc --help` import this module before torch loads

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


# On a CPU, the launch that gives a user's own script one process group of P processes.
CPU_LAUNCH = "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node {processes} train.py"


def unwrap(model):
    """The module inside DistributedDataParallel (evaluation runs on it: no collectives in its forward)."""
    # here: the app and `gradacc --help` import this module before torch loads
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def sum_over_ranks(values: list[float], device) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (one all-reduce); the values themselves on one process."""
    if not is_distributed():
        return list(values)
    import torch  # here: the app and `gradacc --help` import this module before torch loads
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def sum_gradients_over_ranks(gradient: dict) -> dict:
    """Each rank's {name: flat tensor} added up, name by name, in float32 (one all-reduce); as it is on one
    process."""
    if not is_distributed():
        return gradient
    import torch  # here: the app and `gradacc --help` import this module before torch loads
    import torch.distributed as dist

    names = sorted(gradient)
    flat = torch.cat([gradient[name].float() for name in names])
    dist.all_reduce(flat)
    return dict(zip(names, flat.split([gradient[name].numel() for name in names])))


def gather_from_ranks(values: list[float], device) -> list[list[float]]:
    """Every rank's ``values`` (as many on each), in rank order, on every rank (one all-gather); float64 holds
    byte counts exactly up to 2**53."""
    if not is_distributed():
        return [list(values)]
    import torch  # here: the app and `gradacc --help` import this module before torch loads
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return [part.tolist() for part in gathered]


def from_main_process(value):
    """Rank 0's ``value`` on every rank (a picklable object; one broadcast)."""
    if not is_distributed():
        return value
    import torch.distributed as dist  # here: the app and `gradacc --help` import this module before torch loads

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class SyncProbe:
    """Counts DDP's gradient all-reduces: a communication hook that counts each bucket, then all-reduces it
    exactly as DDP's default does (average over ranks).

    DDP groups gradients into buckets and all-reduces each bucket during backward(); inside ``no_sync()`` it
    all-reduces nothing. So the count per optimizer step is buckets × (1 with no_sync, k without).
    """

    def __init__(self, ddp_model):
        self.rounds = 0
        ddp_model.register_comm_hook(state=self, hook=_counting_allreduce)

    @classmethod
    def attach(cls, model) -> "SyncProbe | None":
        """A probe on ``model`` when it is DDP-wrapped; None otherwise (one process: nothing to count)."""
        # here: the app and `gradacc --help` import this module before torch loads
        from torch.nn.parallel import DistributedDataParallel

        return cls(model) if isinstance(model, DistributedDataParallel) else None

    def take(self) -> int:
        """All-reduce rounds since the last call."""
        rounds, self.rounds = self.rounds, 0
        return rounds


def _counting_allreduce(probe: SyncProbe, bucket):
    # here: the app and `gradacc --help` import this module before torch loads
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    probe.rounds += 1
    return allreduce_hook(None, bucket)  # None: the default (world) process group
