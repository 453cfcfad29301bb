"""The form inputs pages share: labelled number fields with their error slots, backend and accumulation, the
training settings, memory and levers, model, task and dataset pickers (uploads included)."""

from __future__ import annotations

import importlib.util
import math

import streamlit as st

from gradacc.app import form
from gradacc.choices import (BACKENDS, BUILTIN_DATASETS, BUILTIN_MODELS, GRAD_SYNCS, LOSS_NORMALIZATIONS, OPTIMIZERS,
                             PER_WINDOW, PITFALLS, PRECISIONS, TASKS)
from gradacc.config import RunConfig
from gradacc import recipes
from gradacc.recipes import default_dataset
from gradacc.labels import field_label
from gradacc.errors import GradaccError
from gradacc.serving import uploads
from gradacc.serving.limits import Limits
from gradacc.training.sources.tables import TEXT_COLUMNS
from gradacc.training.sources.data import FILE_SUFFIXES
from gradacc.training.sources.models import infer_task  # reads a folder's config.json at most, no torch


# Keys of the form widgets; they are created with persist_state="session", so a visitor's settings
# survive a trip to another page.
FORM = "form."
BACKEND_NAMES = {"pytorch": "PyTorch loop", "accelerate": "🤗 Accelerate", "trainer": "🤗 Trainer"}
NORMALIZATION_NAMES = {"exact": "exact (weight by items in the window)", "naive": "naive (each mean ÷ k)"}
OTHER_MODEL = "other: hub id or local folder"
UPLOAD_DATASET = "upload a CSV / JSONL file"
OTHER_DATASET = "other: hub id or local path"


def defaults(values: dict) -> None:
    """Initial widget values, set through session state so widgets need no ``value=`` (no double source)."""
    for key, value in values.items():
        st.session_state.setdefault(key, value)


class FieldErrors:
    """Room right under each widget for its error, filled once every value is known; and the number fields the
    visitor emptied (``empty``: {field: the sentence that says so}), which no check of the value can word."""

    def __init__(self):
        self._slots: dict[str, object] = {}
        self.empty: dict[str, str] = {}

    def slot(self, *fields: str) -> None:
        room = st.container()
        for field in fields:
            self._slots[field] = room

    def show(self, errors: dict[str, str], elsewhere) -> None:
        """Each message under its widget; messages of fields without a widget go to ``elsewhere``. An emptied field
        says it is empty, whatever a check made of its None ("got None"), or if a check took None for a default."""
        for field, message in (errors | self.empty).items():
            self._slots.get(field, elsewhere).error(message)


def number_field(prefix: str, field: str, errors: FieldErrors, *, whole: bool = True, may_be_empty: bool = False,
                 **options):
    """A number input labelled as ``labels.FIELD_LABELS`` says, with its error slot right under it; its first value
    comes from session state (``defaults``).

    A whole-number field is a float input shown with ``%g``: the browser's integer input turns a typed 2.5
    into 2 without a word, while this passes 2.5 on for ``RunConfig.check`` to refuse. Whole values
    come back as ``int``.

    A field the visitor empties gives None and is said to be empty (``errors.empty``) unless ``may_be_empty``: a
    field that cannot be empty would read 0, and the check then answered "got 0" to a visitor who typed nothing.
    """
    if whole:
        options.setdefault("format", "%g")
        options["step"] = float(options.get("step", 1))
    value = st.number_input(field_label(field), key=prefix + field, persist_state="session", value=None, **options)
    errors.slot(field)
    if value is None and not may_be_empty:
        errors.empty[field] = f"{field_label(field)} is empty: type {'a whole number' if whole else 'a number'}."
    if whole and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def accumulation_inputs(prefix: str, errors: FieldErrors, widths: list) -> tuple[str, int, int, list]:
    """Backend, micro-batch size and accumulation steps in a row of columns; returns them and the columns.

    ``widths`` has at least three entries; columns past the third are returned for the page's own widgets.
    """
    backend_column, m_column, k_column, *extra_columns = st.columns(widths)
    with backend_column:
        backend = st.radio(field_label("backend"), BACKENDS, key=prefix + "backend", persist_state="session",
                           format_func=BACKEND_NAMES.get, horizontal=True)
    with m_column:
        micro_batch_size = number_field(prefix, "micro_batch_size", errors)
    with k_column:
        grad_accum_steps = number_field(prefix, "grad_accum_steps", errors)
    return backend, micro_batch_size, grad_accum_steps, [backend_column, *extra_columns]


