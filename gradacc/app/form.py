"""The Train form's logic without Streamlit: every problem of a config at once, counts, a data file's columns.

Pages stay thin: they draw widgets and show what this module says.
"""

from __future__ import annotations

from pathlib import Path

from gradacc.training.sources import data as data_module
from gradacc import paths
from gradacc.choices import BUILTIN_DATASETS, BUILTIN_MODELS
from gradacc.config import RunConfig, too_few_examples
from gradacc.recipes import RECIPES, recipe_for
from gradacc.steps import total_optimizer_steps
from gradacc.labels import field_label
from gradacc.errors import GradaccError
from gradacc.serving.limits import Limits

# The built-in dataset's size when train_samples is not set (gradacc.training.sources.data uses the same).
BUILTIN_DEFAULT_TRAIN = 2000
BUILTIN_PAIRS_TRAIN = 3000  # training pairs of builtin-pairs (tests/training/test_contrastive.py checks the file)
GENERAL = "config"  # errors that belong to no single widget


def check(config: RunConfig, limits: Limits | None = None,
          train_examples: int | None = None) -> tuple[RunConfig | None, dict[str, str]]:
    """``config`` checked once, where it enters: (the validated config, {}) when ``RunConfig.validate`` and the
    deployment's limits accept it (Start submits that object, which is not validated again), else (None, {field: one
    sentence} for every field refused).

    ``validate`` stops at the first bad value; to show each message next to its own widget, a bad field
    is reset to its default on a copy and validation repeated until the rest pass.
    """
    candidate = config
    defaults = RunConfig()
    errors: dict[str, str] = {}
    for _ in range(len(candidate.to_dict()) + 1):
        try:
            candidate = candidate.validate()  # a checked copy; ``config`` is left as it is
            break
        except GradaccError as error:
            field = error.field if error.field and hasattr(defaults, error.field) else GENERAL
            if field in errors:  # resetting did not help; report and stop
                break
            errors[field] = error.message
            if field == GENERAL:
                break
            candidate = candidate.replace(**{field: getattr(defaults, field)})
    if not candidate.validated:
        candidate = candidate.resolved()  # as far as the resets went: the recipe filled in for the checks below
    for field, message in (limits or Limits()).errors(candidate).items():
        errors.setdefault(field, message)
    for field, message in local_path_errors(candidate).items():
        errors.setdefault(field, message)
    for field, message in task_errors(candidate).items():
        errors.setdefault(field, message)
    if train_examples is not None and "micro_batch_size" not in errors \
            and candidate.micro_batch_size > train_examples:
        errors["micro_batch_size"] = too_few_examples(candidate.micro_batch_size, train_examples)
    return (None, errors) if errors else (candidate, {})


def local_path_errors(config: RunConfig) -> dict[str, str]:
    """A visitor's local model or dataset path refused as it is typed, as the run would refuse it at Start:
    outside the deployment's folders, missing, or (a model) not a safe-to-load model folder."""
    from gradacc.training.sources import models  # light: torch and transformers load only inside load()

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


# Recipe fields the Train page shows (warm-up is not on the page: a run takes it from the recipe).
PAGE_RECIPE_FIELDS = ("learning_rate", "epochs", "dropout", "max_seq_length")


def recipe_moves(old_model: str, new_model: str, values: dict, limits: Limits | None = None,
                 optimizer: str = "adamw") -> dict:
    """The page's fields that move to ``new_model``'s recipe: those still at ``old_model``'s recipe value
    (the visitor has not touched them), as {field: new value}. A field the visitor changed keeps its value.
    The learning rate is the recipes' rate for the form's ``optimizer``; where either recipe has none, it stays."""
    old, new = recipe_for(old_model), recipe_for(new_model)
    moves = {}
    for name in PAGE_RECIPE_FIELDS:
        was, becomes = getattr(old, name), getattr(new, name)
        if name == "learning_rate":
            was, becomes = old.learning_rate_for(optimizer), new.learning_rate_for(optimizer)
            if was is None or becomes is None:
                continue
        if name == "epochs" and limits and limits.max_epochs:
            was, becomes = min(was, limits.max_epochs), min(becomes, limits.max_epochs)
        if values.get(name) == was and becomes != was:
            moves[name] = becomes
    return moves


