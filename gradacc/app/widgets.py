"""Streamlit helpers the pages share: the server's run manager, the visitor's id, inputs, field errors.

Importing this must stay cheap (no torch, no transformers): every page imports it before painting.
"""

from __future__ import annotations

import math
import sys
import uuid

import streamlit as st

from gradacc.app import form
from gradacc.serving import uploads, warmup
from gradacc.config import (BACKENDS, BUILTIN_DATASETS, BUILTIN_MODELS, LOSS_NORMALIZATIONS, OPTIMIZERS, PRECISIONS,
                            RunConfig, field_label)
from gradacc.training.sources.data import FILE_SUFFIXES, TEXT_COLUMNS
from gradacc.errors import GradaccError
from gradacc.serving.limits import Limits
from gradacc.serving.manager import RunManager
from gradacc.serving.store import RunStore
from gradacc.units import format_bytes  # noqa: F401 - the pages' name for it

# How often a live page polls its run; only while that run is queued or running. Charts are redrawn
# less often: building plotly figures is pure Python and competes with training for the GIL.
POLL_SECONDS = 0.5
CHART_POLL_SECONDS = 1.0
WARM_UP_POLL_SECONDS = 1.0
# A room of watchers (a link shared in a talk): every page redraws its run each poll, and on a small server that
# work competes with the training it shows. Up to FULL_PACE_PAGES pages poll every second; a larger room shares a
# budget of ROOM_POLLS_PER_SECOND: three pages poll every 3 s, five every 4 s, ten or more every 8 s
# (MAX_CHART_POLL_SECONDS at most). The run's owner, whose page is the one on the projector, keeps polling every
# second. A page says when it refreshes more slowly. Measured with five pages (BENCHMARKS.md, watchers): at 2.5
# polls a second the server's other threads took 0.031-0.035 of its core from training, at 1.25 0.020-0.022.
FULL_PACE_PAGES = 2
ROOM_POLLS_PER_SECOND = 1.25
MAX_CHART_POLL_SECONDS = 8.0
SWITCH_INTERVAL_S = 0.001
# Keys of the form widgets; they are created with persist_state="session", so a visitor's settings
# survive a trip to another page.
FORM = "form."

BACKEND_NAMES = {"pytorch": "PyTorch loop", "accelerate": "🤗 Accelerate", "trainer": "🤗 Trainer"}
NORMALIZATION_NAMES = {"exact": "exact (weight by items in the window)", "naive": "naive (each mean ÷ k)"}
OTHER_MODEL = "other: hub id or local folder"
UPLOAD_DATASET = "upload a CSV / JSONL file"
OTHER_DATASET = "other: hub id or local path"


# ---- one per server -------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def _create_manager() -> RunManager:
    warmup.torch_threads()  # a bad GRADACC_TORCH_THREADS stops the page with one sentence, like the limits
    # The training thread gives the GIL up inside every torch op and must win it back after: while pages are
    # drawn in other threads, each op can wait out a whole switch interval (5 ms by default). 1 ms keeps a
    # room of watchers from stalling the run they watch.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # plotly looks numpy and pandas up in sys.modules without importing them; while the warm-up thread is
    # half-way through importing pandas, a chart drawn here would find a partial module and fail. Import both
    # fully first (well under a second), then warm up the rest.
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    # Slots and the time limit come from the deployment's Limits (a bad value: GradaccError, shown below).
    # recover=True marks runs a previous server left queued/running as interrupted (once per server).
    manager = RunManager(RunStore(), recover=True)
    warmup.start()  # torch and transformers import in the background while the page paints
    return manager


def run_manager() -> RunManager:
    """The server's RunManager; a broken deployment setting stops the page with one sentence."""
    try:
        return _create_manager()
    except GradaccError as error:
        st.error(f"This server is misconfigured: {error.message}")
        st.stop()
    except OSError as error:
        st.error(f"Cannot open the run store ({error.strerror or error}); check GRADACC_HOME.")
        st.stop()


@st.cache_resource(show_spinner=False)
def check_runner():
    """The server's queue of equivalence checks (one worker thread, shared by every visitor)."""
    from gradacc.serving.checks import CheckRunner

    return CheckRunner()


