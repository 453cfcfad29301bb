"""Compare runs: one summary row per run, and the CSV/JSON exports; no Streamlit here."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from gradacc import events as ev

# Columns of the table and the CSV, in order.
COLUMNS = ("run", "label", "status", "backend", "model", "dataset", "loss normalization", "m", "k",
           "effective batch", "epochs", "optimizer steps", "wall time (s)", "samples/s",
           "peak activation bytes", "final F1", "final accuracy")
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


def summary(run) -> dict:
    """The row of ``run`` in the comparison table (None where the run has not got that far)."""
    config = run.config
    run_events = run.events
    steps = [e for e in run_events if e.get("event") == ev.STEP]
    evals = [e for e in run_events if e.get("event") == ev.EVAL]
    ended = next((e for e in reversed(run_events) if e.get("event") == ev.RUN_ENDED), None)
    activations = [e["activation_bytes"] for e in steps if e.get("activation_bytes") is not None]
    wall = ended["wall_s"] if ended else (steps[-1]["elapsed_s"] if steps else None)
    m, k = config.get("micro_batch_size"), config.get("grad_accum_steps")
    return {
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
        "peak activation bytes": max(activations) if activations else None,
        "final F1": round(evals[-1]["eval_f1"], 4) if evals else None,
        "final accuracy": round(evals[-1]["eval_accuracy"], 4) if evals else None,
    }


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
