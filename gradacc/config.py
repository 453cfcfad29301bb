"""One run, as plain values, and the checks that keep bad values away from torch."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gradacc import paths
from gradacc.choices import (BACKENDS, BUILTIN_DATASETS, BUILTIN_MODELS, CONTRASTIVE, FSDP_UNSHARDABLE, GRAD_SYNCS,
                             LOSS_NORMALIZATIONS, OPTIMIZERS, PER_WINDOW, PITFALLS, PRECISIONS,
                             SINGLE_EXAMPLE_UNMEASURABLE, TASKS)
from gradacc.errors import GradaccError
from gradacc.labels import field_label
from gradacc.recipes import RECIPE_FIELDS, Recipe, no_recipe_rate, recipe_for
from gradacc.steps import effective_batch

MAX_MEMORY_BUDGET_MB = 10_000_000.0
MAX_MICRO_BATCH = 4096
MAX_ACCUM_STEPS = 4096
MAX_SEQ_LEN = 512
# Optimizers a sharded run refuses, and why: FSDP's parameters are DTensors.
FSDP_OPTIMIZERS_REFUSED = {"adafactor": "transformers' Adafactor cannot step sharded (DTensor) parameters",
                           "adamw-8bit": "bitsandbytes' 8-bit AdamW is not checked with sharded (DTensor) parameters"}


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
    # k, the micro-batches accumulated per optimizer step. gradacc's code calls it grad_accum_steps everywhere
    # (the CLI's --grad-accum-steps); only the libraries' own parameters keep their name for it:
    # TrainingArguments(gradient_accumulation_steps=...), Accelerator(gradient_accumulation_steps=...).
    grad_accum_steps: int = 4
    # Fields typed ``X | None = None`` below are the model's recipe (RECIPES): None means "not set, take
    # the recipe's value", and ``resolved()``/``validate()`` fill them in. So a value's origin is known
    # until the config is resolved: None came from the recipe, anything else from the user.
    epochs: int | None = None
    max_steps: int | None = None
    learning_rate: float | None = None
    warmup_ratio: float | None = None
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    max_seq_length: int | None = None
    train_samples: int | None = 2000
    eval_samples: int | None = 400
    loss_normalization: str = "exact"
    # Dropout of the built-in model; 0 makes the three backends give the same curve.
    dropout: float | None = None
    # Processes of a data-parallel run (set by the launcher, not chosen per run).
    num_processes: int = 1
    # Measure activation bytes with saved-tensor hooks and RSS at every optimizer step.
    instrument: bool = True
    # A device budget: the run measures what it needs before step 1 and fails like out-of-memory past it.
    memory_budget_mb: float | None = None
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    optimizer: str = "adamw"
    # Trainer only: leave Trainer's own loss scaling as the library does it (k× too large on BERT in
    # transformers 5) instead of gradacc's compute_loss_func; shows the pitfall.
    trainer_library_default: bool = False
    # Plain PyTorch loop only: the PITFALLS names whose wrong line this run executes on purpose (none: the right loop).
    pitfalls: list[str] = field(default_factory=list)
    # Contrastive task only: None trains with MultipleNegativesRankingLoss on each micro-batch; a number trains
    # with CachedMultipleNegativesRankingLoss (GradCache), embedding mini-batches of this many texts.
    gradcache_mini_batch: int | None = None
    # Several processes: shard parameters, gradients and optimizer state over them (FSDP2) instead of replicating
    # the model (DDP); grad_sync says when a sharded run reduce-scatters gradients while it accumulates (GRAD_SYNCS).
    fsdp: bool = False
    grad_sync: str = PER_WINDOW

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

    @property
    def recipe(self) -> Recipe:
        return recipe_for(self.model if isinstance(self.model, str) else None)

    def unset_fields(self) -> list[str]:
        """Recipe fields the user left unset (they take the model's recipe)."""
        return [name for name in RECIPE_FIELDS if getattr(self, name) is None]

    def resolved(self) -> "RunConfig":
        """A copy with the recipe filled in (this config is left as it is)."""
        recipe = self.recipe
        values = {name: getattr(recipe, name) for name in self.unset_fields()}
        if "learning_rate" in values and isinstance(self.optimizer, str):
            # The rate of the run's own optimizer: None where the recipe has none (validate refuses it).
            values["learning_rate"] = recipe.learning_rate_for(self.optimizer)
        return dataclasses.replace(self, **values)

    def __setattr__(self, name: str, value) -> None:
        # Any change makes a config unchecked again: validate() then checks it anew instead of returning it.
        object.__setattr__(self, "_validated", False)
        object.__setattr__(self, name, value)

    @property
    def validated(self) -> bool:
        """Whether ``validate()`` returned this config (and nothing changed it since)."""
        return self.__dict__.get("_validated", False)

    def validate(self) -> "RunConfig":
        """A resolved, checked copy: unset fields filled from the recipe, values normalised (3.0 steps → 3);
        GradaccError with one sentence for the first bad value. This config is left as it is.

        A config is validated where it enters (the Train page, the CLI, ``train``, a launched rank); the hops
        after pass the returned object on, and ``validate()`` on it returns it as it is."""
        if self.validated:
            return self
        checked = self.resolved()
        checked._check()
        object.__setattr__(checked, "_validated", True)
        return checked

    def _check(self) -> None:
        """``validate``'s checks, normalising this (fresh) copy's values in place."""
        _choice("backend", self.backend, BACKENDS)
        _choice("loss_normalization", self.loss_normalization, LOSS_NORMALIZATIONS)
        if self.task is not None:
            _choice("task", self.task, TASKS)
        _source("model", self.model, BUILTIN_MODELS, "a built-in model, a local folder or a hub id like org/name")
        _source("dataset", self.dataset, BUILTIN_DATASETS, "built-in data, a local file or folder, or a hub id")
        self.micro_batch_size = _integer("micro_batch_size", self.micro_batch_size, 1, MAX_MICRO_BATCH)
        self.grad_accum_steps = _integer("grad_accum_steps", self.grad_accum_steps, 1, MAX_ACCUM_STEPS)
        self.epochs = _integer("epochs", self.epochs, 1, 1000)
        if self.max_steps is not None:
            self.max_steps = _integer("max_steps", self.max_steps, 1, 10_000_000)
        if self.learning_rate is None:  # left unset, and the recipe has no rate for this optimizer
            _choice("optimizer", self.optimizer, OPTIMIZERS)
            raise GradaccError(no_recipe_rate(self.model, self.optimizer), "learning_rate")
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
        if not isinstance(self.trainer_library_default, bool):
            raise GradaccError(f"{field_label('trainer_library_default')} must be true or false; "
                               f"got {self.trainer_library_default!r}.", "trainer_library_default")
        self._validate_memory_levers()
        self._validate_pitfalls()
        self._validate_contrastive()
        self._validate_sharding()

    def _validate_pitfalls(self) -> None:
        label = field_label("pitfalls")
        if isinstance(self.pitfalls, str) or not isinstance(self.pitfalls, (list, tuple)):
            raise GradaccError(f"{label} must be a list of names; got {_shown(self.pitfalls)}.", "pitfalls")
        for name in self.pitfalls:
            if not isinstance(name, str) or name not in PITFALLS:
                raise GradaccError(f"{label} must be among {', '.join(PITFALLS)}; got {_shown(name)}.", "pitfalls")
        self.pitfalls = list(dict.fromkeys(self.pitfalls))
        if not self.pitfalls:
            return
        if self.backend != "pytorch":
            raise GradaccError(f"{label}: only the plain PyTorch loop has them (backend pytorch); this run's backend "
                               f"is {self.backend}.", "pitfalls")
        if self.num_processes > 1:
            raise GradaccError(f"{label}: one process only (their effects are measured on one process's "
                               f"gradients); this run has {self.num_processes}.", "pitfalls")
        if self.precision == "fp16":
            raise GradaccError(f"{label}: precision fp32 or bf16 only (their effects are measured on unscaled "
                               "gradients); this run uses fp16.", "pitfalls")

    def _validate_contrastive(self) -> None:
        if self.gradcache_mini_batch is not None:
            if self.task != CONTRASTIVE:
                raise GradaccError(f"{field_label('gradcache_mini_batch')} is for the contrastive task only; "
                                   f"leave it empty for {self.task or 'this task'}.", "gradcache_mini_batch")
            self.gradcache_mini_batch = _integer("gradcache_mini_batch", self.gradcache_mini_batch, 1,
                                                 self.micro_batch_size)
        if self.task != CONTRASTIVE:
            return
        if self.num_processes > 1:
            raise GradaccError("Task contrastive runs on one process: its in-batch negatives are the micro-batch's "
                               "own.", "num_processes")
        if self.memory_budget_mb is not None:
            raise GradaccError(f"{field_label('memory_budget_mb')} is not measured for the contrastive task yet; "
                               "leave it empty.", "memory_budget_mb")

    def _validate_sharding(self) -> None:
        if not isinstance(self.fsdp, bool):
            raise GradaccError(f"{field_label('fsdp')} must be on or off; got {_shown(self.fsdp)}.", "fsdp")
        _choice("grad_sync", self.grad_sync, GRAD_SYNCS)
        if not self.fsdp:
            if self.grad_sync != PER_WINDOW:
                raise GradaccError(f"{field_label('grad_sync')} {self.grad_sync} is for sharded runs (FSDP); a DDP run "
                                   "all-reduces once per window.", "grad_sync")
            return
        if self.num_processes < 2:
            raise GradaccError(f"{field_label('fsdp')} needs 2 or more processes (torchrun --nproc_per_node N, or "
                               f"accelerate launch --multi_gpu --num_processes N); this run has {self.num_processes}.",
                               "fsdp")
        model = self.model.strip()
        if model in FSDP_UNSHARDABLE:
            raise GradaccError(f"{field_label('model')} {model} cannot be sharded with FSDP: {FSDP_UNSHARDABLE[model]}.",
                               "model")
        refused = {"memory_budget_mb": (self.memory_budget_mb is not None, "it measures what an unsharded model "
                                        "needs; leave it empty (the Memory planner page estimates a sharded run)"),
                   "precision": (self.precision == "fp16", "its grad scaler is not checked with sharded gradients; "
                                 "use bf16 or fp32"),
                   "optimizer": (self.optimizer in FSDP_OPTIMIZERS_REFUSED,
                                 f"{FSDP_OPTIMIZERS_REFUSED.get(self.optimizer)}; use adamw, adamw-fused or sgd")}
        for name, (bad, why) in refused.items():
            if bad:
                raise GradaccError(f"{field_label(name)} {_shown(getattr(self, name))} does not work on a sharded run "
                                   f"(FSDP): {why}.", name)

    def _validate_memory_levers(self) -> None:
        if self.memory_budget_mb is not None and self.model in SINGLE_EXAMPLE_UNMEASURABLE:
            raise GradaccError(f"{field_label('memory_budget_mb')} cannot be measured for {self.model}: the budget probes "
                               "one example alone, which BatchNorm cannot train on; leave it empty.", "memory_budget_mb")
        if self.memory_budget_mb is not None:
            value = self.memory_budget_mb
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
                    or not 0 < value <= MAX_MEMORY_BUDGET_MB:
                raise GradaccError(f"{field_label('memory_budget_mb')} must be a number greater than 0 and at most "
                                   f"{MAX_MEMORY_BUDGET_MB:,.0f}, or empty for no budget; got {_shown(value)}.",
                                   "memory_budget_mb")
            self.memory_budget_mb = float(value)
        if not isinstance(self.gradient_checkpointing, bool):
            raise GradaccError(f"{field_label('gradient_checkpointing')} must be on or off; "
                               f"got {_shown(self.gradient_checkpointing)}.", "gradient_checkpointing")
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)


