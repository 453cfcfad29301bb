"""Streamlit helpers the pages share: the server's run manager, the visitor's id, inputs, field errors.

Importing this must stay cheap (no torch, no transformers): every page imports it before painting.
"""

from __future__ import annotations

import math
import uuid

import streamlit as st

from gradacc.app import form
from gradacc.serving import warmup
from gradacc.config import BUILTIN_DATASETS, BUILTIN_MODELS, RunConfig, field_label
from gradacc.training.sources.data import FILE_SUFFIXES, TEXT_COLUMNS
from gradacc.errors import GradaccError
from gradacc.serving.limits import Limits
from gradacc.serving.manager import RunManager
from gradacc.serving.store import RunStore

# How often a live page polls its run; only while that run is queued or running. Charts are redrawn
# less often: building plotly figures is pure Python and competes with training for the GIL.
POLL_SECONDS = 0.5
CHART_POLL_SECONDS = 1.0
WARM_UP_POLL_SECONDS = 1.0
# Keys of the form widgets; they are created with persist_state="session", so a visitor's settings
# survive a trip to another page.
FORM = "form."

BACKEND_NAMES = {"pytorch": "PyTorch loop", "accelerate": "🤗 Accelerate", "trainer": "🤗 Trainer"}
OTHER_MODEL = "other: hub id or local folder"
UPLOAD_DATASET = "upload a CSV / JSONL file"
OTHER_DATASET = "other: hub id or local path"


# ---- one per server -------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def _create_manager() -> RunManager:
    limits = Limits.from_env()
    warmup.torch_threads()  # a bad GRADACC_TORCH_THREADS stops the page with one sentence, like the limits
    # plotly looks numpy and pandas up in sys.modules without importing them; while the warm-up thread is
    # half-way through importing pandas, a chart drawn here would find a partial module and fail. Import both
    # fully first (well under a second), then warm up the rest.
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    # recover=True marks runs a previous server left queued/running as interrupted (once per server).
    manager = RunManager(RunStore(), max_run_seconds=limits.max_run_seconds or 0, recover=True)
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
    from gradacc.app.equivalence_view import CheckRunner

    return CheckRunner()


def limits() -> Limits:
    try:
        return Limits.from_env()
    except GradaccError as error:
        st.error(f"This server is misconfigured: {error.message}")
        st.stop()


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
    from gradacc.config import BACKENDS

    backend_column, m_column, k_column, *extra_columns = st.columns(widths)
    with backend_column:
        backend = st.radio(field_label("backend"), BACKENDS, key=prefix + "backend", persist_state="session",
                           format_func=BACKEND_NAMES.get, horizontal=True)
    with m_column:
        micro_batch_size = number_field(prefix, "micro_batch_size", errors)
    with k_column:
        grad_accum_steps = number_field(prefix, "grad_accum_steps", errors)
    return backend, micro_batch_size, grad_accum_steps, [backend_column, *extra_columns]

def model_input(prefix: str, errors: FieldErrors) -> str:
    defaults({f"{FORM}{prefix}.model_choice": BUILTIN_MODELS[0], f"{FORM}{prefix}.model_custom": ""})
    choice = st.selectbox("Model", [*BUILTIN_MODELS, OTHER_MODEL], key=f"{FORM}{prefix}.model_choice",
                          persist_state="session",
                          help="tiny-bert: a 190k-parameter BERT, random init (fast). all-MiniLM-L6-v2: pretrained, "
                               "packaged (22M parameters).")
    name = choice
    if choice == OTHER_MODEL:
        name = st.text_input("Hub id or local model folder", key=f"{FORM}{prefix}.model_custom",
                             persist_state="session", placeholder="prajjwal1/bert-tiny").strip()
    errors.slot("model")
    return name


def dataset_input(prefix: str, errors: FieldErrors, limits: Limits) -> tuple[str, str | None, str | None, str | None]:
    """(dataset, text column, label column, problem) from the built-in set, an upload or a hub id.

    ``problem`` is a sentence for the dataset field (no file yet, file too large, unreadable) or None.
    """
    defaults({f"{FORM}{prefix}.dataset_choice": BUILTIN_DATASETS[0], f"{FORM}{prefix}.dataset_custom": ""})
    choice = st.selectbox("Dataset", [*BUILTIN_DATASETS, UPLOAD_DATASET, OTHER_DATASET],
                          key=f"{FORM}{prefix}.dataset_choice", persist_state="session",
                          help="builtin-sentiment: generated product reviews, positive or negative (offline).")
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
            path = form.save_upload(uploaded.name, uploaded.getvalue(), limits)
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


def cached(name: str, version, build):
    """``build()`` once per ``version`` in this session: charts are rebuilt only when new events arrived."""
    held = st.session_state.get(name)
    if held is None or held[0] != version:
        held = (version, build())
        st.session_state[name] = held
    return held[1]


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


def format_bytes(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def format_seconds(seconds) -> str:
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"
