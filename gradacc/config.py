"""One run, as plain values: what a user asks for (RunConfig) and the same, checked (ValidConfig).

``RunConfig.check()`` is the one check: it returns a ValidConfig, or raises ConfigErrors naming every bad field at
once. Code below the entry points takes a ValidConfig and never checks again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gradacc import paths, recipes
from gradacc.choices import (BACKENDS, BUILTIN_DATASETS, BUILTIN_MODELS, FSDP_UNSHARDABLE, GRAD_SYNCS,
                             IN_BATCH_NEGATIVE_TASKS, LOSS_NORMALIZATIONS, OPTIMIZERS, PER_WINDOW, PITFALLS, PRECISIONS,
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


@dataclass(frozen=True)
class RunConfig:
    """A run as a user asks for it (the Python API, a JSON config file, the CLI's flags, the Train form).

    Unchecked: any value may be wrong until ``check()``. Frozen: a change is a new config (``replace``)."""

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
    # the recipe's value", and ``check()`` fills them in (the learning rate: recipes.learning_rate, the
    # recipe's rate for the run's optimizer). So a RunConfig says what the user set: None came from the recipe.
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
        """A copy with ``changes``; of a ValidConfig, a ValidConfig (checked anew: its values changed)."""
        return dataclasses.replace(self, **changes)

    @property
    def recipe(self) -> Recipe:
        return recipe_for(self.model)

    def check(self) -> "ValidConfig":
        """This config checked: a ValidConfig (the recipe filled in where a field is None, values normalised: 3.0
        steps → 3), or ConfigErrors naming every bad field at once. This config is left as it is.

        Called where a run enters (the Train page's form.check, the CLI, ``train``, a launched rank); the code
        after takes the ValidConfig, whose type says it was checked, and checks nothing again."""
        return ValidConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(frozen=True)
class ValidConfig(RunConfig):
    """A checked run config: every recipe field filled in, every value normalised and within its bounds.

    Only ever whole and valid: its constructor (which ``RunConfig.check`` and ``replace`` go through) raises
    ConfigErrors instead of making one with a bad value. Functions below the entry points take this type."""

    def __post_init__(self):
        values, errors = checked_values(self)
        if errors:
            raise ConfigErrors(errors, values)
        for name, value in values.items():
            object.__setattr__(self, name, value)  # the normalised values (frozen: set once, here)

    def check(self) -> "ValidConfig":
        return self


class ConfigErrors(GradaccError):
    """Every field a config refused, as {field: one sentence} (``by_field``), in the order of the checks.

    Its message and field are the first refusal's: a CLI, a log or ``run_ended`` says that one line.
    ``values`` holds every field as the check left it: resolved and normalised where it passed, as given where
    it was refused (a form runs its further checks, a deployment's limits, on the fields that passed)."""

    def __init__(self, errors: dict[str, str], values: dict):
        field, message = next(iter(errors.items()))
        super().__init__(message, field)
        self._errors, self.values = dict(errors), dict(values)

    @property
    def by_field(self) -> dict[str, str]:
        return dict(self._errors)

    def __reduce__(self):  # picklable with its own arguments (the default would pass only the message)
        return ConfigErrors, (self._errors, self.values)


class _Checks:
    """The values of one config being checked: normalised as they pass, the first sentence of each refused."""

    def __init__(self, config: RunConfig):
        self.values = {f.name: getattr(config, f.name) for f in dataclasses.fields(RunConfig)}
        self.errors: dict[str, str] = {}

    def passed(self, *names: str) -> bool:
        return not any(name in self.errors for name in names)

    def refuse(self, name: str, message: str) -> None:
        self.errors.setdefault(name, message)

    def take(self, name: str, check, *args) -> None:
        """``check(name, value, *args)``: the value normalised, or GradaccError (a refusal of its field)."""
        try:
            self.values[name] = check(name, self.values[name], *args)
        except GradaccError as error:
            self.refuse(error.field or name, error.message)


def checked_values(config: RunConfig) -> tuple[dict, dict[str, str]]:
    """Every field of ``config`` resolved (the recipe for each None) and normalised, and {field: sentence} for each
    field refused, first refusal first. ValidConfig's constructor is its one caller."""
    checks = _Checks(config)
    values = checks.values
    _resolve(values)
    checks.take("backend", _choice, BACKENDS)
    checks.take("loss_normalization", _choice, LOSS_NORMALIZATIONS)
    if values["task"] is not None:
        checks.take("task", _choice, TASKS)
    checks.take("model", _source, BUILTIN_MODELS, "a built-in model, a local folder or a hub id like org/name")
    checks.take("dataset", _source, BUILTIN_DATASETS, "built-in data, a local file or folder, or a hub id")
    checks.take("micro_batch_size", _integer, 1, MAX_MICRO_BATCH)
    checks.take("grad_accum_steps", _integer, 1, MAX_ACCUM_STEPS)
    checks.take("epochs", _integer, 1, 1000)
    if values["max_steps"] is not None:
        checks.take("max_steps", _integer, 1, 10_000_000)
    checks.take("optimizer", _choice, OPTIMIZERS)  # before the learning rate: the rate is the optimizer's
    if values["learning_rate"] is None:  # left unset, and the recipe has no rate for this optimizer
        if checks.passed("optimizer"):
            checks.refuse("learning_rate", no_recipe_rate(values["model"], values["optimizer"]))
    else:
        checks.take("learning_rate", _number, 0.0, 10.0, True)
    checks.take("warmup_ratio", _number, 0.0, 1.0)
    checks.take("weight_decay", _number, 0.0, 10.0)
    checks.take("max_grad_norm", _number, 0.0, 1e6)
    checks.take("dropout", _number, 0.0, 0.9)
    checks.take("seed", _integer, 0, 2**32 - 1)
    checks.take("max_seq_length", _integer, 8, MAX_SEQ_LEN)
    for name in ("train_samples", "eval_samples"):
        if values[name] is not None:
            checks.take(name, _integer, 1, 10_000_000)
    checks.take("num_processes", _integer, 1, 1024)
    checks.take("trainer_library_default", _switch, "true or false")
    _check_memory_levers(checks)
    _check_pitfalls(checks)
    _check_contrastive(checks)
    _check_sharding(checks)
    return values, checks.errors


def _resolve(values: dict) -> None:
    """Each recipe field left None takes the model's recipe; the learning rate is the run's optimizer's."""
    values["learning_rate"] = recipes.learning_rate(values["model"], values["optimizer"], values["learning_rate"])
    recipe = recipe_for(values["model"])
    for name in RECIPE_FIELDS:
        if values[name] is None and name != "learning_rate":
            values[name] = getattr(recipe, name)


def _check_memory_levers(checks: _Checks) -> None:
    values = checks.values
    if values["memory_budget_mb"] is not None:
        if checks.passed("model") and values["model"] in SINGLE_EXAMPLE_UNMEASURABLE:
            checks.refuse("memory_budget_mb", f"{field_label('memory_budget_mb')} cannot be measured for "
                          f"{values['model']}: the budget probes one example alone, which BatchNorm cannot train on; "
                          "leave it empty.")
        checks.take("memory_budget_mb", _budget)
    checks.take("gradient_checkpointing", _switch, "on or off")
    checks.take("precision", _choice, PRECISIONS)


def _check_pitfalls(checks: _Checks) -> None:
    values, label = checks.values, field_label("pitfalls")
    pitfalls = values["pitfalls"]
    if isinstance(pitfalls, str) or not isinstance(pitfalls, (list, tuple)):
        checks.refuse("pitfalls", f"{label} must be a list of names; got {_shown(pitfalls)}.")
        return
    unknown = [name for name in pitfalls if not isinstance(name, str) or name not in PITFALLS]
    if unknown:
        checks.refuse("pitfalls", f"{label} must be among {', '.join(PITFALLS)}; got {_shown(unknown[0])}.")
        return
    values["pitfalls"] = pitfalls = list(dict.fromkeys(pitfalls))
    if not pitfalls:
        return
    if checks.passed("backend") and values["backend"] != "pytorch":
        checks.refuse("pitfalls", f"{label}: only the plain PyTorch loop has them (backend pytorch); this run's "
                      f"backend is {values['backend']}.")
    if checks.passed("num_processes") and values["num_processes"] > 1:
        checks.refuse("pitfalls", f"{label}: one process only (their effects are measured on one process's "
                      f"gradients); this run has {values['num_processes']}.")
    if checks.passed("precision") and values["precision"] == "fp16":
        checks.refuse("pitfalls", f"{label}: precision fp32 or bf16 only (their effects are measured on unscaled "
                      "gradients); this run uses fp16.")


def _check_contrastive(checks: _Checks) -> None:
    values = checks.values
    contrastive = values["task"] in IN_BATCH_NEGATIVE_TASKS  # gradacc.training.tasks.Task.in_batch_negatives
    if values["gradcache_mini_batch"] is not None:
        if not contrastive:
            checks.refuse("gradcache_mini_batch", f"{field_label('gradcache_mini_batch')} is for the contrastive "
                          f"task only; leave it empty for {values['task'] or 'this task'}.")
        elif checks.passed("micro_batch_size"):
            checks.take("gradcache_mini_batch", _integer, 1, values["micro_batch_size"])
    if not contrastive:
        return
    if checks.passed("num_processes") and values["num_processes"] > 1:
        checks.refuse("num_processes", "Task contrastive runs on one process: its in-batch negatives are the "
                      "micro-batch's own.")
    if values["memory_budget_mb"] is not None:
        checks.refuse("memory_budget_mb", f"{field_label('memory_budget_mb')} is not measured for the contrastive "
                      "task yet; leave it empty.")


def _check_sharding(checks: _Checks) -> None:
    values = checks.values
    checks.take("fsdp", _switch, "on or off")
    checks.take("grad_sync", _choice, GRAD_SYNCS)
    if not checks.passed("fsdp", "grad_sync"):
        return
    if not values["fsdp"]:
        if values["grad_sync"] != PER_WINDOW:
            checks.refuse("grad_sync", f"{field_label('grad_sync')} {values['grad_sync']} is for sharded runs (FSDP); "
                          "a DDP run all-reduces once per window.")
        return
    if checks.passed("num_processes") and values["num_processes"] < 2:
        checks.refuse("fsdp", f"{field_label('fsdp')} needs 2 or more processes (torchrun --nproc_per_node N, or "
                      f"accelerate launch --multi_gpu --num_processes N); this run has {values['num_processes']}.")
    model = values["model"].strip() if checks.passed("model") else None
    if model in FSDP_UNSHARDABLE:
        checks.refuse("model", f"{field_label('model')} {model} cannot be sharded with FSDP: "
                      f"{FSDP_UNSHARDABLE[model]}.")
    refused = {"memory_budget_mb": (values["memory_budget_mb"] is not None, "it measures what an unsharded model "
                                    "needs; leave it empty (the Memory planner page estimates a sharded run)"),
               "precision": (values["precision"] == "fp16", "its grad scaler is not checked with sharded gradients; "
                             "use bf16 or fp32"),
               "optimizer": (values["optimizer"] in FSDP_OPTIMIZERS_REFUSED,
                             f"{FSDP_OPTIMIZERS_REFUSED.get(values['optimizer'])}; use adamw, adamw-fused or sgd")}
    for name, (bad, why) in refused.items():
        if bad and checks.passed(name):
            checks.refuse(name, f"{field_label(name)} {_shown(values[name])} does not work on a sharded run (FSDP): "
                          f"{why}.")


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
    if not isinstance(value, str) or value not in allowed:
        raise GradaccError(f"{field_label(name)} must be one of {', '.join(allowed)}; got {_shown(value)}.", name)
    return value


def _switch(name, value, words):
    if not isinstance(value, bool):
        raise GradaccError(f"{field_label(name)} must be {words}; got {_shown(value)}.", name)
    return value


def _text(name, value):
    if not isinstance(value, str) or not value.strip():
        raise GradaccError(f"{field_label(name)} must be a name or a path; got nothing.", name)


def _source(name, value, builtin, what):
    """A built-in name, a local path, or a syntactically valid hub id (checked offline, before any download)."""
    _text(name, value)
    stripped = value.strip()
    is_local = paths.model_is_local if name == "model" else paths.dataset_is_local
    if stripped in builtin or is_local(stripped):
        return value
    problem = paths.hub_id_problem(stripped)
    if problem:
        raise GradaccError(f"{field_label(name)} must be {what}; got {stripped!r}, which is not a valid hub id "
                           f"({problem[0].lower() + problem[1:]}).", name)
    return value


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


def _budget(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not 0 < value <= MAX_MEMORY_BUDGET_MB:
        raise GradaccError(f"{field_label(name)} must be a number greater than 0 and at most "
                           f"{MAX_MEMORY_BUDGET_MB:,.0f}, or empty for no budget; got {_shown(value)}.", name)
    return float(value)