def training_inputs(prefix: str, errors: FieldErrors, model: str) -> dict:
    """The Train form's accumulation and training settings, each with its error slot: {RunConfig field: value}."""
    left, right = st.columns(2)
    with left:
        values = {"micro_batch_size": number_field(prefix, "micro_batch_size", errors,
                                                   help="Examples per forward/backward pass: what must fit in memory."),
                  "epochs": number_field(prefix, "epochs", errors),
                  "seed": number_field(prefix, "seed", errors)}
    with right:
        values |= {"grad_accum_steps": number_field(prefix, "grad_accum_steps", errors,
                                                    help="Micro-batches whose gradients add up before one optimizer "
                                                         "step."),
                   "learning_rate": learning_rate_input(prefix, errors, model),
                   "dropout": number_field(prefix, "dropout", errors, whole=False, step=0.05, format="%.2f",
                                           help="Set on every dropout the model has, whatever its family calls it; "
                                                "the run says when it could not be applied. 0 makes the three "
                                                "backends draw the same loss curve.")}
    values["loss_normalization"] = st.radio(field_label("loss_normalization"), LOSS_NORMALIZATIONS,
                                            key=prefix + "loss_normalization", persist_state="session",
                                            format_func=NORMALIZATION_NAMES.get, horizontal=True)
    errors.slot("loss_normalization")
    processes_column, shard_column = st.columns(2)
    with processes_column:
        values["num_processes"] = st.selectbox(
            field_label("num_processes"), [1, 2], key=prefix + "num_processes", persist_state="session",
            help="Data parallelism: 2 processes (started with accelerate launch) each train on their own "
                 "micro-batches; gradients are all-reduced once per window (no_sync).")
        errors.slot("num_processes")
    with shard_column:
        values["fsdp"] = st.toggle(field_label("fsdp"), key=prefix + "fsdp", persist_state="session",
                                   help="FSDP2: each process keeps 1/P of the parameters, gradients and optimizer "
                                        "state instead of a whole copy (DDP); needs 2 processes.")
        errors.slot("fsdp")
    sync = st.radio(field_label("grad_sync"), GRAD_SYNCS, key=prefix + "grad_sync", persist_state="session",
                    horizontal=True, disabled=not values["fsdp"],
                    help="Sharded runs: reduce-scatter gradients once per window (every process holds the whole "
                         "model's gradients meanwhile), or after every micro-batch (each holds only its shard, and "
                         "sends k times the bytes).")
    values["grad_sync"] = sync if values["fsdp"] else PER_WINDOW  # DDP syncs once per window (no_sync)
    errors.slot("grad_sync")
    with st.expander("Advanced: data size and sequence length"):
        values |= {"train_samples": number_field(prefix, "train_samples", errors, step=100),
                   "eval_samples": number_field(prefix, "eval_samples", errors, step=50),
                   "max_seq_length": number_field(prefix, "max_seq_length", errors, step=16)}
    with st.expander("Memory: a budget, and the levers beside accumulation"):
        values |= memory_inputs(prefix, errors)
    return values


# The visitor's own learning rate, once they type one (None: the recipe's, for the form's model and optimizer).
OWN_LEARNING_RATE = "own_learning_rate"


def learning_rate_input(prefix: str, errors: FieldErrors, model: str) -> float | None:
    """The learning rate field: the visitor's own rate, else ``recipes.learning_rate``'s answer for the form's model
    and optimizer, so it follows both by itself (empty where the recipe has no rate for the optimizer: the check
    asks for one). Typing the recipe's rate back gives the field back to the recipe."""
    optimizer = st.session_state.get(prefix + "optimizer") or RunConfig.optimizer  # its widget comes later
    recipe_rate = recipes.learning_rate(model, optimizer)
    st.session_state[prefix + "learning_rate"] = recipes.learning_rate(model, optimizer,
                                                                       st.session_state.get(prefix + OWN_LEARNING_RATE))
    # may_be_empty: emptied, it shows the recipe's rate again; empty, the recipe has none, and the check says so.
    return number_field(prefix, "learning_rate", errors, whole=False, may_be_empty=True, step=1e-4, format="%.1e",
                        on_change=_keep_own_learning_rate, args=(prefix, recipe_rate))