def optimizer_rate_move(model: str, old_optimizer: str, new_optimizer: str, learning_rate) -> float | None:
    """The form's learning rate when the visitor switches ``old_optimizer`` for ``new_optimizer``: the new one's own
    rate from ``model``'s recipe if the field still holds the recipe's rate for the old one, so an optimizer never
    keeps another's rate unasked. None: the field stays (the visitor set it, or the recipe has no rate for the new
    optimizer; the page then warns, and a run with the field empty is refused)."""
    recipe = recipe_for(model)
    was, becomes = recipe.learning_rate_for(old_optimizer), recipe.learning_rate_for(new_optimizer)
    if was is None or becomes is None or learning_rate != was or becomes == was:
        return None
    return becomes


def describe_optimizer_move(model: str, optimizer: str, learning_rate: float) -> str:
    kind = f"{Path(model).name}'s recipe" if model in RECIPES else "the recipe for a pretrained model"
    return (f"Set to {kind} for {optimizer}: {field_label('learning_rate')} {learning_rate:g} (measured for it). "
            "A rate you typed keeps your value.")


def describe_moves(model: str, moves: dict) -> str:
    """'Learning rate 5e-05, Epochs 1: all-MiniLM-L6-v2's recipe.' for the page to say what it changed."""
    shown = ", ".join(f"{field_label(name)} {value:g}" for name, value in moves.items())
    kind = f"{Path(model).name}'s recipe" if model in RECIPES else "the recipe for a pretrained model"
    return f"Set to {kind}: {shown}. Fields you changed keep your values."


def describe_dataset_move(model: str, dataset: str) -> str:
    return f"Dataset set to {dataset}, the built-in data for {model}."


def task_errors(config: RunConfig) -> dict[str, str]:
    """A model, task and built-in dataset that cannot go together, said before Start (no torch needed)."""
    from gradacc.choices import BUILTIN_MODEL_TASKS, CAUSAL_LM, CONTRASTIVE, CONTRASTIVE_MODELS
    from gradacc.training.sources.models import infer_task

    task = infer_task(config)
    model_task = BUILTIN_MODEL_TASKS.get(config.model)
    if task == CONTRASTIVE:
        if model_task is not None and config.model not in CONTRASTIVE_MODELS:
            return {"task": f"Task contrastive trains a sentence-transformers model ({', '.join(CONTRASTIVE_MODELS)} "
                            f"or a folder), not {config.model}."}
        if config.dataset != "builtin-pairs":
            return {"dataset": "Task contrastive trains on builtin-pairs, (query, positive) pairs."}
        return {}
    if config.dataset == "builtin-pairs":
        return {"dataset": "Dataset builtin-pairs holds (query, positive) pairs: it is for the contrastive task."}
    if model_task is not None and model_task != task:
        return {"task": f"Task {task} does not fit {config.model}, a {model_task} model."}
    if config.dataset == "builtin-text" and task != CAUSAL_LM:
        return {"dataset": "Dataset builtin-text has no labels to classify: it is for the causal-lm task (tiny-gpt)."}
    return {}


def optimizer_steps(config: RunConfig, train_examples: int | None) -> int | None:
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
    return len(data_module.load_text_data(config).train_texts)


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
    frame = data_module.read_table(str(path))  # the loader's own reader: same checks, same messages
    return [str(c) for c in frame.columns]


def label_column_guess(path: str | Path, text_column: str | None) -> str | None:
    """The label column to pre-pick for an upload: the loader's own detection, else the first column that
    could be a label; never an id, free text or a single class (None when no column could be one)."""
    frame = data_module.read_table(str(path))
    return data_module.detect_label_column(frame, text_column) or \
        next(iter(data_module.usable_label_columns(frame, text_column)), None)


def guess_column(columns: list[str], candidates) -> str | None:
    """The column the loader would pick by name (text, label, ...), or None."""
    lowered = {c.lower(): c for c in columns}
    return next((lowered[name] for name in candidates if name in lowered), None)
