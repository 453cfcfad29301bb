"""What every loop reports: each micro-batch counted into its window, and one ``step`` event per optimizer step
(``eval`` per epoch), with the window's loss, memory, sync rounds and time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from gradacc import events
from gradacc.errors import RunFailed
from gradacc.events import BASELINE_METRICS
from gradacc.training import distributed, fsdp
from gradacc.training.memory import measure


def activation_meter(job, model) -> measure.ActivationMeter:
    """The saved-tensor meter; with a memory budget every measured micro-batch is checked against it."""
    guard = job.memory_guard
    meter = measure.ActivationMeter(model, on_measured=guard.check_activations if guard else None)
    attach = getattr(job.model, "attach_meter", None)
    if attach is not None:  # GradCache saves its activations during backward: it measures them itself
        attach(meter)
    return meter


def check_finite(loss: torch.Tensor, step: int) -> None:
    """RunFailed("loss became NaN at step 3") as soon as a micro-batch's loss is not finite."""
    if not torch.isfinite(loss):
        kind = "NaN" if torch.isnan(loss) else "inf"
        raise RunFailed(f"loss became {kind} at step {step}")


def batch_examples(batch: dict) -> int:
    """Examples in a micro-batch: its rows (a contrastive micro-batch's pairs)."""
    ids = batch.get("input_ids")
    if ids is None:
        ids = next(value for key, value in batch.items() if key.endswith("input_ids"))
    return int(ids.shape[0])


@dataclass
class WindowTally:
    """The optimizer step being accumulated: each micro-batch's share of the window's loss, how many there were,
    the activation bytes measured. Every backend adds each micro-batch; ``StepReporter.step`` reports the window
    and starts the next (Trainer's loop does not expose it: ``GradaccTrainer`` adds, ``EventCallback`` reports)."""

    loss: float = 0.0
    micro_batches: int = 0
    # Activations are measured on the first micro-batch of each window; the last reading is kept.
    activation_bytes: int | None = None
    measuring: bool = False  # the forward pass running now is measured

    def add(self, loss: float, activation_bytes: int | None = None) -> None:
        """One micro-batch: its scaled loss (a window's add up to the window's mean loss) and, when measured,
        its activation bytes."""
        self.loss += loss
        self.micro_batches += 1
        if activation_bytes is not None:
            self.activation_bytes = activation_bytes

    def next_window(self) -> None:
        self.loss, self.micro_batches = 0.0, 0


class StepReporter:
    """Counts what went through the model and emits ``step`` and ``eval`` events.

    On several processes every rank calls ``step`` at the same optimizer step: one all-reduce turns each
    rank's counts and window loss into the run's (samples and tokens summed, loss averaged over ranks).
    """

    def __init__(self, job, num_processes: int = 1):
        self.job = job
        self.num_processes = num_processes
        self.samples_seen = 0  # this rank's
        self.tokens_seen = 0
        # Set when the model is DDP-wrapped: counts the gradient all-reduces of each window.
        self.sync_probe: distributed.SyncProbe | None = None
        # Set when the model is sharded (FSDP): each rank's gradient bytes, collective bytes and window seconds.
        self.sharding_probe = None
        # Set when the run asks for pitfalls: what the right loop would have done at each step (backends.pitfalls).
        self.pitfall_probe = None
        self.started = time.perf_counter()
        # The training thread's CPU time measures a step's work whatever else the machine runs, where that thread
        # does all of it: on the CPU with one torch thread (events.StepEvent.cpu_s).
        self.thread = threading.get_ident()
        self.started_cpu = time.thread_time() if (torch.device(job.device).type == "cpu"
                                                  and torch.get_num_threads() == 1) else None

    def watch(self, model) -> None:
        """Attach the probes ``model`` needs: DDP's sync rounds when it is DDP-wrapped, FSDP's bytes and times when it
        is sharded (neither on one process)."""
        self.sync_probe = distributed.SyncProbe.attach(model)
        self.sharding_probe = fsdp.ShardingProbe.attach(model, self.job.config, self.job.device)

    def micro_batch(self, batch: dict) -> None:
        if self.job.memory_guard is not None:
            self.job.memory_guard.note_batch(batch)
        if self.sharding_probe is not None:
            self.sharding_probe.micro_batch_started()
        examples = batch_examples(batch)
        self.samples_seen += examples
        if self.pitfall_probe is not None:
            self.pitfall_probe.micro_batch(examples)
        # A contrastive micro-batch's tokens are those of its queries and its positives.
        self.tokens_seen += int(sum(value.sum() for key, value in batch.items() if key.endswith("attention_mask")))

    def backward_done(self) -> None:
        """After each micro-batch's backward: a sharded run reads the gradient bytes its rank holds now."""
        if self.sharding_probe is not None:
            self.sharding_probe.after_backward()

    def before_optimizer_step(self, model) -> None:
        """The window's gradients are complete, unclipped: a gradient check reads them here
        (``job.before_optimizer_step``, the equivalence checks' probe; nothing in a run of its own)."""
        if self.job.before_optimizer_step:
            self.job.before_optimizer_step(model)

    def step(self, window: WindowTally, *, step: int, epoch: int, grad_norm: float | None, lr: float) -> None:
        """The ``step`` event of the optimizer step that just ended ``window``; then ``window`` starts the next."""
        samples, tokens, loss_sum = distributed.sum_over_ranks([self.samples_seen, self.tokens_seen, window.loss],
                                                               self.job.device)
        activation_bytes = window.activation_bytes
        sharding = self.sharding_probe.take() if self.sharding_probe else None  # every rank's, gathered
        # CPU time read before wall time, as they were started in the other order: the CPU interval lies inside the
        # wall one, so one thread's CPU seconds never read above its wall seconds.
        cpu_s = self.cpu_seconds()
        elapsed_s = time.perf_counter() - self.started
        self.job.emit(events.step(step=step, epoch=epoch, samples_seen=int(samples), tokens_seen=int(tokens),
                                  micro_batches=window.micro_batches, loss=loss_sum / self.num_processes,
                                  grad_norm=grad_norm, lr=lr, elapsed_s=elapsed_s,
                                  memory=measure.snapshot(activation_bytes, self.job.device, self.job.config.instrument),
                                  sync_rounds=self.sync_probe.take() if self.sync_probe else None,
                                  pitfall=self.pitfall_probe.take() if self.pitfall_probe else None,
                                  cpu_s=cpu_s, sharding=sharding))
        measure.reset_cuda_peak(self.job.device)
        window.next_window()

    def cpu_seconds(self) -> float | None:
        """The training thread's CPU seconds since the run started; None where they do not measure its work."""
        if self.started_cpu is None or threading.get_ident() != self.thread:
            return None
        return time.thread_time() - self.started_cpu

    def evaluation(self, *, epoch: int, step: int, metrics: dict) -> None:
        if self.sharding_probe is not None:
            self.sharding_probe.discard()  # the evaluation's all-gathers are no window's
        # Trainer prefixes every metric with eval_ (eval_majority_f1); the event names the floor without it.
        named = {**metrics, **{name: metrics.get(f"eval_{name}", metrics.get(name)) for name in BASELINE_METRICS}}
        self.job.emit(events.eval_(epoch=epoch, step=step, **{name: named.get(name)
                                                              for name in events.EVAL_METRICS + BASELINE_METRICS}))
