"""What FSDP accumulation costs per rank, as a formula: gradient bytes held and bytes sent per window, for each way
to sync. ``python -m gradacc bench fsdp`` checks it against what ranks measure (gradacc.training.fsdp) and then
evaluates it for model sizes no CPU can train; the Memory planner uses it per rank.

Per rank, with N parameters sharded over P ranks, k micro-batches per window, b bytes per gradient element (the
reduce dtype), b_p per parameter element, G the largest ``fully_shard`` group, F the group backward reduces first
(the last block) and R the root group (kept gathered after forward, so not all-gathered again in backward):

==========================================  =====================  =============================
quantity                                    per-window sync        per-micro-batch sync
==========================================  =====================  =============================
gradient bytes held between micro-batches   N·b                    N·b / P
peak, with the reduce-scatter's buffers     N·b + F·b / P          N·b / P + G·b·(1 + 1/P)
bytes handed to reduce-scatter per window   N·b                    k·N·b
bytes handed to all-gather per window       k·(2N − R)·b_p / P     the same
==========================================  =====================  =============================

Per-window sync undoes the sharding of gradients for the whole window (its held bytes do not shrink with P); per-
micro-batch sync keeps it and pays k times the gradient bytes on the wire (a ring sends (P−1)/P of what it is
handed). FSDP pads each parameter's first dimension to a multiple of P, so a small model measures a little more.

The peaks are taken inside each reduce-scatter call: per-window sync's is at the first group reduced (every other
group still holds its unsharded gradients; each reduced group then shrinks to its shard), per-micro-batch sync's at
the largest group (every group already holds its shard from the micro-batches before).
"""

from __future__ import annotations

from dataclasses import dataclass

from gradacc.choices import GRAD_SYNCS, PER_MICRO_BATCH, PER_WINDOW
from gradacc.errors import GradaccError
from gradacc.labels import field_label
from gradacc.units import MB, format_bytes
from gradacc.training.memory.budget import largest_fitting_micro_batch

QUANTITIES = ("grad_bytes", "grad_peak_bytes", "grad_comm_bytes", "param_comm_bytes")


@dataclass(frozen=True)
class Shape:
    """A model as FSDP shards it: parameters in all, in its largest group, in the group backward reduces first and in
    its root group."""

    parameters: float
    largest_group: float
    first_reduced: float
    root: float


def per_rank(shape: Shape, processes: int, grad_accum_steps: int, grad_bytes: int = 4,
             param_bytes: int = 4) -> dict[str, dict[str, float]]:
    """{sync choice: {quantity: bytes per rank}} (QUANTITIES; see the module's table)."""
    n, g, f, r = shape.parameters, shape.largest_group, shape.first_reduced, shape.root
    p, k = processes, grad_accum_steps
    gathered = k * (2 * n - r) * param_bytes / p
    return {
        PER_WINDOW: {"grad_bytes": n * grad_bytes, "grad_peak_bytes": n * grad_bytes + f * grad_bytes / p,
                     "grad_comm_bytes": n * grad_bytes, "param_comm_bytes": gathered},
        PER_MICRO_BATCH: {"grad_bytes": n * grad_bytes / p,
                          "grad_peak_bytes": n * grad_bytes / p + g * grad_bytes * (1 + 1 / p),
                          "grad_comm_bytes": k * n * grad_bytes, "param_comm_bytes": gathered},
    }


def ring_sent(handed_bytes: float, processes: int) -> float:
    """Bytes a rank puts on the wire when a ring reduce-scatters what it was handed."""
    return handed_bytes * (processes - 1) / processes


# ---- real model sizes -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Llama:
    """A Llama-3 shape: d model width, layers, feed-forward width, key/value width, vocabulary, tied embeddings."""

    name: str
    width: int
    layers: int
    feed_forward: int
    key_value: int
    vocabulary: int = 128_256
    tied: bool = False

    @property
    def layer(self) -> int:
        d = self.width
        attention = 2 * d * d + 2 * d * self.key_value
        return attention + 3 * d * self.feed_forward + 2 * d  # and two RMSNorm weights

    @property
    def root(self) -> int:
        """Embeddings, the output head (unless tied) and the final norm: what the layers leave to the root."""
        return self.vocabulary * self.width * (1 if self.tied else 2) + self.width

    def shape(self) -> Shape:
        return Shape(self.layers * self.layer + self.root, max(self.layer, self.root), self.layer, self.root)


# Llama-3.2-1B, Llama-3.1-8B and Llama-3.1-70B, as their configs give them.
LLAMAS = (Llama("1B", width=2048, layers=16, feed_forward=8192, key_value=512, tied=True),
          Llama("8B", width=4096, layers=32, feed_forward=14336, key_value=1024),
          Llama("70B", width=8192, layers=80, feed_forward=28672, key_value=1024))
REAL_PROCESSES = (8, 64)
BF16 = 2