def _keep_own_learning_rate(prefix: str, recipe_rate: float | None) -> None:
    """The visitor typed a rate: theirs from now on, unless it is the recipe's rate the field was showing."""
    typed = st.session_state[prefix + "learning_rate"]
    st.session_state[prefix + OWN_LEARNING_RATE] = None if typed is None or typed == recipe_rate else typed


def memory_inputs(prefix: str, errors: FieldErrors) -> dict:
    """The memory budget (empty: none) and the levers: gradient checkpointing, precision, optimizer."""
    budget = st.number_input(field_label("memory_budget_mb"), key=prefix + "memory_budget_mb", persist_state="session",
                             step=50.0, format="%.0f", placeholder="no budget",
                             help="The run measures what it needs before step 1 (parameters, gradients, optimizer "
                                  "state, and the saved activations of its largest micro-batch at its longest "
                                  "sequence) and fails like out-of-memory past it. On the CPU the budget is "
                                  "enforced from these measured bytes; on a GPU the allocator is capped too.")
    errors.slot("memory_budget_mb")
    left, right = st.columns(2)
    with left:
        checkpointing = st.toggle(field_label("gradient_checkpointing"), key=prefix + "gradient_checkpointing",
                                  persist_state="session",
                                  help="Keep only each layer's input and recompute the rest in backward: far fewer "
                                       "activations, paid for with a second forward pass.")
        errors.slot("gradient_checkpointing")
        precision = st.radio(field_label("precision"), PRECISIONS, key=prefix + "precision", persist_state="session",
                             horizontal=True, help="Autocast: bf16 works on the CPU; fp16 needs a CUDA GPU.")
        errors.slot("precision")
    with right:
        optimizer = st.selectbox(field_label("optimizer"), offered_optimizers(), key=prefix + "optimizer",
                                 persist_state="session",
                                 help="AdamW keeps two moments per parameter, SGD (momentum) one, Adafactor only "
                                      "factored rows and columns.")
        errors.slot("optimizer")
    return {"memory_budget_mb": budget, "gradient_checkpointing": checkpointing, "precision": precision,
            "optimizer": optimizer}


def pitfall_input(prefix: str, label: str, help: str) -> list[str]:
    """The plain loop's deliberate wrong lines to run (or show), each named with its upstream report."""
    return st.multiselect(label, list(PITFALLS), key=prefix + "pitfalls", persist_state="session",
                          format_func=lambda name: f"{name} ({PITFALLS[name]})", help=help)


def offered_optimizers() -> list[str]:
    """adamw-8bit only where bitsandbytes is installed (the run refuses it again without a GPU)."""
    return [name for name in OPTIMIZERS if name != "adamw-8bit" or importlib.util.find_spec("bitsandbytes")]


def model_input(prefix: str, errors: FieldErrors) -> str:
    defaults(model_widget_values(prefix, BUILTIN_MODELS[0]))
    choice = st.selectbox("Model", [*BUILTIN_MODELS, OTHER_MODEL], key=f"{FORM}{prefix}.model_choice",
                          persist_state="session",
                          help="tiny-bert: a 190k-parameter BERT, random init (fast). all-MiniLM-L6-v2: pretrained, "
                               "packaged (22M parameters). tiny-gpt: a 200k-parameter GPT-2-style language model, "
                               "random init (the causal-lm task).")
    name = choice
    if choice == OTHER_MODEL:
        name = st.text_input("Hub id or local model folder", key=f"{FORM}{prefix}.model_custom",
                             persist_state="session", placeholder="prajjwal1/bert-tiny").strip()
    errors.slot("model")
    return name