def too_few_examples(micro_batch_size: int, train_examples: int) -> str:
    """The sentence for a micro-batch larger than the training set (checked where the data size is known)."""
    return (f"{field_label('micro_batch_size')} must be at most the {train_examples} training examples; "
            f"got {micro_batch_size}.")


def _count(value: int) -> str:
    return f"{value:,}" if abs(value) >= 10_000 else str(value)


def _shown(value) -> str:
    """A refused value as the person typed it: numbers plain, anything else quoted."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}" if isinstance(value, float) else str(value)
    return repr(value)


def _choice(name, value, allowed):
    if value not in allowed:
        raise GradaccError(f"{field_label(name)} must be one of {', '.join(allowed)}; got {_shown(value)}.", name)


def _text(name, value):
    if not isinstance(value, str) or not value.strip():
        raise GradaccError(f"{field_label(name)} must be a name or a path; got nothing.", name)


def _source(name, value, builtin, what):
    """A built-in name, a local path, or a syntactically valid hub id (checked offline, before any download)."""
    _text(name, value)
    value = value.strip()
    local = paths.model_is_local(value) if name == "model" else paths.dataset_is_local(value)
    if value in builtin or local:
        return
    problem = paths.hub_id_problem(value)
    if problem:
        raise GradaccError(f"{field_label(name)} must be {what}; got {value!r}, which is not a valid hub id "
                           f"({problem[0].lower() + problem[1:]}).", name)


def _integer(name, value, low, high):
    """A whole number in [low, high]; 4.0 is 4, but 2.5 is refused, never rounded."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or not low <= value <= high:
        raise GradaccError(f"{field_label(name)} must be a whole number from {_count(low)} to {_count(high)}; "
                           f"got {_shown(value)}.", name)
    return value


def _number(name, value, low, high, low_open=False):
    label = field_label(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GradaccError(f"{label} must be a number; got {_shown(value)}.", name)
    if math.isnan(value) or math.isinf(value):
        raise GradaccError(f"{label} must be a finite number; got {value}.", name)
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
        raise GradaccError(f"{label} must be {bound} and at most {high:g}; got {value:g}.", name)
    return float(value)
