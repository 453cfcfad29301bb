"""One summary row per run and the CSV/JSON exports of the Compare page; no Streamlit here (the Compare page,
the Demos page and ``python -m gradacc compare`` share it). The headline of two runs is in ``headline``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from gradacc import events as ev


# Columns of the table and the CSV, in order: what accumulation trades first, the rest after.
COLUMNS = ("name", "m", "k", "effective batch", "peak activation bytes", "time per step (s)", "samples/s",
           "final F1", "final accuracy", "final perplexity", "final next-token accuracy", "wall time (s)", "optimizer steps", "status", "backend", "model", "dataset",
           "loss normalization", "epochs", "learning rate", "dropout", "label", "run")
# What each task's evaluation gives (classification: F1 and accuracy; a causal LM: perplexity and next-token
# accuracy; contrastive: MRR@10 and recall@1): the table on the page shows those some run has, the CSV all of them.
EVAL_COLUMNS = {"final F1": "eval_f1", "final accuracy": "eval_accuracy", "final perplexity": "eval_perplexity",
                "final next-token accuracy": "eval_next_token_accuracy", "final MRR@10": "eval_mrr_at_10",
                "final recall@1": "eval_recall_at_1"}
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


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


def _rounded(value) -> float | None:
    return round(value, 4) if value is not None else None