def real_sizes(grad_accum_steps: int = 8) -> list[dict]:
    """The formula for Llama-3 1B, 8B and 70B on 8 and 64 ranks, bf16 parameters and gradients (reduced in bf16)."""
    rows = []
    for model in LLAMAS:
        shape = model.shape()
        for processes in REAL_PROCESSES:
            figures = per_rank(shape, processes, grad_accum_steps, grad_bytes=BF16, param_bytes=BF16)
            window, each = figures[PER_WINDOW], figures[PER_MICRO_BATCH]
            rows.append({"model": model.name, "parameters": shape.parameters, "processes": processes,
                         "grad_accum_steps": grad_accum_steps,
                         "grad_bytes": {PER_WINDOW: window["grad_bytes"], PER_MICRO_BATCH: each["grad_bytes"]},
                         "grad_peak_bytes": {PER_WINDOW: window["grad_peak_bytes"],
                                             PER_MICRO_BATCH: each["grad_peak_bytes"]},
                         "sent_bytes": {PER_WINDOW: ring_sent(window["grad_comm_bytes"], processes),
                                        PER_MICRO_BATCH: ring_sent(each["grad_comm_bytes"], processes)}})
    return rows


# ---- the Memory planner on several processes ------------------------------------------------------

def plan_processes(setting: dict, budget_mb: float, target_effective_batch: int, processes: int) -> dict:
    """One measured lever setting (``planner.measure_levers``) on ``processes`` ranks, per rank: replicated (DDP:
    every rank holds the whole model, its gradients and optimizer state) and sharded (FSDP) with each sync choice.

    A sharded rank holds 1/P of the parameters and optimizer state, the gradients the formula above gives for its
    sync choice (its peak), and one group's gathered parameters while that group computes; activations are the
    measured line, per micro-batch. m is the largest power of two that fits, dividing the per-rank batch (target
    ÷ P), k the rest; per-window sync is planned with k ≥ 2 (at k = 1 nothing waits for a window: it is the other). Each way says what a rank hands to its gradient collectives per window (``sent_bytes``: the
    bytes a ring puts on the wire; DDP's all-reduce is a reduce-scatter and an all-gather)."""
    per_rank_batch, left = divmod(target_effective_batch, processes)
    if left or not per_rank_batch:
        raise GradaccError(f"{field_label('target_effective_batch')} {target_effective_batch} must be a multiple of the "
                           f"{processes} processes: each takes the same share.", "target_effective_batch")
    static, fit, shape = setting["static"], setting["fit"], Shape(**setting["shape"])
    grad_bytes, param_bytes = static["gradients"] / shape.parameters, static["parameters"] / shape.parameters
    budget = budget_mb * MB

    def way(held: float, sent_per_k, most: int = per_rank_batch) -> dict:
        m = largest_fitting_micro_batch(held, fit["fixed_bytes"], fit["bytes_per_example"], budget, most) if most \
            else None
        k = per_rank_batch // m if m else None
        return {"fits": m is not None, "micro_batch_size": m, "grad_accum_steps": k, "static_bytes": held,
                "peak_bytes": held + fit["fixed_bytes"] + fit["bytes_per_example"] * m if m else None,
                "least_bytes": held + fit["fixed_bytes"] + fit["bytes_per_example"], "sent_bytes": sent_per_k(k)}

    ways = {"ddp": way(static["total"], lambda k: 2 * ring_sent(static["gradients"], processes))}
    for choice in GRAD_SYNCS:
        def sent(k, choice=choice):
            figures = per_rank(shape, processes, k or per_rank_batch, grad_bytes, param_bytes)[choice]
            return ring_sent(figures["grad_comm_bytes"], processes)

        gradients = per_rank(shape, processes, 1, grad_bytes, param_bytes)[choice]["grad_peak_bytes"]
        held = (static["parameters"] + static["optimizer_state"]) / processes + gradients \
            + shape.largest_group * param_bytes
        most = per_rank_batch // 2 if choice == PER_WINDOW else per_rank_batch
        ways[choice] = way(held, sent, most) | {"gradient_bytes": gradients}
    return {"processes": processes, "budget_mb": budget_mb, "target_effective_batch": target_effective_batch,
            "ways": ways, "verdict": verdict(ways)}


def verdict(ways: dict) -> str:
    """One sentence: which sync choice fits, and what per-micro-batch sync costs in bytes sent."""
    window, each = ways[PER_WINDOW], ways[PER_MICRO_BATCH]
    if each["grad_accum_steps"] == 1:
        return (f"No accumulation is needed: m = {each['micro_batch_size']} per rank fits with k = 1, where both ways "
                "to sync are the same run.")
    if window["fits"] and each["fits"]:
        return (f"Both ways to sync fit; per-window sync sends {format_bytes(window['sent_bytes'])} of gradients per window "
                f"against per-micro-batch's {format_bytes(each['sent_bytes'])}: keep per-window.")
    if each["fits"]:
        return (f"Per-window sync does not fit: it holds the whole model's gradients "
                f"({format_bytes(window['gradient_bytes'])}) on every rank for the window, so even m = 1 needs "
                f"{format_bytes(window['least_bytes'])}. Per-micro-batch sync fits at m = {each['micro_batch_size']}, "
                f"k = {each['grad_accum_steps']}, and sends {format_bytes(each['sent_bytes'])} of gradients per window "
                f"instead of {format_bytes(window['sent_bytes'])} ({each['grad_accum_steps']}×).")
    return (f"Neither way to sync fits: even per-micro-batch sync at m = 1 needs {format_bytes(each['least_bytes'])} per "
            "rank; add processes or pull another lever.")

