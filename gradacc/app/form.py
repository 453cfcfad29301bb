"""The Train form's logic without Streamlit: every problem of a config at once, counts, a data file's columns.

Pages stay thin: they draw widgets and show what this module says.
"""

from __future__ import annotations

from pathlib import Path

from gradacc import paths, recipes
from gradacc.choices import BUILTIN_DATASETS, BUILTIN_MODEL_TASKS, BUILTIN_MODELS
from gradacc.config import ConfigErrors, RunConfig, ValidConfig, too_few_examples
from gradacc.recipes import RECIPES, recipe_for
from gradacc.steps import total_optimizer_steps
from gradacc.labels import field_label
from gradacc.errors import GradaccError
from gradacc.serving.limits import Limits
from gradacc.training.sources import tables
from gradacc.training.sources import data as data_module
from gradacc.training.sources import models  # light: torch and transformers load only inside load()
from gradacc.training.tasks import dataset_refusal, task_of

# The built-in dataset's size when train_samples is not set (gradacc.training.sources.data uses the same).
BUILTIN_DEFAULT_TRAIN = 2000
BUILTIN_PAIRS_TRAIN = 3000  # training pairs of builtin-pairs (tests/training/test_contrastive.py checks the file)
GENERAL = "config"  # errors that belong to no single widget
DEFAULTS = RunConfig().check()  # the default run, its recipe filled in


def check(config: RunConfig, limits: Limits | None = None,
          train_examples: int | None = None) -> tuple[ValidConfig | None, dict[str, str]]:
    """``config`` checked once, where it enters: (the ValidConfig, {}) when ``RunConfig.check`` and the deployment's
    limits accept it (Start submits that object), else (None, {field: one sentence} for every field refused).

    The limits, local paths, task and data size are checked on the fields that passed the config's check, so
    the page shows every error next to its widget after one call."""
    try:
        checked, errors = config.check(), {}
        seen = checked
    except ConfigErrors as refused:
        checked, errors = None, refused.by_field
        # The checks below read the values that passed; a refused field stands at its default value, and what
        # they might say of it is dropped (the field keeps the check's sentence).
        defaults = DEFAULTS.to_dict()
        seen = RunConfig.from_dict({**refused.values, **{name: defaults.get(name) for name in errors}})
    found = (limits or Limits()).errors(seen) | local_path_errors(seen)
    if not {"task", "model", "dataset"} & errors.keys():  # they are checked together
        found |= task_errors(seen)
    if train_examples is not None and seen.micro_batch_size > train_examples:
        found["micro_batch_size"] = too_few_examples(seen.micro_batch_size, train_examples)
    for field, message in found.items():
        errors.setdefault(field, message)
    return (None, errors) if errors else (checked, {})


def local_path_errors(config: RunConfig) -> dict[str, str]:
    """A visitor's local model or dataset path refused as it is typed, as the run would refuse it at Start:
    outside the deployment's folders, missing, or (a model) not a safe-to-load model folder."""
    confinement = paths.Confinement.for_visitors()
    found = {}
    model, dataset = config.model.strip(), config.dataset.strip()
    try:
        if model not in BUILTIN_MODELS and paths.model_is_local(model):
            models.check_model_folder(confinement.model_path(model))
    except GradaccError as error:
        found["model"] = error.message
    try:
        if dataset not in BUILTIN_DATASETS and paths.dataset_is_local(dataset):
            if not confinement.data_path(dataset).exists():
                raise GradaccError(f"{field_label('dataset')} {dataset!r} does not exist.", "dataset")
    except GradaccError as error:
        found["dataset"] = error.message
    return found


# Recipe fields the Train page shows that move with its model (warm-up is not on the page: a run takes it from the
# recipe). The learning rate is not moved: its field shows recipes.learning_rate's answer for the form's model and
# optimizer (inputs.learning_rate_input), the visitor's own rate once they type one.
MOVING_RECIPE_FIELDS = ("epochs", "dropout", "max_seq_length")


def recipe_moves(old_model: str, new_model: str, values: dict, limits: Limits | None = None) -> dict:
    """The page's fields that move to ``new_model``'s recipe: those still at ``old_model``'s recipe value
    (the visitor has not touched them), as {field: new value}. A field the visitor changed keeps its value."""
    old, new = recipe_for(old_model), recipe_for(new_model)
    moves = {}
    for name in MOVING_RECIPE_FIELDS:
        was, becomes = getattr(old, name), getattr(new, name)
        if name == "epochs" and limits and limits.max_epochs:
            was, becomes = min(was, limits.max_epochs), min(becomes, limits.max_epochs)
        if values.get(name) == was and becomes != was:
            moves[name] = becomes
    return moves


def learning_rate_move(old: tuple[str, str], new: tuple[str, str], own: float | None) -> float | None:
    """The rate the form's field comes to show when its (model, optimizer) goes from ``old`` to ``new``, where that
    is news: the recipe's for ``new`` (recipes.learning_rate) if the visitor has no rate of their own and it differs.
    None: it stays, or empties (the recipe has none for ``new``: the check then asks for one, beside the field)."""
    if own is not None:
        return None
    was, becomes = recipes.learning_rate(*old), recipes.learning_rate(*new)
    return becomes if becomes is not None and becomes != was else None


