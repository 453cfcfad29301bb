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

from gradacc.choices import PER_MICRO_BATCH, PER_WINDOW

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
