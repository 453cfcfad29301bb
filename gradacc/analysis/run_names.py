"""How runs are named beside each other (by what differs between their configs) and which two a page opens with."""

from __future__ import annotations

import json
from pathlib import Path

from gradacc import events as ev
from gradacc.config import RunConfig
from gradacc.labels import FIELD_LABELS


# A failed run's reason in the picker is cut to this many characters: the picker is one line per run.
REASON_CHARS = 90


def title(run) -> str:
    """How a run is named in the picker and the legends: its label, a short id, its status (a failed run's with its
    reason, so it is never mistaken for a run to compare)."""
    status, reason = run.status, run.reason
    if status == ev.FAILED and reason:
        status += f": {reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + '…'}"
    return f"{run.name} · {run.run_id[-6:]} · {status}" if run.label else f"{run.run_id} · {status}"


def legend_name(run) -> str:
    """Short enough for a chart legend: what differs between runs, and an id to tell twins apart."""
    config = run.config
    return (f"{config.get('backend')} m{config.get('micro_batch_size')}×k{config.get('grad_accum_steps')} "
            f"{config.get('loss_normalization')} · {run.run_id[-6:]}")


def config_differences(config_a: dict, config_b: dict) -> list[str]:
    """Config fields whose values differ, in the order RunConfig lists them."""
    names = [name for name in RunConfig().to_dict() if name not in NOT_DIFFERENCES]
    return [name for name in names if config_a.get(name) != config_b.get(name)]


# Config fields that decide which examples a run sees, in which order: a difference here is "different data".
DATA_FIELDS = ("dataset", "text_column", "label_column", "dataset_split", "train_samples", "eval_samples", "seed",
               "max_seq_length")
# Config fields never worth naming as a difference between runs.
NOT_DIFFERENCES = {"instrument"}
# Legends and headlines need shorter names than the page's labels (labels.FIELD_LABELS) for a few fields.
SHORT_NAMES = {"micro_batch_size": "m", "grad_accum_steps": "k", "loss_normalization": "normalisation",
               "learning_rate": "lr", "max_seq_length": "max length"}


def field_name(name: str) -> str:
    return SHORT_NAMES.get(name) or FIELD_LABELS.get(name, name.replace("_", " ")).lower()


def _value(value) -> str:
    if isinstance(value, (list, tuple)):  # pitfalls
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and ("/" in value or "\\" in value):
        return Path(value).name  # an upload's folder is nobody's business
    return str(value)


def differing_labels(configs: dict[str, dict]) -> dict[str, str]:
    """{key: a name made of what differs between these configs}; m×k always, since that is the story.

    Twins (nothing differs) get #1, #2 so the legends still tell them apart.
    """
    keys = list(configs)
    differing = [name for name in RunConfig().to_dict() if name not in NOT_DIFFERENCES
                 and name not in ("micro_batch_size", "grad_accum_steps")
                 and len({json.dumps(configs[key].get(name), default=str) for key in keys}) > 1]
    labels = {}
    for key in keys:
        config = configs[key]
        parts = [f"m={config.get('micro_batch_size')}, k={config.get('grad_accum_steps')}"]
        for name in differing:
            value = config.get(name)
            if name == "trainer_library_default":
                parts.append("Trainer library default" if value else "gradacc's loss fix")
            elif name in ("backend", "loss_normalization"):
                parts.append(str(value))
            elif name == "pitfalls":
                parts.append(f"broken: {_value(value)}" if value else "right loop")
            elif name == "memory_budget_mb":
                parts.append(f"budget {value:g} MB" if value else "no memory budget")
            else:
                parts.append(f"{field_name(name)} {_value(value)}")
        labels[key] = ", ".join(parts)
    seen: dict[str, int] = {}
    for key in keys:
        seen[labels[key]] = seen.get(labels[key], 0) + 1
    counters: dict[str, int] = {}
    for key in keys:
        if seen[labels[key]] > 1:
            counters[labels[key]] = counters.get(labels[key], 0) + 1
            labels[key] = f"{labels[key]} #{counters[labels[key]]}"
    return labels


# What Compare says when it has no two runs to open with.
NO_PICKS = ("No two completed runs of the same model and data to compare yet: pick runs above, or train two on the "
            "Train page (the same model and data, another m and k) and come back.")


def default_picks(runs, owner: str) -> list[str]:
    """The two runs Compare opens with: completed runs of the same model and data, so the headline compares like
    with like: ``owner``'s newest run that has such a partner, and its newest partner; else the server's; else none
    (the page says what to do). A failed, stopped or live run has no whole curve: never picked for the visitor.

    ``runs`` are newest first.
    """
    completed = [run for run in runs if run.status == ev.COMPLETED]
    for pool in ([run for run in completed if run.owner == owner], completed):
        for index, newest in enumerate(pool):
            partner = next((run for run in pool[index + 1:] if _comparable(newest.config, run.config)), None)
            if partner is not None:
                return [newest.run_id, partner.run_id]
    return []


def _comparable(config_a: dict, config_b: dict) -> bool:
    return all(config_a.get(name) == config_b.get(name) for name in (*DATA_FIELDS, "model"))
