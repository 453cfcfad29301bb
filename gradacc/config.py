"""One run, as plain values, and the checks that keep bad values away from torch."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gradacc.errors import GradaccError

BACKENDS = ("pytorch", "accelerate", "trainer")
LOSS_NORMALIZATIONS = ("exact", "naive")
CLASSIFICATION, CAUSAL_LM = "classification", "causal-lm"
TASKS = (CLASSIFICATION, CAUSAL_LM)
BUILTIN_MODELS = ("tiny-bert", "all-MiniLM-L6-v2", "tiny-gpt")
BUILTIN_DATASETS = ("builtin-sentiment", "builtin-text")
# What each built-in model is for: a run that names no task gets its model's.
BUILTIN_MODEL_TASKS = {"tiny-bert": CLASSIFICATION, "all-MiniLM-L6-v2": CLASSIFICATION, "tiny-gpt": CAUSAL_LM}

MAX_MICRO_BATCH = 4096
MAX_ACCUM_STEPS = 4096
MAX_SEQ_LEN = 512


@dataclass
class RunConfig:
    backend: str = "pytorch"
    model: str = "tiny-bert"
    dataset: str = "builtin-sentiment"
    # classification or causal-lm; None: the model's (a *ForCausalLM architecture or tiny-gpt is causal-lm).
    task: str | None = None
    # Columns of a CSV/JSONL/saved dataset; None means detect them.
    text_column: str | None = None
    label_column: str | None = None
    # Split of a hub dataset id (online only).
    dataset_split: str = "train"
    micro_batch_size: int = 8
    grad_accum_steps: int = 4
    epochs: int = 2
    max_steps: int | None = None
    learning_rate: float = 1e-3
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    max_seq_length: int = 64
    train_samples: int | None = 2000
    eval_samples: int | None = 400
    loss_normalization: str = "exact"
    # Dropout of the built-in model; 0 makes the three backends give the same curve.
    dropout: float = 0.1
    # Processes of a data-parallel run (set by the launcher, not chosen per run).
    num_processes: int = 1
    # Measure activation bytes with saved-tensor hooks and RSS at every optimizer step.
    instrument: bool = True

    @property
    def effective_batch(self) -> int:
        return effective_batch(self.micro_batch_size, self.grad_accum_steps, self.num_processes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def validate(self) -> "RunConfig":
        """Raise GradaccError with one sentence for the first bad value; return self."""
        _choice("backend", self.backend, BACKENDS)
        _choice("loss_normalization", self.loss_normalization, LOSS_NORMALIZATIONS)
        if self.task is not None:
            _choice("task", self.task, TASKS)
        _text("model", self.model)
        _text("dataset", self.dataset)
        self.micro_batch_size = _integer("micro_batch_size", self.micro_batch_size, 1, MAX_MICRO_BATCH)
        self.grad_accum_steps = _integer("grad_accum_steps", self.grad_accum_steps, 1, MAX_ACCUM_STEPS)
        self.epochs = _integer("epochs", self.epochs, 1, 1000)
        if self.max_steps is not None:
            self.max_steps = _integer("max_steps", self.max_steps, 1, 10_000_000)
        self.learning_rate = _number("learning_rate", self.learning_rate, low=0.0, high=10.0, low_open=True)
        self.warmup_ratio = _number("warmup_ratio", self.warmup_ratio, low=0.0, high=1.0)
        self.weight_decay = _number("weight_decay", self.weight_decay, low=0.0, high=10.0)
        self.max_grad_norm = _number("max_grad_norm", self.max_grad_norm, low=0.0, high=1e6)
        self.dropout = _number("dropout", self.dropout, low=0.0, high=0.9)
        self.seed = _integer("seed", self.seed, 0, 2**32 - 1)
        self.max_seq_length = _integer("max_seq_length", self.max_seq_length, 8, MAX_SEQ_LEN)
        if self.train_samples is not None:
            self.train_samples = _integer("train_samples", self.train_samples, 1, 10_000_000)
        if self.eval_samples is not None:
            self.eval_samples = _integer("eval_samples", self.eval_samples, 1, 10_000_000)
        self.num_processes = _integer("num_processes", self.num_processes, 1, 1024)
        return self


def effective_batch(micro_batch_size: int, grad_accum_steps: int, num_processes: int = 1) -> int:
    """Examples behind one optimizer step: the one place this product is computed."""
    return micro_batch_size * grad_accum_steps * num_processes


def micro_batches_per_epoch(num_examples: int, micro_batch_size: int, num_processes: int = 1) -> int:
    """Micro-batches one process sees in an epoch (the last may be short)."""
    per_process = math.ceil(num_examples / num_processes)
    return math.ceil(per_process / micro_batch_size)


def optimizer_steps_per_epoch(num_examples: int, micro_batch_size: int, grad_accum_steps: int,
                              num_processes: int = 1) -> int:
    """ceil(ceil(N/m)/k): the short last window is flushed as a real step."""
    return math.ceil(micro_batches_per_epoch(num_examples, micro_batch_size, num_processes) / grad_accum_steps)


def total_optimizer_steps(config: RunConfig, num_examples: int) -> int:
    per_epoch = optimizer_steps_per_epoch(num_examples, config.micro_batch_size, config.grad_accum_steps,
                                          config.num_processes)
    total = per_epoch * config.epochs
    return min(total, config.max_steps) if config.max_steps else total


def _label(name: str) -> str:
    return name.replace("_", " ")


def _choice(name, value, allowed):
    if value not in allowed:
        raise GradaccError(f"{_label(name)} must be one of {', '.join(allowed)}; got {value!r}.", name)


def _text(name, value):
    if not isinstance(value, str) or not value.strip():
        raise GradaccError(f"{_label(name)} must be a non-empty name or path.", name)


def _integer(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise GradaccError(f"{_label(name)} must be a whole number from {low} to {high}; got {value!r}.", name)
    if not low <= value <= high:
        raise GradaccError(f"{_label(name)} must be from {low} to {high}; got {value}.", name)
    return value


def _number(name, value, low, high, low_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GradaccError(f"{_label(name)} must be a number; got {value!r}.", name)
    if math.isnan(value) or math.isinf(value):
        raise GradaccError(f"{_label(name)} must be a finite number; got {value}.", name)
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
        raise GradaccError(f"{_label(name)} must be {bound} and at most {high:g}; got {value:g}.", name)
    return float(value)