def limits() -> Limits:
    try:
        return Limits.from_env()
    except GradaccError as error:
        st.error(f"This server is misconfigured: {error.message}")
        st.stop()


def chart_poll_seconds(*runs) -> float:
    """Seconds between this page's redraws of these live runs (see ROOM_POLLS_PER_SECOND)."""
    runs = [run for run in runs if run is not None]
    watchers = max((run.watchers() for run in runs), default=0)
    return room_poll_seconds(watchers, owner=bool(runs) and any(run.owner == owner_id() for run in runs))


def room_poll_seconds(watchers: int, owner: bool = False) -> float:
    """A page's poll period in a room of ``watchers`` pages: every CHART_POLL_SECONDS up to FULL_PACE_PAGES, beyond
    that the room shares ROOM_POLLS_PER_SECOND, in whole seconds; the run's ``owner`` polls every
    CHART_POLL_SECONDS whatever the room."""
    if owner or watchers <= FULL_PACE_PAGES:
        return CHART_POLL_SECONDS
    return float(min(MAX_CHART_POLL_SECONDS, max(CHART_POLL_SECONDS, math.ceil(watchers / ROOM_POLLS_PER_SECOND))))


def watch(run, poll_seconds: float | None):
    """A snapshot of ``run`` for this session's poll: every page watching draws the same one (taken at most once
    per poll period of this page, a little under it so an early poll still sees new steps; the owner's faster
    polls renew it for everyone), so a room of watchers costs one figure build per period, not one per page.
    Counts this session as a watcher."""
    return run.snapshot(reuse_for=0.9 * (poll_seconds or 0.0), viewer=owner_id())


def keep_pace(poll_seconds: float | None, *runs) -> None:
    """Called by a live view at each poll: once the room has grown to want a period 1.5× this page's, rerun the
    whole page so it polls at that pace; then say the page's pace.

    A fragment's period is fixed when the page runs whole, so a page opened into an empty room would go on
    polling every second while twenty others join it (measured: the server's other threads then took 15 % of
    its core from training; 9-10 % with this). Only slower, never faster: when twenty browsers share one core,
    their polls come late and the room seems to empty and fill again, so pages that also sped up could rerun
    back and forth. A page that slowed down keeps its pace until it runs whole again (its run ends, a click)."""
    if poll_seconds and needs_new_pace(poll_seconds, chart_poll_seconds(*runs)):
        st.rerun()
    if poll_seconds and poll_seconds > CHART_POLL_SECONDS:
        st.caption(f"👥 Many pages are watching: this one refreshes every {poll_seconds:.0f} s.")


def needs_new_pace(page_seconds: float, room_seconds: float) -> bool:
    return room_seconds >= 1.5 * page_seconds


def owner_id() -> str:
    """This browser session's id: runs it starts are its own to stop."""
    if "owner" not in st.session_state:
        st.session_state["owner"] = uuid.uuid4().hex
    return st.session_state["owner"]


# ---- form helpers ---------------------------------------------------------------------------------

def defaults(values: dict) -> None:
    """Initial widget values, set through session state so widgets need no ``value=`` (no double source)."""
    for key, value in values.items():
        st.session_state.setdefault(key, value)


class FieldErrors:
    """Room right under each widget for its error, filled once every value is known."""

    def __init__(self):
        self._slots: dict[str, object] = {}

    def slot(self, *fields: str) -> None:
        room = st.container()
        for field in fields:
            self._slots[field] = room

    def show(self, errors: dict[str, str], elsewhere) -> None:
        """Each message under its widget; messages of fields without a widget go to ``elsewhere``."""
        for field, message in errors.items():
            self._slots.get(field, elsewhere).error(message)


# ---- inputs shared by pages -----------------------------------------------------------------------

def number_field(prefix: str, field: str, errors: FieldErrors, *, whole: bool = True, **options):
    """A number input labelled as ``config.FIELD_LABELS`` says, with its error slot right under it.

    A whole-number field is a float input shown with ``%g``: the browser's integer input turns a typed 2.5
    into 2 without a word, while this passes 2.5 on for ``RunConfig.validate`` to refuse. Whole values
    come back as ``int``.
    """
    if whole:
        options.setdefault("format", "%g")
        options["step"] = float(options.get("step", 1))
    value = st.number_input(field_label(field), key=prefix + field, persist_state="session", **options)
    errors.slot(field)
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