def follow_recipe(prefix: str, model: str, limits: Limits) -> None:
    """When the form's model or optimizer changes, move the fields the visitor left at the old model's recipe to
    the new one's (``form.follow``; the learning rate follows by itself, see ``learning_rate_input``), the
    built-in data to the new model's task, and say so. Call it after the model input, before the fields' widgets."""
    key = followed_key(prefix)
    now = (model, st.session_state.get(f"{FORM}{prefix}.optimizer") or RunConfig.optimizer)
    previous = st.session_state.get(key)
    st.session_state[key] = now
    if previous is None or previous == now:
        return
    values = {name: st.session_state.get(f"{FORM}{prefix}.{name}") for name in form.MOVING_RECIPE_FIELDS}
    moves, note = form.follow(previous, now, values, st.session_state.get(f"{FORM}{prefix}.{OWN_LEARNING_RATE}"),
                              limits)
    for name, value in moves.items():
        st.session_state[f"{FORM}{prefix}.{name}"] = value
    notes = [note] if note else []
    # The built-in data follows the task the same way: builtin-text for tiny-gpt, builtin-sentiment back.
    dataset_key = f"{FORM}{prefix}.dataset_choice"
    if st.session_state.get(dataset_key) == default_dataset(previous[0]) != default_dataset(model):
        st.session_state[dataset_key] = default_dataset(model)
        notes.append(form.describe_dataset_move(model, default_dataset(model)))
    if notes:
        st.session_state[recipe_note_key(prefix)] = " ".join(notes)


def followed_key(prefix: str) -> str:
    """Where the form keeps the (model, optimizer) its recipe fields last followed."""
    return f"{FORM}{prefix}.recipe_for"


def recipe_note_key(prefix: str) -> str:
    return f"{FORM}{prefix}.recipe_note"


def recipe_note(prefix: str) -> None:
    """The sentence ``follow_recipe`` (or a hand-off from another page) left, once, where the page wants it."""
    note = st.session_state.pop(recipe_note_key(prefix), None)
    if note:
        st.info(note, icon="🧪")


FROM_THE_MODEL = "from the model"


def task_input(prefix: str, errors: FieldErrors, config: RunConfig) -> str | None:
    """Task: classification, causal-lm, or (None) whatever the model is; the inferred task is shown."""
    choice = st.selectbox("Task", [FROM_THE_MODEL, *TASKS], key=f"{FORM}{prefix}.task", persist_state="session",
                          help="classification: a label per text (F1, accuracy). causal-lm: predict each next token "
                               "(perplexity, next-token accuracy); a *ForCausalLM model or tiny-gpt means causal-lm. "
                               "contrastive: all-MiniLM-L6-v2 learns builtin-pairs with in-batch negatives (MRR@10, "
                               "recall@1).")
    task = None if choice == FROM_THE_MODEL else choice
    if task is None:
        st.caption(f"Task from the model: **{infer_task(config)}**.")
    errors.slot("task")
    return task


def gradcache_input(prefix: str, errors: FieldErrors) -> int | None:
    """Contrastive only: GradCache's mini-batch (0: MultipleNegativesRankingLoss on each micro-batch)."""
    defaults({f"{FORM}{prefix}.gradcache_mini_batch": 0})
    value = st.number_input(field_label("gradcache_mini_batch"), min_value=0, step=1,
                            key=f"{FORM}{prefix}.gradcache_mini_batch", persist_state="session",
                            help="0: MultipleNegativesRankingLoss on each micro-batch (its in-batch negatives are the "
                                 "micro-batch's). A number: CachedMultipleNegativesRankingLoss (GradCache), the whole "
                                 "micro-batch's loss with the activations of mini-batches of this many texts.")
    errors.slot("gradcache_mini_batch")
    return int(value) or None


def model_widget_values(prefix: str, model: str) -> dict:
    """What ``model_input``'s widgets hold to show ``model``: a built-in one picked, or "other" and its name."""
    builtin = model in BUILTIN_MODELS
    return {f"{FORM}{prefix}.model_choice": model if builtin else OTHER_MODEL,
            f"{FORM}{prefix}.model_custom": "" if builtin else model}


