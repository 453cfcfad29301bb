"""Losses that couple the examples of a batch: where accumulation is not the big batch, measured.

Contrastive (in-batch negatives): all-MiniLM-L6-v2 on builtin-pairs at one effective batch E, three ways —
MultipleNegativesRankingLoss on batches of E (the reference), the same loss on m accumulated k = E/m times, and
CachedMultipleNegativesRankingLoss (GradCache) on batches of E with mini-batches of m. For each: the relative
error of its first gradient against the reference's and the activation bytes it measured (``gradacc check
--task contrastive``), then one epoch of training from the same weights in the same order and the retrieval
metrics on the held-out pairs (MRR@10, recall@1), beside the model's before training.

BatchNorm against LayerNorm: bow-batchnorm and bow-layernorm on builtin-sentiment, exact normalisation, the
relative gradient error of k micro-batches of m against one batch of m·k, for each m at one fixed m·k.
Dropout is off everywhere. Nothing is timed.
"""

from __future__ import annotations

import threading
import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gradacc.analysis import contrastive
from gradacc.analysis.equivalence import by_micro_batch
from gradacc.bench import report, runs
from gradacc.config import RunConfig
from gradacc.training.contrastive import retrieval_metrics
from gradacc.training.run.job import prepare

FULL = dict(model="all-MiniLM-L6-v2", effective_batch=64, micro_batch_size=16, max_seq_length=32, train_samples=512,
            eval_samples=300, learning_rate=5e-5, norm_effective_batch=32, norm_micro_batches=(2, 4, 8, 16, 32))
QUICK = dict(model="all-MiniLM-L6-v2", effective_batch=8, micro_batch_size=2, max_seq_length=16, train_samples=16,
             eval_samples=16, learning_rate=5e-5, norm_effective_batch=8, norm_micro_batches=(2, 4, 8))
NORM_MODELS = ("bow-batchnorm", "bow-layernorm")
EXACT_LOOKS_LIKE = 1e-5


def contrastive_config(size: dict) -> RunConfig:
    m = size["micro_batch_size"]
    return RunConfig(backend="pytorch", task="contrastive", model=size["model"], dataset="builtin-pairs", seed=42,
                     micro_batch_size=m, grad_accum_steps=size["effective_batch"] // m, epochs=1,
                     train_samples=size["train_samples"], eval_samples=size["eval_samples"],
                     max_seq_length=size["max_seq_length"], learning_rate=size["learning_rate"], dropout=0.0)


