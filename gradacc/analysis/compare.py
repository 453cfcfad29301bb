"""Compare runs: the headline of two runs, one summary row per run, names by what differs, and the CSV/JSON
exports; no Streamlit here (the Compare page, the Demos page and ``python -m gradacc compare`` share it)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from gradacc import events as ev
from gradacc.config import FIELD_LABELS, PITFALLS, RunConfig

# Columns of the table and the CSV, in order: what accumulation trades first, the rest after.
COLUMNS = ("name", "m", "k", "effective batch", "peak activation bytes", "time per step (s)", "samples/s",
           "final F1", "final accuracy", "final perplexity", "final next-token accuracy", "wall time (s)", "optimizer steps", "status", "backend", "model", "dataset",
           "loss normalization", "epochs", "learning rate", "dropout", "label", "run")
# What each task's evaluation gives (classification: F1 and accuracy; a causal LM: perplexity and next-token
# accuracy): the table on the page shows those some run has, the CSV all of them.
EVAL_COLUMNS = {"final F1": "eval_f1", "final accuracy": "eval_accuracy", "final perplexity": "eval_perplexity",
                "final next-token accuracy": "eval_next_token_accuracy"}
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def title(run) -> str:
    """How a run is named in the picker and the legends: its label, a short id, its status."""
    return f"{run.name} · {run.run_id[-6:]} · {run.status}" if run.label else f"{run.run_id} · {run.status}"


def legend_name(run) -> str:
    """Short enough for a chart legend: what differs between runs, and an id to tell twins apart."""
    config = run.config
    return (f"{config.get('backend')} m{config.get('micro_batch_size')}×k{config.get('grad_accum_steps')} "
            f"{config.get('loss_normalization')} · {run.run_id[-6:]}")


def summary(run, name: str | None = None) -> dict:
    """The row of ``run`` in the comparison table (None where the run has not got that far); ``name``: what
    sets it apart from the runs beside it (``differing_labels``)."""
    config = run.config
    run_events = run.events
    steps = [e for e in run_events if e.get("event") == ev.STEP]
    evals = [e for e in run_events if e.get("event") == ev.EVAL]
    ended = next((e for e in reversed(run_events) if e.get("event") == ev.RUN_ENDED), None)
    activations = [e["activation_bytes"] for e in steps if e.get("activation_bytes") is not None]
    wall = ended["wall_s"] if ended else (steps[-1]["elapsed_s"] if steps else None)
    m, k = config.get("micro_batch_size"), config.get("grad_accum_steps")
    row = {
        "name": name or run.name,
        "run": run.run_id,
        "label": run.label,
        "status": run.status,
        "backend": config.get("backend"),
        "model": config.get("model"),
        "dataset": Path(str(config.get("dataset", ""))).name,  # an upload's folder is nobody's business
        "loss normalization": config.get("loss_normalization"),
        "m": m,
        "k": k,
        "effective batch": m * k * config.get("num_processes", 1) if m and k else None,
        "epochs": config.get("epochs"),
        "optimizer steps": steps[-1]["step"] if steps else 0,
        "wall time (s)": round(wall, 2) if wall is not None else None,
        "samples/s": round(steps[-1]["samples_per_s"], 1) if steps else None,
        "time per step (s)": round(steps[-1]["elapsed_s"] / steps[-1]["step"], 3) if steps else None,
        "learning rate": config.get("learning_rate"),
        "dropout": config.get("dropout"),
        "peak activation bytes": max(activations) if activations else None,
        **{column: _rounded(evals[-1].get(field)) if evals else None for column, field in EVAL_COLUMNS.items()},
    }
    return {column: row[column] for column in COLUMNS}


def shown_columns(rows: list[dict]) -> list[str]:
    """The table's columns for these rows: every one, but the evaluation scores no run has (an LM has no F1)."""
    return [column for column in COLUMNS
            if column not in EVAL_COLUMNS or any(row.get(column) is not None for row in rows)]