def dataset_input(prefix: str, errors: FieldErrors, limits: Limits) -> tuple[str, str | None, str | None, str | None]:
    """(dataset, text column, label column, problem) from the built-in set, an upload or a hub id.

    ``problem`` is a sentence for the dataset field (no file yet, file too large, unreadable) or None.
    """
    defaults({f"{FORM}{prefix}.dataset_choice": BUILTIN_DATASETS[0], f"{FORM}{prefix}.dataset_custom": ""})
    choice = st.selectbox("Dataset", [*BUILTIN_DATASETS, UPLOAD_DATASET, OTHER_DATASET],
                          key=f"{FORM}{prefix}.dataset_choice", persist_state="session",
                          help="builtin-sentiment: generated product reviews, positive or negative (offline). "
                               "builtin-text: reviews of one to a dozen sentences, for the causal-lm task. "
                               "builtin-pairs: (query, positive) pairs, for the contrastive task.")
    if choice == UPLOAD_DATASET:
        return _upload_input(prefix, errors, limits)
    dataset = choice
    if choice == OTHER_DATASET:
        dataset = st.text_input("Hub dataset id or local path", key=f"{FORM}{prefix}.dataset_custom",
                                persist_state="session", placeholder="imdb").strip()
    errors.slot("dataset")
    return dataset, None, None, None


def _upload_input(prefix: str, errors: FieldErrors, limits: Limits):
    uploaded = st.file_uploader(f"CSV or JSONL with a text and a label column (up to {limits.max_upload_mb:g} MB)",
                                type=["csv", "jsonl", "json"], key=f"{prefix}.upload",
                                max_upload_size=max(1, math.ceil(limits.max_upload_mb)))
    errors.slot("dataset")
    kept_key = f"{prefix}.uploaded"  # the saved file outlives the widget (which forgets it on a page switch)
    if uploaded is not None:
        try:
            path = uploads.save_upload(uploaded.name, uploaded.getvalue(), limits)
        except GradaccError as error:
            st.session_state.pop(kept_key, None)
            return "", None, None, error.message
        st.session_state[kept_key] = {"name": uploaded.name, "path": str(path)}
    kept = st.session_state.get(kept_key)
    if kept is None:
        return "", None, None, "Upload a CSV or JSONL file with a text column and a label column."
    if uploaded is None:
        st.caption(f"Using {kept['name']}, uploaded earlier.")
    try:
        columns = _columns(kept["path"])
    except GradaccError as error:
        return kept["path"], None, None, error.message
    # Keys carry the file's name: a new file with other columns gets fresh pickers.
    file_key = kept["path"].rsplit("/", 1)[-1]
    left, right = st.columns(2)
    with left:
        text_column = st.selectbox(field_label("text_column"), columns, key=f"{prefix}.text_column.{file_key}",
                                   index=_index(columns, form.guess_column(columns, TEXT_COLUMNS), 0))
        errors.slot("text_column")
    with right:
        label_column = st.selectbox(field_label("label_column"), columns, key=f"{prefix}.label_column.{file_key}",
                                    index=_index(columns, _label_guess(kept["path"], text_column),
                                                 len(columns) - 1))
        errors.slot("label_column")
    return kept["path"], text_column, label_column, None


@st.cache_data(show_spinner=False, max_entries=32)
def _columns(path: str) -> list[str]:
    return form.table_columns(path)


@st.cache_data(show_spinner=False, max_entries=32)
def _label_guess(path: str, text_column: str | None) -> str | None:
    return form.label_column_guess(path, text_column)


def _index(options: list, value, fallback: int) -> int:
    return options.index(value) if value in options else max(0, fallback)


@st.cache_data(show_spinner=False, max_entries=64)
def _count_train_examples(config_values: tuple) -> int:
    return form.count_train_examples(RunConfig.from_dict(dict(config_values)))


def train_examples(config: RunConfig) -> tuple[int | None, dict[str, str]]:
    """Training examples the run will see, and any data error (a file is read once, then cached)."""
    known = form.known_train_examples(config)
    if known is not None or not config.dataset.strip().lower().endswith(FILE_SUFFIXES):
        return known, {}  # built-in: known without loading; a hub id or folder: known once the run loads it
    wanted = ("dataset", "text_column", "label_column", "seed", "train_samples", "eval_samples")
    try:
        return _count_train_examples(tuple((k, getattr(config, k)) for k in wanted)), {}
    except GradaccError as error:
        return None, {error.field or form.GENERAL: error.message}
