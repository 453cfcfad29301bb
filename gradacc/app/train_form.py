"""The Train form's settings, shared by pages.

The Train page keeps its settings in session state as one RunConfig; the planner writes its advice into it and
the Code page reads it. No page reads or writes another page's widget keys.
"""

from __future__ import annotations

import streamlit as st

from gradacc.app import form
from gradacc import recipes
from gradacc.app.inputs import (FORM, OWN_LEARNING_RATE, defaults, followed_key, model_widget_values,
                                recipe_note_key)
from gradacc.choices import BUILTIN_DATASETS
from gradacc.config import RunConfig
from gradacc.recipes import default_dataset, shares_learning_rate
from gradacc.serving.limits import Limits


TRAIN_CONFIG = "train_config"
TRAIN_FORM = f"{FORM}train."  # the Train form's widget keys: only the Train page and this section use them
_TRAIN_CONFIG_SHOWN = "train_config.shown"  # the config the Train form's widgets showed when it last drew
# What another page last filled on the Train form: (the page, {field: value}), until the form shows other values;
# and whether the form has said so yet.
_FILLED = "train_config.filled"
_FILLED_SAID = "train_config.filled.said"
# The visitor's own learning rate (None: the recipe's for the form's model and optimizer; inputs.learning_rate_input).
OWN_RATE = TRAIN_FORM + OWN_LEARNING_RATE
# The Train form's widgets, by RunConfig field (the model and the data have pickers of their own; the learning
# rate's field shows the resolved rate, from OWN_RATE).
TRAIN_FORM_FIELDS = ("backend", "micro_batch_size", "grad_accum_steps", "epochs", "seed",
                     "loss_normalization", "dropout", "train_samples", "eval_samples", "max_seq_length",
                     "num_processes", "fsdp", "grad_sync", "memory_budget_mb", "gradient_checkpointing", "precision",
                     "optimizer", "pitfalls")


def train_config() -> RunConfig:
    """The Train form's settings (the defaults, recipe filled in, until the visitor has been on the Train page)."""
    return st.session_state.get(TRAIN_CONFIG) or form.DEFAULTS


def suggest_train_settings(**changes) -> None:
    """Another page's advice for the Train form (the planner's m and k); the form shows it when it next draws."""
    st.session_state[TRAIN_CONFIG] = RunConfig.from_dict(train_config().to_dict() | changes)


def carry_train_settings(limits: Limits, source: str, **changes) -> None:
    """Another page's settings for the Train form, carried whole (the planner's model, m, k, budget and levers);
    ``source`` names the page, which the form's top then says filled it (``filled_note``).

    A new model or optimizer brings what choosing it on the Train page brings (``form.follow``): the fields still at
    the old model's recipe move to the new one's, the built-in data follows its task, and the form says so.
    ``changes`` win over the recipe. An optimizer of another update rule takes its own rate from the recipe."""
    current = train_config()
    st.session_state[_FILLED], st.session_state[_FILLED_SAID] = (source, dict(changes)), False
    model, optimizer = changes.get("model", current.model), changes.get("optimizer", current.optimizer)
    if not shares_learning_rate(current.optimizer, optimizer):
        st.session_state[OWN_RATE] = None  # the visitor's rate was for another rule
    own_rate = st.session_state.get(OWN_RATE)
    if (model, optimizer) != (current.model, current.optimizer):
        values = {name: getattr(current, name) for name in form.MOVING_RECIPE_FIELDS}
        moves, note = form.follow((current.model, current.optimizer), (model, optimizer), values, own_rate, limits,
                                  keep=changes)
        notes = [note] if note else []
        if current.dataset == default_dataset(current.model) != default_dataset(model) and "dataset" not in changes:
            changes["dataset"] = default_dataset(model)
            notes.append(form.describe_dataset_move(model, changes["dataset"]))
        changes = moves | changes
        st.session_state[followed_key("train")] = (model, optimizer)  # the Train page's follow_recipe: followed
        if notes:
            st.session_state[recipe_note_key("train")] = " ".join(notes)
    changes["learning_rate"] = recipes.learning_rate(model, optimizer, own_rate)  # what the form will show
    st.session_state[TRAIN_CONFIG] = RunConfig.from_dict(current.to_dict() | changes)  # the Train page checks it


def prepare_train_form(limits: Limits) -> None:
    """Before the Train form draws: its first values (the defaults within this deployment's limits), and any
    setting another page has changed in the shared config since the form last drew."""

    def within(value: int, limit: int | None) -> int:
        return min(value, limit) if limit else value

    base = form.DEFAULTS  # the default model (tiny-bert) and its recipe
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
        st.session_state.update(model_widget_values("train", shared.model))
    if shared.dataset != shown.dataset and shared.dataset in BUILTIN_DATASETS:
        st.session_state[f"{TRAIN_FORM}dataset_choice"] = shared.dataset


def filled_note(config: RunConfig) -> tuple[str | None, bool]:
    """The sentence for the Train form's top after another page filled it, saying what it filled (None once the
    visitor has changed one of those fields: the form no longer shows what that page chose; or if none did), and
    whether this is the first time the form says it."""
    filled = st.session_state.get(_FILLED)
    if filled is None:
        return None, False
    source, values = filled
    if any(getattr(config, name) != value for name, value in values.items()):
        del st.session_state[_FILLED]
        return None, False
    first = not st.session_state.get(_FILLED_SAID)
    st.session_state[_FILLED_SAID] = True
    return form.describe_filled(source, values), first


def keep_train_config(config: RunConfig) -> None:
    """After the Train form drew: its settings, for the other pages."""
    st.session_state[TRAIN_CONFIG] = st.session_state[_TRAIN_CONFIG_SHOWN] = config
