"""Memory across micro-batch sizes at one effective batch, and across accumulation steps at one m.

Every micro-batch is padded to the same length (``max_seq_length``), so a micro-batch of m examples is
exactly m × L tokens: the ratios then show m alone. (gradacc's default collator pads each micro-batch to
its longest text, which mixes m with length.) Each point is a short run of the plain PyTorch backend; its
step events give activation bytes per micro-batch (saved-tensor hooks), static bytes (parameters,
gradients, AdamW state) and process RSS. In the full suite each point runs in a fresh process, so its
RSS is its own and not the high-water mark of the points before.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import statistics
import time

from plotly.subplots import make_subplots
import torch
import transformers.models.bert.modeling_bert  # noqa: F401 - imported before a point's RSS baseline, not in its growth

import gradacc.training.backends.pytorch_loop  # noqa: F401 - the same
from gradacc.bench import report, runs
from gradacc.config import RunConfig
from gradacc.training.memory import measure

FULL = dict(effective_batch=64, max_seq_length=64, steps=2, fixed_m=8, ks=(1, 2, 4, 8), fresh_process=True)
QUICK = dict(effective_batch=32, max_seq_length=32, steps=1, fixed_m=8, ks=(1, 2, 4), fresh_process=False)
RATIO = (8, 32)  # activation(m=8) / activation(m=32); linear in m means 0.25
RATIO_GOAL, RATIO_TOLERANCE, K_SPREAD_GOAL = 0.25, 0.03, 0.02


def micro_batches(effective_batch: int) -> list[int]:
    sizes, m = [], 1
    while m <= effective_batch:
        sizes.append(m)
        m *= 2
    return sizes


def measure_point(m: int, k: int, size: dict, threads: int) -> dict:
    """One short run at (m, k); module-level so a fresh process can run it."""
    torch.set_num_threads(threads)
    config = RunConfig(backend="pytorch", micro_batch_size=m, grad_accum_steps=k, epochs=1,
                       max_steps=size["steps"], train_samples=m * k * size["steps"], eval_samples=8,
                       max_seq_length=size["max_seq_length"], dropout=0.0)
    collate = runs.fixed_length_collator(config.model, config.max_seq_length)
    rss_before = measure.rss_bytes()
    sink = runs.AppSink()
    runs.train(config, sink, collate=collate)
    steps = sink.of("step")
    activations = sorted({e["activation_bytes"] for e in steps})
    cuda = [e["cuda_peak_bytes"] for e in steps if e.get("cuda_peak_bytes") is not None]
    return {"micro_batch_size": m, "grad_accum_steps": k,
            # Every micro-batch has the same shape, so every step should read the same; keep them all.
            "activation_bytes": activations[-1], "activation_bytes_seen": activations,
            "static_bytes": sink.of("run_started")[0]["static_memory"],
            "rss_before_bytes": rss_before, "rss_peak_bytes": max(e["rss_bytes"] for e in steps),
            "cuda_peak_bytes": max(cuda) if cuda else None}


def measure_all(points: list[tuple[int, int]], size: dict, threads: int) -> list[dict]:
    if not size["fresh_process"]:
        return [measure_point(m, k, size, threads) for m, k in points]
    results = []
    for m, k in points:  # one process per point, one at a time: RSS and timing undisturbed
        report.progress(f"m={m} k={k} in a fresh process")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results.append(pool.submit(measure_point, m, k, size, threads).result())
    return results


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    effective = size["effective_batch"]
    result = report.envelope("memory", quick, threads, {
        **size, "backend": "pytorch", "model": "tiny-bert", "dropout": 0.0,
        "padding": f"every micro-batch padded to max_seq_length={size['max_seq_length']} tokens (fixed length)",
        "activation_bytes": "bytes autograd saves for backward in one micro-batch's forward (saved-tensor hooks)"})

    by_m = measure_all([(m, effective // m) for m in micro_batches(effective)], size, threads)
    by_k = measure_all([(size["fixed_m"], k) for k in size["ks"]], size, threads)

    result["points"] = by_m
    result["points_by_k"] = by_k
    result["activation_bytes"] = {str(p["micro_batch_size"]): p["activation_bytes"] for p in by_m}
    result["activation_bytes_by_k"] = {str(p["grad_accum_steps"]): p["activation_bytes"] for p in by_k}
    result["static_bytes"] = by_m[0]["static_bytes"]
    result["rss_peak_bytes"] = {str(p["micro_batch_size"]): p["rss_peak_bytes"] for p in by_m}

    small, large = RATIO
    ratio = result["activation_bytes"][str(small)] / result["activation_bytes"][str(large)]
    values = list(result["activation_bytes_by_k"].values())
    k_spread = (max(values) - min(values)) / statistics.median(values)
    result["activation_ratio_m8_m32"] = ratio
    result["activation_spread_across_k"] = k_spread
    result["goals"] = {
        "activation(m=8)/activation(m=32)": report.goal(ratio, f"{RATIO_GOAL} ± {RATIO_TOLERANCE}",
                                                        abs(ratio - RATIO_GOAL) <= RATIO_TOLERANCE),
        f"activation spread across k (m={size['fixed_m']})": report.goal(k_spread, f"<= {K_SPREAD_GOAL}",
                                                                         k_spread <= K_SPREAD_GOAL),
    }
    on_cuda = any(p["cuda_peak_bytes"] is not None for p in by_m)
    result["notes"] = [
        f"Measured at a fixed sequence length of {size['max_seq_length']} tokens, so a micro-batch of m is m × "
        f"{size['max_seq_length']} tokens.",
        "Static bytes (parameters + gradients + AdamW state) do not depend on m or k.",
        "RSS is the whole process (Python, torch, the model), here one process for every point: after the first "
        "point it is a high-water mark." if not size["fresh_process"] else
        "RSS is the whole process, each point in its own fresh process; 'growth' is peak RSS during the run minus "
        "RSS before it (data, model, optimizer, forward/backward temporaries, allocator caching).",
    ]
    if not on_cuda:
        result["notes"].append("No GPU here: the CUDA peak-memory run was not measured.")
    return report.finish(result, started)


def figure(result: dict):
    by_m, by_k = result["points"], result["points_by_k"]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], subplot_titles=(
        f"Effective batch {result['settings']['effective_batch']}: micro-batch m, k = E/m",
        f"m = {result['settings']['fixed_m']}: accumulation steps k"))
    ms = [p["micro_batch_size"] for p in by_m]
    fig.add_scatter(x=ms, y=[report.megabytes(p["activation_bytes"]) for p in by_m], mode="lines+markers",
                    name="activations / micro-batch", row=1, col=1)
    fig.add_scatter(x=ms, y=[report.megabytes(p["static_bytes"]["total"]) for p in by_m], mode="lines",
                    line_dash="dash", name="parameters + gradients + AdamW state", row=1, col=1)
    fig.add_scatter(x=ms, y=[report.megabytes(p["rss_peak_bytes"] - p["rss_before_bytes"]) for p in by_m],
                    mode="lines+markers", line_dash="dot", name="RSS growth during the run", row=1, col=1)
    fig.add_bar(x=[str(p["grad_accum_steps"]) for p in by_k], y=[report.megabytes(p["activation_bytes"]) for p in by_k],
                name=f"activations / micro-batch, m={result['settings']['fixed_m']}", row=1, col=2)
    fig.update_xaxes(type="log", dtick=0.30102999566, title_text="micro-batch size m (log scale)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="MB (log scale)", row=1, col=1)
    fig.update_xaxes(title_text="accumulation steps k", row=1, col=2)
    fig.update_yaxes(title_text="MB", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=f"Activations follow m, not k (ratio m=8/m=32: {result['activation_ratio_m8_m32']:.3f})",
                      template="plotly_white", legend=dict(orientation="h", y=-0.2))
    return fig


def table(result: dict):
    headers = ["m", "k", "activations MB", "static MB", "RSS peak MB", "RSS growth MB"]
    rows = [[p["micro_batch_size"], p["grad_accum_steps"], report.megabytes(p["activation_bytes"]),
             report.megabytes(p["static_bytes"]["total"]), report.megabytes(p["rss_peak_bytes"]),
             report.megabytes(p["rss_peak_bytes"] - p["rss_before_bytes"])]
            for p in result["points"] + result["points_by_k"]]
    return headers, rows