def safe_cell(value):
    """Text a spreadsheet would run as a formula gets a leading quote; everything else is left alone."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({column: safe_cell(row.get(column)) for column in COLUMNS})
    return buffer.getvalue()


def to_json(runs) -> str:
    """Every chosen run: its summary, its full config and its events (enough to redraw any chart)."""
    return json.dumps([{"summary": summary(run), "config": run.config, "events": run.events} for run in runs],
                      indent=1, default=str)


# ---- the headline of two runs ----------------------------------------------------------------------

# Curves closer than this (largest relative difference at the same samples seen) are "identical": float
# summation order alone moves the loss by ~1e-7.
IDENTICAL = 1e-4
# ... and closer than this "match" (dropout on, or another backend's kernels).
MATCH = 1e-2
# Config fields that decide which examples a run sees, in which order: a difference here is "different data".
DATA_FIELDS = ("dataset", "text_column", "label_column", "dataset_split", "train_samples", "eval_samples", "seed",
               "max_seq_length")
# Eval keys that are bookkeeping, not a metric.
NOT_METRICS = {"event", "time", "epoch", "step", "majority_f1"}
# Config fields never worth naming as a difference between runs.
NOT_DIFFERENCES = {"instrument"}


def run_figures(run_events: list[dict]) -> dict:
    """What the headline needs from one run's events: its loss curve and its costs."""
    started = next((e for e in run_events if e.get("event") == ev.RUN_STARTED), {}) or {}
    steps = [e for e in run_events if e.get("event") == ev.STEP]
    evals = [e for e in run_events if e.get("event") == ev.EVAL]
    activations = [e["activation_bytes"] for e in steps if e.get("activation_bytes") is not None]
    last = steps[-1] if steps else {}
    return {
        "config": started.get("config") or {},
        "effective_batch": started.get("effective_batch"),
        "curve": {e["samples_seen"]: e["loss"] for e in steps if e.get("loss") is not None},
        "peak_activation_bytes": max(activations) if activations else None,
        "time_per_step_s": last["elapsed_s"] / last["step"] if last.get("step") else None,
        "samples_per_s": last.get("samples_per_s"),
        "eval": {key: value for key, value in (evals[-1] if evals else {}).items()
                 if key not in NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool)},
    }


def loss_difference(curve_a: dict, curve_b: dict) -> tuple[float | None, int]:
    """(largest relative difference of the two losses at the same samples seen, points compared).

    Points are compared where both runs logged the same number of samples; runs with different effective
    batches share fewer such points (every other one for 32 against 64), never none (the end of an epoch).
    """
    shared = sorted(set(curve_a) & set(curve_b))
    if not shared:
        return None, 0
    worst = max(abs(curve_a[x] - curve_b[x]) / max(abs(curve_a[x]), abs(curve_b[x]), 1e-12) for x in shared)
    return worst, len(shared)


def _rounded(value) -> float | None:
    return round(value, 4) if value is not None else None


def config_differences(config_a: dict, config_b: dict) -> list[str]:
    """Config fields whose values differ, in the order RunConfig lists them."""
    names = [name for name in RunConfig().to_dict() if name not in NOT_DIFFERENCES]
    return [name for name in names if config_a.get(name) != config_b.get(name)]


def headline(events_a: list[dict], events_b: list[dict]) -> dict:
    """The result of two runs in figures and one sentence: run B described against run A.

    Keys: ``loss_max_rel_diff`` and ``loss_points_compared``, ``activation_ratio`` (A's peak activation bytes
    over B's: >1 means B holds fewer), ``time_per_step_ratio`` and ``samples_per_s_ratio`` (B over A),
    ``effective_batch`` [A, B], ``eval`` {metric: [A, B]} (F1 when both have it, else every eval metric both
    runs report), ``differences`` (config fields), ``same_data``, ``same_effective_batch``, and ``headline``.
    """
    a, b = run_figures(events_a), run_figures(events_b)
    rel_diff, points = loss_difference(a["curve"], b["curve"])
    differences = config_differences(a["config"], b["config"])
    same_data = not set(differences) & set(DATA_FIELDS)
    same_batch = a["effective_batch"] == b["effective_batch"]
    shared_metrics = [key for key in a["eval"] if key in b["eval"]]
    if "eval_f1" in shared_metrics:
        shared_metrics = ["eval_f1"]
    figures = {
        "loss_max_rel_diff": rel_diff,
        "loss_points_compared": points,
        "activation_ratio": _ratio(a["peak_activation_bytes"], b["peak_activation_bytes"]),
        "peak_activation_bytes": [a["peak_activation_bytes"], b["peak_activation_bytes"]],
        "time_per_step_ratio": _ratio(b["time_per_step_s"], a["time_per_step_s"]),
        "time_per_step_s": [a["time_per_step_s"], b["time_per_step_s"]],
        "samples_per_s_ratio": _ratio(b["samples_per_s"], a["samples_per_s"]),
        "samples_per_s": [a["samples_per_s"], b["samples_per_s"]],
        "effective_batch": [a["effective_batch"], b["effective_batch"]],
        "eval": {key: [a["eval"][key], b["eval"][key]] for key in shared_metrics},
        "differences": differences,
        "same_data": same_data,
        "same_effective_batch": same_batch,
    }
    figures["loss_claim"] = _loss_claim(figures, a["config"], b["config"])
    figures["memory_claim"] = _memory_claim(figures["activation_ratio"])
    parts = [_pitfall_claim(a["config"], b["config"]), figures["loss_claim"], figures["memory_claim"],
             _time_claim(figures["time_per_step_ratio"]), _eval_claim(figures["eval"])]
    figures["headline"] = " · ".join(part for part in parts if part)
    return figures


