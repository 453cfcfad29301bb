"""The October 2024 gradient-accumulation bug, reproduced on a causal LM: how far naive ÷k drifts as k grows.

For each k at one fixed effective batch E (m = E/k), tiny-gpt trains the same number of optimizer steps
from the same initial weights on builtin-text in the same order, three ways: the full batch (m=E, k=1),
``naive`` (each micro-batch's mean token loss ÷ k) and ``exact`` (each micro-batch weighted by its share of
the window's predicted tokens). Reported per k and recipe: the L2 norm of the difference between the final
weights and the full-batch run's, and the relative difference of the final eval loss. Texts of very uneven
lengths make micro-batches predict very different numbers of tokens, which is what ÷k ignores.

Dropout is off and every window is full, so exact differs from the full batch only by float rounding
(summing k partial gradients instead of one) that the optimizer steps carry forward. Nothing is timed.
"""

from __future__ import annotations

import math
import time

import plotly.graph_objects as go

from gradacc.bench import report, runs
from gradacc.config import RunConfig

FULL = dict(effective_batch=32, ks=(1, 2, 4, 8, 16), optimizer_steps=20, eval_samples=100, max_seq_length=64)
QUICK = dict(effective_batch=8, ks=(1, 2, 8), optimizer_steps=2, eval_samples=16, max_seq_length=32)
MODEL, DATASET = "tiny-gpt", "builtin-text"
NORMALIZATIONS = ("naive", "exact")
# Zero cannot sit on a log axis: a difference of exactly 0 (k=1 is the full batch itself) is drawn here.
LOG_FLOOR = 1e-9


def config(size: dict, k: int, normalization: str) -> RunConfig:
    return RunConfig(backend="pytorch", model=MODEL, dataset=DATASET, task="causal-lm", seed=42,
                     micro_batch_size=size["effective_batch"] // k, grad_accum_steps=k, epochs=1,
                     train_samples=size["effective_batch"] * size["optimizer_steps"],
                     eval_samples=size["eval_samples"], max_seq_length=size["max_seq_length"], dropout=0.0,
                     loss_normalization=normalization, instrument=False)


def trained(run_config: RunConfig) -> tuple[dict, float, int]:
    """Final weights (by name), final eval loss and optimizer steps of one run."""
    held = {}

    def keep_model(model):  # called before every optimizer step; the same module object trains on
        held["model"] = model

    sink = runs.AppSink()
    runs.train(run_config, sink, before_optimizer_step=keep_model)
    weights = {name: p.detach().double().clone() for name, p in held["model"].named_parameters()}
    return weights, sink.of("eval")[-1]["eval_loss"], len(sink.of("step"))


def weight_distance(weights: dict, reference: dict) -> float:
    return math.sqrt(sum(float((weights[n] - reference[n]).pow(2).sum()) for n in reference))


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("ga-bug", quick, threads, {
        **size, "ks": list(size["ks"]), "model": MODEL, "dataset": DATASET, "backend": "pytorch", "dropout": 0.0,
        "compared": "final weights and final eval loss against the full-batch run (m = effective batch, k = 1)"})
    report.progress(f"full batch: m={size['effective_batch']}, k=1")
    reference, reference_loss, steps = trained(config(size, 1, "exact"))
    rows = []
    for k in size["ks"]:
        row = {"k": k, "micro_batch_size": size["effective_batch"] // k}
        if k == 1:  # m = E, k = 1 is the full-batch run itself, whatever the normalisation: no need to train it again
            rows.append({**row, **{f"{n}_{key}": value for n in NORMALIZATIONS for key, value in
                                   (("weight_l2", 0.0), ("eval_loss", reference_loss), ("eval_loss_rel_diff", 0.0))}})
            continue
        for normalization in NORMALIZATIONS:
            report.progress(f"{normalization}: m={row['micro_batch_size']}, k={k}")
            weights, eval_loss, run_steps = trained(config(size, k, normalization))
            if run_steps != steps:
                raise ValueError(f"k={k} took {run_steps} optimizer steps, the full batch {steps}")
            row[f"{normalization}_weight_l2"] = weight_distance(weights, reference)
            row[f"{normalization}_eval_loss"] = eval_loss
            row[f"{normalization}_eval_loss_rel_diff"] = abs(eval_loss - reference_loss) / abs(reference_loss)
        rows.append(row)
    result.update(rows=rows, optimizer_steps=steps, full_batch_eval_loss=reference_loss,
                  full_batch_weight_l2=math.sqrt(sum(float(w.pow(2).sum()) for w in reference.values())))
    largest = rows[-1]
    result["goals"] = {
        "naive_grows_with_k": report.goal(
            largest["naive_weight_l2"], "naive's weight difference grows with k (k>1)",
            all(a["naive_weight_l2"] < b["naive_weight_l2"] for a, b in zip(rows[1:], rows[2:]))
            and len(rows) > 1 and rows[1]["naive_weight_l2"] > 0),
        "exact_stays_at_rounding": report.goal(
            max(r["exact_weight_l2"] for r in rows), "exact below 1 % of naive at the largest k",
            max(r["exact_weight_l2"] for r in rows) < 0.01 * largest["naive_weight_l2"]),
    }
    return report.finish(result, started)


def figure(result: dict):
    rows = result["rows"]
    figure = go.Figure()
    for normalization, colour in (("naive", "#d62728"), ("exact", "#2ca02c")):
        values = [r[f"{normalization}_weight_l2"] for r in rows]
        figure.add_trace(go.Scatter(
            x=[r["k"] for r in rows], y=[max(v, LOG_FLOOR) for v in values], mode="lines+markers",
            name=f"{normalization} ({'each mean ÷ k' if normalization == 'naive' else 'by predicted tokens'})",
            line=dict(color=colour), customdata=values, hovertemplate="k=%{x}: %{customdata:.3e}<extra></extra>"))
    settings = result["settings"]
    figure.update_layout(
        title=f"tiny-gpt, effective batch {settings['effective_batch']}, {result['optimizer_steps']} optimizer steps: "
              "distance of the final weights from the full-batch run",
        xaxis=dict(title="accumulation steps k (micro-batch = effective batch / k)", type="log", dtick=math.log10(2),
                   tickvals=[r["k"] for r in rows]),
        yaxis=dict(title=f"‖w − w_full‖₂ (log; 0 drawn at {LOG_FLOOR:g})", type="log"),
        legend=dict(orientation="h", y=-0.2))
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["k", "m", "naive ‖Δw‖₂", "exact ‖Δw‖₂", "naive Δ eval loss", "exact Δ eval loss"]
    rows = [[r["k"], r["micro_batch_size"], f"{r['naive_weight_l2']:.3e}", f"{r['exact_weight_l2']:.3e}",
             f"{r['naive_eval_loss_rel_diff']:.2e}", f"{r['exact_eval_loss_rel_diff']:.2e}"] for r in result["rows"]]
    return headers, rows
