"""What the plain-PyTorch and Accelerate loops share: optimizer, schedule, eval, and step reports.

The optimizer and schedule mirror ``Trainer``'s defaults (AdamW, no weight decay on biases and
LayerNorm weights, linear decay after warmup), so the three backends run the same math.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import threading
import time
from dataclasses import dataclass

import torch

from gradacc import events
from gradacc.training import distributed, memory
from gradacc.errors import GradaccError, RunFailed, one_line
from gradacc.training.metrics import classification_metrics, language_model_metrics

EVAL_BATCH_SIZE = 64
# SGD with momentum: one state tensor per parameter (AdamW keeps two, Adafactor factored rows and columns).
SGD_MOMENTUM = 0.9


def make_optimizer(model: torch.nn.Module, config, device=None) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over ``model``'s trainable parameters."""
    return optimizer_for(list(model.named_parameters()), config, device)


def optimizer_for(named_parameters, config, device=None) -> torch.optim.Optimizer:
    """Two groups like Trainer's (no weight decay on biases and norms); ``device`` decides what is supported.

    adamw-fused on a device where torch has no fused kernel and adamw-8bit without bitsandbytes and CUDA are
    refused with a sentence (GradaccError naming the field), not a traceback.
    """
    no_decay = [p for n, p in named_parameters if p.requires_grad and _skips_decay(n)]
    decay = [p for n, p in named_parameters if p.requires_grad and not _skips_decay(n)]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    name, lr = config.optimizer, config.learning_rate
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=SGD_MOMENTUM)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # A fixed learning rate (the schedule is gradacc's), as Trainer's optim="adafactor" sets it up.
        return Adafactor(groups, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    if name == "adamw-8bit":
        device_type = torch.device(device).type if device is not None else "cpu"
        if importlib.util.find_spec("bitsandbytes") is None or device_type != "cuda":
            raise GradaccError("Optimizer adamw-8bit needs bitsandbytes and a CUDA GPU; this run has "
                               f"{'no bitsandbytes' if importlib.util.find_spec('bitsandbytes') is None else 'no GPU'}.",
                               "optimizer")
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(groups, lr=lr)
    if name == "adamw-fused":
        try:
            return torch.optim.AdamW(groups, lr=lr, fused=True)
        except RuntimeError as error:  # torch checks the parameters' device against its fused kernels
            raise GradaccError(f"Optimizer adamw-fused is not supported here: {one_line(error, with_type=False)}",
                               "optimizer") from None
    return torch.optim.AdamW(groups, lr=lr)


def enable_gradient_checkpointing(model, name: str) -> None:
    """Recompute each layer's activations in backward instead of keeping them; non-reentrant, as torch advises
    (works with inputs that need no grad, and with the saved-tensor hooks that measure memory)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise GradaccError(f"Gradient checkpointing is not supported by {name}.", "gradient_checkpointing")
    # transformers 5's name for gradient_checkpointing_enable (the old one warns that it goes in v6).
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def activation_meter(job, model) -> memory.ActivationMeter:
    """The saved-tensor meter; with a memory budget every measured micro-batch is checked against it."""
    guard = job.memory_guard
    meter = memory.ActivationMeter(model, on_measured=guard.check_activations if guard else None)
    attach = getattr(job.model, "attach_meter", None)
    if attach is not None:  # GradCache saves its activations during backward: it measures them itself
        attach(meter)
    return meter


class Precision:
    """Autocast for the forward pass and, for fp16 on CUDA, a grad scaler around backward and step.

    bf16 needs no scaler (it has fp32's range). The plain loop calls ``scale(loss).backward()``, ``unscale`` (before clipping)
    and ``step``; Accelerate and Trainer get the same choice as their own ``mixed_precision`` / ``bf16``/``fp16``.
    """

    def __init__(self, config, device):
        self.device = torch.device(device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        if config.precision == "fp16" and self.device.type != "cuda":
            raise GradaccError("Precision fp16 needs a CUDA GPU (with a grad scaler); on the CPU use bf16.",
                               "precision")
        self.scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward()`` on: scaled up for fp16 (small gradients survive), else unchanged."""
        return self.scaler.scale(loss) if self.scaler else loss

    def unscale(self, optimizer) -> None:
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)  # skips the step when the scaled gradients overflowed
            self.scaler.update()
        else:
            optimizer.step()


def _skips_decay(name: str) -> bool:
    lowered = name.lower()
    return "bias" in lowered or "layernorm" in lowered or "layer_norm" in lowered or "rmsnorm" in lowered


def warmup_steps(config, total_steps: int) -> int:
    return math.ceil(config.warmup_ratio * total_steps)


def make_scheduler(optimizer, config, total_steps: int, calls_per_step: int = 1):
    """Linear warmup and decay over ``total_steps`` optimizer steps, for a scheduler whose ``step()`` is called
    ``calls_per_step`` times per optimizer step (Accelerate's prepared scheduler: once per process)."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, warmup_steps(config, total_steps) * calls_per_step,
                                           total_steps * calls_per_step)


def clip_gradients(model: torch.nn.Module, max_grad_norm: float, accelerator=None) -> float:
    """The total gradient norm before clipping; clips to ``max_grad_norm`` when it is positive (0: only measure).

    With an ``accelerator`` it clips through ``accelerator.clip_grad_norm_`` (which unscales mixed-precision
    gradients first), as Accelerate's docs ask; Trainer clips the same way inside its own loop.
    """
    limit = max_grad_norm if max_grad_norm > 0 else float("inf")
    if accelerator is not None:
        return float(accelerator.clip_grad_norm_(model.parameters(), limit))
    return float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], limit))


def check_finite(loss: torch.Tensor, step: int) -> None:
    """RunFailed("loss became NaN at step 3") as soon as a micro-batch's loss is not finite."""
    if not torch.isfinite(loss):
        kind = "NaN" if torch.isnan(loss) else "inf"
        raise RunFailed(f"loss became {kind} at step {step}")


def to_device(batch: dict, device) -> dict:
    return {key: value.to(device) for key, value in batch.items()}


def evaluate(model: torch.nn.Module, job) -> dict:
    """Example-weighted eval loss, accuracy and F1 over the eval set (as Trainer computes them); for a causal
    LM, token-weighted eval loss, perplexity and next-token accuracy.

    On several processes rank 0 evaluates the whole eval set on the unwrapped model and sends the numbers to
    the others: every example counts once (sharding would pad the last batch with repeats, which
    ``gather_for_metrics`` must drop again), token labels need no cross-rank padding, and eval sets here are
    small enough that splitting them would not pay. (Trainer shards and uses ``gather_for_metrics``.)
    """
    metrics = _evaluate(distributed.unwrap(model), job) if distributed.is_main_process() else None
    return distributed.from_main_process(metrics)


@torch.no_grad()
def _evaluate(model: torch.nn.Module, job) -> dict:
    was_training = model.training
    model.eval()
    if job.causal_lm:
        return _evaluate_causal_lm(model, job, was_training)
    if job.contrastive:
        from gradacc.training.contrastive import retrieval_metrics

        metrics = retrieval_metrics(model, job.eval_examples, job.collate, job.device, EVAL_BATCH_SIZE)
        model.train(was_training)
        return metrics
    total_loss, predictions, labels = 0.0, [], []
    for start in range(0, len(job.eval_examples), EVAL_BATCH_SIZE):
        chunk = job.eval_examples[start:start + EVAL_BATCH_SIZE]
        batch = to_device(job.collate(chunk), job.device)
        outputs = model(**batch)
        total_loss += float(outputs.loss) * len(chunk)
        labelled = batch["labels"] != -100  # token labels: skip padding and special tokens
        predictions.extend(outputs.logits.argmax(-1)[labelled].tolist())
        labels.extend(batch["labels"][labelled].tolist())
    model.train(was_training)
    scores = classification_metrics(predictions, labels, job.num_labels)
    return {"eval_loss": total_loss / len(job.eval_examples), "eval_accuracy": scores["accuracy"],
            "eval_f1": scores["f1"], "eval_majority_f1": scores["majority_f1"]}


def _evaluate_causal_lm(model: torch.nn.Module, job, was_training: bool) -> dict:
    losses, predictions, targets = [], [], []
    for start in range(0, len(job.eval_examples), EVAL_BATCH_SIZE):
        batch = to_device(job.collate(job.eval_examples[start:start + EVAL_BATCH_SIZE]), job.device)
        logits = model(**{key: value for key, value in batch.items() if key != "labels"}).logits
        token_losses, predicted, target = next_token_predictions(logits, batch["labels"])
        kept = target != -100
        losses.extend(token_losses[kept].tolist())
        predictions.extend(predicted[kept].tolist())
        targets.extend(target[kept].tolist())
    model.train(was_training)
    return language_model_metrics(losses, predictions, targets)


def next_token_predictions(logits: torch.Tensor, labels: torch.Tensor):
    """Per position of a causal LM's output: the loss of the next token, the predicted next token, and the
    next token itself (-100 where there is none). The same shift ``*ForCausalLM`` applies to its labels."""
    target = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=-100)
    token_losses = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), target, ignore_index=-100,
                                                     reduction="none")
    return token_losses, logits.argmax(-1), target


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
        # Set when the run asks for pitfalls: what the right loop would have done at each step (training.pitfalls).
        self.pitfall_probe = None
        self.started = time.perf_counter()
        # The training thread's CPU time measures a step's work whatever else the machine runs, where that thread
        # does all of it: on the CPU with one torch thread (events.StepEvent.cpu_s).
        self.thread = threading.get_ident()
        self.started_cpu = time.thread_time() if (torch.device(job.device).type == "cpu"
                                                  and torch.get_num_threads() == 1) else None

    def micro_batch(self, batch: dict) -> None:
        if self.job.memory_guard is not None:
            self.job.memory_guard.note_batch(batch)
        examples = batch_examples(batch)
        self.samples_seen += examples
        if self.pitfall_probe is not None:
            self.pitfall_probe.micro_batch(examples)
        # A contrastive micro-batch's tokens are those of its queries and its positives.
        self.tokens_seen += int(sum(value.sum() for key, value in batch.items() if key.endswith("attention_mask")))

    def step(self, window: WindowTally, *, step: int, epoch: int, grad_norm: float | None, lr: float) -> None:
        """The ``step`` event of the optimizer step that just ended ``window``; then ``window`` starts the next."""
        samples, tokens, loss_sum = distributed.sum_over_ranks([self.samples_seen, self.tokens_seen, window.loss],
                                                               self.job.device)
        activation_bytes = window.activation_bytes
        # CPU time read before wall time, as they were started in the other order: the CPU interval lies inside the
        # wall one, so one thread's CPU seconds never read above its wall seconds.
        cpu_s = self.cpu_seconds()
        elapsed_s = time.perf_counter() - self.started
        self.job.emit(events.step(step=step, epoch=epoch, samples_seen=int(samples), tokens_seen=int(tokens),
                                  micro_batches=window.micro_batches, loss=loss_sum / self.num_processes,
                                  grad_norm=grad_norm, lr=lr, elapsed_s=elapsed_s,
                                  memory=memory.snapshot(activation_bytes, self.job.device, self.job.config.instrument),
                                  sync_rounds=self.sync_probe.take() if self.sync_probe else None,
                                  pitfall=self.pitfall_probe.take() if self.pitfall_probe else None,
                                  cpu_s=cpu_s))
        memory.reset_cuda_peak(self.job.device)
        window.next_window()

    def cpu_seconds(self) -> float | None:
        """The training thread's CPU seconds since the run started; None where they do not measure its work."""
        if self.started_cpu is None or threading.get_ident() != self.thread:
            return None
        return time.thread_time() - self.started_cpu

    def evaluation(self, *, epoch: int, step: int, metrics: dict) -> None:
        named = {**metrics, "majority_f1": metrics.get("eval_majority_f1", metrics.get("majority_f1"))}
        self.job.emit(events.eval_(epoch=epoch, step=step, **{name: named.get(name) for name in events.EVAL_METRICS}))