def untrained_retrieval(config: RunConfig) -> dict:
    """MRR@10, recall@1 and eval loss of the model as loaded: what one epoch of each way starts from."""
    job = prepare(config.replace(instrument=False).check(), lambda event: None, threading.Event())
    return retrieval_metrics(job.model, job.eval_examples, job.collate, job.device)


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("coupled", quick, threads, {**size, "norm_micro_batches": list(size["norm_micro_batches"]),
                                                         "backend": "pytorch", "dropout": 0.0})
    config = contrastive_config(size)
    report.progress(f"contrastive gradients: {size['model']}, effective batch {size['effective_batch']}")
    check = contrastive.check(config)
    result["before_training"] = untrained_retrieval(config)
    ways = []
    for name, way_config in contrastive.ways(config).items():
        report.progress(f"contrastive training, one epoch: {name}")
        sink = runs.AppSink()
        runs.train(way_config.replace(instrument=False), sink)
        final = sink.of("eval")[-1]
        ways.append({"way": name, **check["ways"][name], "optimizer_steps": len(sink.of("step")),
                     "eval_mrr_at_10": final["eval_mrr_at_10"], "eval_recall_at_1": final["eval_recall_at_1"],
                     "eval_loss": final["eval_loss"]})
    norms = []
    for model in NORM_MODELS:
        report.progress(f"{model}: effective batch {size['norm_effective_batch']} by m")
        norm_config = RunConfig(backend="pytorch", model=model, micro_batch_size=size["norm_effective_batch"],
                                grad_accum_steps=1, max_seq_length=32, dropout=0.0, max_grad_norm=0.0, epochs=1,
                                max_steps=1, eval_samples=8, instrument=False).check()
        for row in by_micro_batch(norm_config, list(size["norm_micro_batches"])):
            norms.append({"model": model, **row})
    result.update(contrastive=ways, norms=norms)
    by_way = {row["way"]: row for row in ways}
    batch_norm = [r["rel_error"] for r in norms if r["model"] == "bow-batchnorm" and r["grad_accum_steps"] > 1]
    layer_norm = [r["rel_error"] for r in norms if r["model"] == "bow-layernorm"]
    result["goals"] = {
        "accumulation_is_another_loss": report.goal(by_way["accumulation"]["rel_error"],
                                                    "accumulated in-batch negatives ≥ 0.1 off",
                                                    by_way["accumulation"]["rel_error"] >= 0.1),
        "gradcache_is_the_batch": report.goal(by_way["gradcache"]["rel_error"], f"GradCache ≤ {EXACT_LOOKS_LIKE:g} off",
                                              by_way["gradcache"]["rel_error"] <= EXACT_LOOKS_LIKE),
        "gradcache_memory_of_a_mini_batch": report.goal(
            by_way["gradcache"]["activation_bytes"] / by_way["batch"]["activation_bytes"],
            "GradCache's activations at most accumulation's, well below the batch's",
            by_way["gradcache"]["activation_bytes"] <= by_way["accumulation"]["activation_bytes"]
            and by_way["gradcache"]["activation_bytes"] < by_way["batch"]["activation_bytes"] / 2),
        "batchnorm_grows_as_m_shrinks": report.goal(
            max(batch_norm), "BatchNorm's error > 0 and larger for every smaller m",
            all(a > b for a, b in zip(batch_norm, batch_norm[1:])) and min(batch_norm) > EXACT_LOOKS_LIKE),
        "layernorm_is_exact": report.goal(max(layer_norm), f"LayerNorm ≤ {EXACT_LOOKS_LIKE:g} for every m",
                                          max(layer_norm) <= EXACT_LOOKS_LIKE),
    }
    return report.finish(result, started)


def figure(result: dict):
    settings = result["settings"]
    figure = make_subplots(rows=1, cols=2, subplot_titles=(
        f"{settings['model']}, effective batch {settings['effective_batch']}: gradient error",
        f"effective batch {settings['norm_effective_batch']}: gradient error by micro-batch"))
    ways = [row for row in result["contrastive"] if row["way"] != "batch"]
    figure.add_trace(go.Bar(x=[row["way"] for row in ways], y=[max(row["rel_error"], 1e-9) for row in ways],
                            text=[f"{row['rel_error']:.1e}" for row in ways], name="in-batch negatives"), row=1, col=1)
    for model, colour in zip(NORM_MODELS, ("#d62728", "#2ca02c")):
        rows = [r for r in result["norms"] if r["model"] == model and r["grad_accum_steps"] > 1]
        figure.add_trace(go.Scatter(x=[r["micro_batch_size"] for r in rows], y=[max(r["rel_error"], 1e-9) for r in rows],
                                    mode="lines+markers", name=model, line=dict(color=colour)), row=1, col=2)
    figure.update_yaxes(type="log", title_text="‖g − g_batch‖ / ‖g_batch‖ (log)")
    figure.update_xaxes(title_text="micro-batch m (k = effective batch / m)", type="log", row=1, col=2,
                        tickvals=sorted({r["micro_batch_size"] for r in result["norms"]}))
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["what", "m", "k", "mini", "rel. error", "activations", "MRR@10", "recall@1"]
    before = result["before_training"]
    rows = [["before training", "-", "-", "-", "-", "-", f"{before['eval_mrr_at_10']:.3f}",
             f"{before['eval_recall_at_1']:.3f}"]]
    rows += [[row["way"], row["micro_batch_size"], row["grad_accum_steps"], row["gradcache_mini_batch"] or "-",
             f"{row['rel_error']:.2e}", f"{row['activation_bytes'] / 1e6:.1f} MB", f"{row['eval_mrr_at_10']:.3f}",
             f"{row['eval_recall_at_1']:.3f}"] for row in result["contrastive"]]
    rows += [[row["model"], row["micro_batch_size"], row["grad_accum_steps"], "-", f"{row['rel_error']:.2e}", "-", "-",
              "-"] for row in result["norms"]]
    return headers, rows