def follow(old: tuple[str, str], new: tuple[str, str], values: dict, own_rate: float | None,
           limits: Limits | None = None, keep=()) -> tuple[dict, str | None]:
    """What the form's recipe fields do when its (model, optimizer) goes from ``old`` to ``new``: {field: value} of
    the fields that move (``recipe_moves``, except those in ``keep``), and the sentence that says what changed,
    the learning rate included (None: nothing changed). The Train page and a hand-off to it both follow this way."""
    (old_model, _), (model, optimizer) = old, new
    rate = learning_rate_move(old, new, own_rate)
    if old_model == model:  # the optimizer changed
        return {}, (describe_optimizer_move(model, optimizer, rate) if rate is not None else None)
    moves = {name: value for name, value in recipe_moves(old_model, model, values, limits).items()
             if name not in keep}
    shown = ({"learning_rate": rate} if rate is not None else {}) | moves
    return moves, (describe_moves(model, shown) if shown else None)


def describe_optimizer_move(model: str, optimizer: str, learning_rate: float) -> str:
    kind = f"{Path(model).name}'s recipe" if model in RECIPES else "the recipe for a pretrained model"
    return (f"Set to {kind} for {optimizer}: {field_label('learning_rate')} {learning_rate:g} (measured for it). "
            "A rate you typed keeps your value.")


def describe_moves(model: str, moves: dict) -> str:
    """'Learning rate 5e-05, Epochs 1: all-MiniLM-L6-v2's recipe.' for the page to say what it changed."""
    shown = ", ".join(f"{field_label(name)} {value:g}" for name, value in moves.items())
    kind = f"{Path(model).name}'s recipe" if model in RECIPES else "the recipe for a pretrained model"
    return f"Set to {kind}: {shown}. Fields you changed keep your values."


def describe_filled(source: str, filled: dict) -> str:
    """'Filled from the Memory planner: Micro-batch size (m) 8, Accumulation steps (k) 8, Gradient checkpointing
    on, ...': every field another page set on the form, by its label, in the order it was given."""

    def shown(value) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        return f"{value:g}" if isinstance(value, float) else str(value)

    return f"Filled from the {source}: " + ", ".join(f"{field_label(name)} {shown(value)}"
                                                     for name, value in filled.items()) + "."


def describe_dataset_move(model: str, dataset: str) -> str:
    return f"Dataset set to {dataset}, the built-in data for {model}."


def task_errors(config: RunConfig) -> dict[str, str]:
    """A model, task and built-in dataset that cannot go together, said before Start (no torch needed)."""
    task = task_of(config)
    model_task = BUILTIN_MODEL_TASKS.get(config.model)
    if task.models is not None:  # a task that trains its own models on its own data only
        if model_task is not None and config.model not in task.models:
            return {"task": f"Task {task.name} trains {task.models_words}, not {config.model}."}
        if config.dataset != task.default_dataset:
            return {"dataset": f"Task {task.name} trains on {task.default_dataset}, {task.data_words}."}
        return {}
    errors = {}
    if model_task is not None and model_task != task.name:
        errors["task"] = f"Task {task.name} does not fit {config.model}, a {model_task} model."
    refusal = dataset_refusal(task, config.dataset)
    if refusal:
        errors["dataset"] = refusal
    return errors


def optimizer_steps(config: ValidConfig, train_examples: int | None) -> int | None:
    """Optimizer steps the run will take; None when the data size is not known before loading."""
    if train_examples is None:
        return None
    return total_optimizer_steps(config, train_examples)


def known_train_examples(config: RunConfig) -> int | None:
    """Training examples of the built-in data without loading anything; None for other sources."""
    if config.dataset == "builtin-pairs":
        return min(config.train_samples or BUILTIN_PAIRS_TRAIN, BUILTIN_PAIRS_TRAIN)
    if config.dataset in BUILTIN_DATASETS:
        return config.train_samples or BUILTIN_DEFAULT_TRAIN
    return None


def count_train_examples(config: RunConfig) -> int:
    """Training examples after the eval split and the sample limit (reads a file; GradaccError if unusable)."""
    known = known_train_examples(config)
    if known is not None:
        return known
    return len(data_module.load_text_data(config, labelled=task_of(config).labelled).train_texts)


RUN_LABEL_MODEL_CHARS = 40


def run_label(config: RunConfig) -> str:
    """A short name for the run in Compare: backend, m×k, model as it was given (a long path keeps its end,
    marked with "…"; never just its last part, which would name "../../etc" "etc")."""
    model = config.model.strip()
    if len(model) > RUN_LABEL_MODEL_CHARS:
        model = "…" + model[-(RUN_LABEL_MODEL_CHARS - 1):]
    broken = f" · broken: {', '.join(config.pitfalls)}" if config.pitfalls else ""
    return (f"{config.backend} m{config.micro_batch_size}×k{config.grad_accum_steps} "
            f"{config.loss_normalization} · {model}{broken}")


def table_columns(path: str | Path) -> list[str]:
    """Column names of a CSV/JSONL file (GradaccError when it cannot be read)."""
    frame = tables.read_table(str(path))  # the loader's own reader: same checks, same messages
    return [str(c) for c in frame.columns]


def label_column_guess(path: str | Path, text_column: str | None) -> str | None:
    """The label column to pre-pick for an upload: the loader's own detection, else the first column that
    could be a label; never an id, free text or a single class (None when no column could be one)."""
    frame = tables.read_table(str(path))
    return tables.detect_label_column(frame, text_column) or \
        next(iter(tables.usable_label_columns(frame, text_column)), None)


def guess_column(columns: list[str], candidates) -> str | None:
    """The column the loader would pick by name (text, label, ...), or None."""
    lowered = {c.lower(): c for c in columns}
    return next((lowered[name] for name in candidates if name in lowered), None)