def training_inputs(prefix: str, errors: FieldErrors) -> dict:
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
                   "learning_rate": number_field(prefix, "learning_rate", errors, whole=False, step=1e-4,
                                                 format="%.1e"),
                   "dropout": number_field(prefix, "dropout", errors, whole=False, step=0.05, format="%.2f",
                                           help="Set on every dropout the model has, whatever its family calls it; "
                                                "the run says when it could not be applied. 0 makes the three "
                                                "backends draw the same loss curve.")}
    values["loss_normalization"] = st.radio(field_label("loss_normalization"), LOSS_NORMALIZATIONS,
                                            key=prefix + "loss_normalization", persist_state="session",
                                            format_func=NORMALIZATION_NAMES.get, horizontal=True)
    errors.slot("loss_normalization")
    values["num_processes"] = st.selectbox(
        field_label("num_processes"), [1, 2], key=prefix + "num_processes", persist_state="session",
        help="Data parallelism: 2 processes (started with accelerate launch) each train on their own micro-batches; "
             "gradients are all-reduced once per window (no_sync).")
    errors.slot("num_processes")
    with st.expander("Advanced: data size and sequence length"):
        values |= {"train_samples": number_field(prefix, "train_samples", errors, step=100),
                   "eval_samples": number_field(prefix, "eval_samples", errors, step=50),
                   "max_seq_length": number_field(prefix, "max_seq_length", errors, step=16)}
    with st.expander("Memory: a budget, and the levers beside accumulation"):
        values |= memory_inputs(prefix, errors)
    return values


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


def offered_optimizers() -> list[str]:
    """adamw-8bit only where bitsandbytes is installed (the run refuses it again without a GPU)."""
    import importlib.util

    return [name for name in OPTIMIZERS if name != "adamw-8bit" or importlib.util.find_spec("bitsandbytes")]


def model_input(prefix: str, errors: FieldErrors) -> str:
    defaults(_model_widget_values(prefix, BUILTIN_MODELS[0]))
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
    """When the model changes, move the fields the visitor left at the old model's recipe to the new one's,
    and say so. Call it after the model input and before the fields' widgets (their values may still change)."""
    key = f"{FORM}{prefix}.recipe_model"
    previous = st.session_state.get(key)
    st.session_state[key] = model
    if previous is None or previous == model:
        return
    values = {name: st.session_state.get(f"{FORM}{prefix}.{name}") for name in form.PAGE_RECIPE_FIELDS}
    moves = form.recipe_moves(previous, model, values, limits)
    for name, value in moves.items():
        st.session_state[f"{FORM}{prefix}.{name}"] = value
    if moves:
        st.session_state[f"{FORM}{prefix}.recipe_note"] = form.describe_moves(model, moves)


def recipe_note(prefix: str) -> None:
    """The sentence ``follow_recipe`` left, once, where the page wants it."""
    note = st.session_state.pop(f"{FORM}{prefix}.recipe_note", None)
    if note:
        st.info(note, icon="🧪")


FROM_THE_MODEL = "from the model"


def task_input(prefix: str, errors: FieldErrors, config: RunConfig) -> str | None:
    """Task: classification, causal-lm, or (None) whatever the model is; the inferred task is shown."""
    from gradacc.config import TASKS
    from gradacc.training.sources.models import infer_task  # reads a folder's config.json at most, no torch

    choice = st.selectbox("Task", [FROM_THE_MODEL, *TASKS], key=f"{FORM}{prefix}.task", persist_state="session",
                          help="classification: a label per text (F1, accuracy). causal-lm: predict each next token "
                               "(perplexity, next-token accuracy); a *ForCausalLM model or tiny-gpt means causal-lm.")
    task = None if choice == FROM_THE_MODEL else choice
    if task is None:
        st.caption(f"Task from the model: **{infer_task(config)}**.")
    errors.slot("task")
    return task


def _model_widget_values(prefix: str, model: str) -> dict:
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
                               "builtin-text: reviews of one to a dozen sentences, for the causal-lm task.")
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