def _ratio(top, bottom) -> float | None:
    if top is None or bottom is None or not bottom or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def _loss_claim(figures: dict, config_a: dict, config_b: dict) -> str:
    rel_diff = figures["loss_max_rel_diff"]
    caveats = []
    if not figures["same_data"]:
        fields = [name for name in figures["differences"] if name in DATA_FIELDS]
        caveats.append("different data (" + ", ".join(
            f"{field_name(n)} {_value(config_a.get(n))} vs {_value(config_b.get(n))}" for n in fields) + ")")
    if not figures["same_effective_batch"]:
        batch_a, batch_b = figures["effective_batch"]
        caveats.append(f"different effective batches ({batch_a} vs {batch_b})")
    if rel_diff is None:
        return "; ".join(caveats + ["no loss at the same samples seen to compare"]).capitalize()
    size = "0" if rel_diff == 0 else f"{rel_diff:.0e}" if rel_diff < MATCH else f"{rel_diff:.0%}"
    if caveats:  # honest: such curves are not expected to be equal, whatever the numbers say
        return ("; ".join(caveats) + f": loss differs by up to {size} at the same samples seen").capitalize()
    if rel_diff < IDENTICAL:
        return f"Loss curves identical (max difference {size})"
    if rel_diff < MATCH:
        return f"Loss curves match (max difference {size})"
    what = ", ".join(f"{field_name(n)} {_value(config_a.get(n))} vs {_value(config_b.get(n))}"
                     for n in figures["differences"]) or "nothing in the config"
    return f"Loss curves differ by up to {size} at the same samples seen ({what} differ)"


def _pitfall_claim(config_a: dict, config_b: dict) -> str | None:
    """'Broken on purpose: scheduler-per-micro-batch (accelerate #963)' for pitfalls B runs and A does not
    ('fixed: ...' the other way round); None when both run the same."""
    a, b = config_a.get("pitfalls") or [], config_b.get("pitfalls") or []

    def named(names):
        return ", ".join(f"{name} ({PITFALLS.get(name, 'unknown')})" for name in names)

    parts = [f"broken on purpose: {named(n for n in b if n not in a)}" if set(b) - set(a) else None,
             f"fixed: {named(n for n in a if n not in b)}" if set(a) - set(b) else None]
    claim = "; ".join(p for p in parts if p)
    return claim[:1].upper() + claim[1:] or None


def _memory_claim(ratio: float | None) -> str | None:
    if ratio is None:
        return None
    if abs(ratio - 1) < 0.05:
        return "activations the same"
    return f"activations {ratio:.1f}× smaller" if ratio > 1 else f"activations {1 / ratio:.1f}× larger"


def _time_claim(ratio: float | None) -> str | None:
    if ratio is None:
        return None
    if abs(ratio - 1) < 0.05:
        return "same time per step"
    return f"{ratio:.1f}× slower per step" if ratio > 1 else f"{1 / ratio:.1f}× faster per step"


def _eval_claim(metrics: dict) -> str | None:
    parts = []
    for key, (value_a, value_b) in metrics.items():
        name = METRIC_NAMES.get(key, key.removeprefix("eval_").replace("_", " "))
        if f"{value_a:.3f}" == f"{value_b:.3f}":
            parts.append(f"{name} {value_a:.3f} both")
        else:
            parts.append(f"{name} {value_a:.3f} vs {value_b:.3f}")
    return ", ".join(parts) or None


METRIC_NAMES = {"eval_f1": "F1", "eval_accuracy": "accuracy", "eval_loss": "eval loss"}
# Legends and headlines need shorter names than the page's labels (config.FIELD_LABELS) for a few fields.
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


def default_picks(runs, owner: str, count: int = 2) -> list[str]:
    """The runs Compare opens with: ``owner``'s newest run and their newest one comparable to it (the same
    data and model, so the headline has something to say); else their newest runs; else the server's.

    ``runs`` are newest first.
    """
    own = [run for run in runs if run.owner == owner] or list(runs)
    if not own:
        return []
    newest = own[0]
    same = [run for run in own[1:] if _comparable(newest.config, run.config)]
    picks = [newest, *same] if same else own
    return [run.run_id for run in picks[:count]]


def _comparable(config_a: dict, config_b: dict) -> bool:
    return all(config_a.get(name) == config_b.get(name) for name in (*DATA_FIELDS, "model"))


def read_events(path: str | Path) -> list[dict]:
    """Events from a ``--metrics-out`` JSONL file (GradaccError with the file's name when unreadable)."""
    from gradacc.errors import GradaccError

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise GradaccError(f"Could not read {str(path)!r}: {getattr(error, 'strerror', None) or error}.") from None
    found = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                event = json.loads(line)
            except ValueError:
                raise GradaccError(f"{Path(path).name!r} line {number} is not JSON; pass a file written by "
                                   "--metrics-out.") from None
            if isinstance(event, dict) and "event" in event:
                found.append(event)
    if not any(e["event"] == ev.STEP for e in found):
        raise GradaccError(f"{Path(path).name!r} has no training steps; pass a file written by --metrics-out.")
    return found