@st.cache_resource(show_spinner=False)
def figure_cache():
    """The server's figures, shared by every session (gradacc.app.charts.FigureCache)."""
    from gradacc.app.charts import FigureCache  # plotly: imported when a chart is first drawn, not per page

    return FigureCache()


def shared_figures(key, build) -> tuple:
    """``build()``'s figures for ``key`` (page, run ids, event counts, view), built once for all sessions."""
    return figure_cache().get(key, build)


# ---- the Train form's settings, shared by pages -----------------------------------------------------------
# The Train page keeps its settings in session state as one RunConfig; the planner writes its advice into it
# and the Code page reads it. No page reads or writes another page's widget keys.

TRAIN_CONFIG = "train_config"
TRAIN_FORM = f"{FORM}train."  # the Train form's widget keys: only the Train page and this section use them
_TRAIN_CONFIG_SHOWN = "train_config.shown"  # the config the Train form's widgets showed when it last drew
# The Train form's widgets, by RunConfig field (the model and the data have pickers of their own).
TRAIN_FORM_FIELDS = ("backend", "micro_batch_size", "grad_accum_steps", "epochs", "learning_rate", "seed",
                     "loss_normalization", "dropout", "train_samples", "eval_samples", "max_seq_length",
                     "num_processes", "memory_budget_mb", "gradient_checkpointing", "precision", "optimizer")


def train_config() -> RunConfig:
    """The Train form's settings (the defaults, recipe filled in, until the visitor has been on the Train page)."""
    return st.session_state.get(TRAIN_CONFIG) or RunConfig().resolved()


def suggest_train_settings(**changes) -> None:
    """Another page's advice for the Train form (the planner's m and k); the form shows it when it next draws."""
    st.session_state[TRAIN_CONFIG] = train_config().replace(**changes)


def prepare_train_form(limits: Limits) -> None:
    """Before the Train form draws: its first values (the defaults within this deployment's limits), and any
    setting another page has changed in the shared config since the form last drew."""

    def within(value: int, limit: int | None) -> int:
        return min(value, limit) if limit else value

    base = RunConfig().resolved()  # the default model (tiny-bert) and its recipe
    first = {field: getattr(base, field) for field in TRAIN_FORM_FIELDS}
    first |= {"epochs": within(base.epochs, limits.max_epochs),
              "train_samples": within(base.train_samples, limits.max_train_samples),
              "eval_samples": within(base.eval_samples, limits.max_train_samples)}
    defaults({TRAIN_FORM + field: value for field, value in first.items()})
    shared, shown = st.session_state.get(TRAIN_CONFIG), st.session_state.get(_TRAIN_CONFIG_SHOWN)
    if shared is None or shared is shown:
        return
    shown = shown or base
    for field in TRAIN_FORM_FIELDS:
        if getattr(shared, field) != getattr(shown, field):
            st.session_state[TRAIN_FORM + field] = getattr(shared, field)
    if shared.model != shown.model:
        st.session_state.update(_model_widget_values("train", shared.model))


def keep_train_config(config: RunConfig) -> None:
    """After the Train form drew: its settings, for the other pages."""
    st.session_state[TRAIN_CONFIG] = st.session_state[_TRAIN_CONFIG_SHOWN] = config


# ---- status lines ---------------------------------------------------------------------------------

def warm_up_status() -> None:
    """'warming up the training libraries…' until torch and transformers are imported, then 'ready'
    (or, if an import failed, that runs will fail until the server restarts)."""
    state_at_start = warmup.state()

    @st.fragment(run_every=WARM_UP_POLL_SECONDS if state_at_start in ("cold", "warming") else None)
    def status_line():
        state = warmup.state()
        if state in ("cold", "warming"):
            st.caption("⏳ Warming up the training libraries (torch, transformers)…")
            return
        if state_at_start in ("cold", "warming"):
            st.rerun()  # once: the next script run draws this fragment without polling
        if state == "warm":
            st.caption("✅ Training libraries ready.")
        else:
            st.error(f"The training libraries failed to import ({warmup.failure()}); runs will fail until "
                     "the server is restarted.")

    status_line()
