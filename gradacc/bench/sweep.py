"""The price of small micro-batches: (m, k) pairs with one effective batch, timed and evaluated.

Every pair trains the same model from the same initial weights on the same data in the same order with
exact loss normalisation and dropout off, so the optimizer sees the same gradients (up to float
rounding) whatever m is: the loss curves and final F1 should coincide, while the time per optimizer step
grows as m shrinks (more, smaller forward/backward passes).

Timed: seconds between consecutive step events within an epoch (median), i.e. one effective batch;
samples/s = effective batch / that. Evaluation, set-up and the first step are outside these intervals.
Both wall time and process CPU time are kept: on a shared machine the CPU-time ratio is the steadier.
Every pair runs once per round, the rounds rotate the order, and each slowdown is taken against the k=1
run of the same round.
"""

from __future__ import annotations

import statistics
import time

from plotly.subplots import make_subplots

from gradacc.bench import report, runs
from gradacc.config import RunConfig

FULL = dict(effective_batch=32, train_samples=1024, eval_samples=256, epochs=3, max_seq_length=64, rounds=3)
QUICK = dict(effective_batch=8, train_samples=32, eval_samples=16, epochs=1, max_seq_length=32, rounds=1)
BACKEND = "pytorch"


def pairs(effective_batch: int) -> list[tuple[int, int]]:
    m, result = effective_batch, []
    while m >= 1:
        result.append((m, effective_batch // m))
        m //= 2
    return result


def one_run(m: int, k: int, size: dict) -> dict:
    config = RunConfig(backend=BACKEND, micro_batch_size=m, grad_accum_steps=k, epochs=size["epochs"],
                       train_samples=size["train_samples"], eval_samples=size["eval_samples"],
                       max_seq_length=size["max_seq_length"], dropout=0.0, loss_normalization="exact")
    sink = runs.AppSink()
    ended = runs.train(config, sink)
    steps, evals = sink.of("step"), sink.of("eval")
    cpu_steps = [{"epoch": e["epoch"], "elapsed_s": cpu} for e, cpu in zip(steps, sink.cpu_times)]
    return {"wall": statistics.median(report.step_intervals(steps)),
            "cpu": statistics.median(report.step_intervals(cpu_steps)), "run_wall_s": ended["wall_s"],
            "optimizer_steps": len(steps), "final_eval_f1": evals[-1]["eval_f1"],
            "final_eval_loss": evals[-1]["eval_loss"], "eval_f1_by_epoch": [e["eval_f1"] for e in evals],
            "losses": [e["loss"] for e in steps]}


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("sweep", quick, threads, {
        **size, "backend": BACKEND, "model": "tiny-bert", "loss_normalization": "exact", "dropout": 0.0,
        "timed": "median seconds between consecutive step events within an epoch (one effective batch); "
                 "every pair once per round, in a rotating order; medians over rounds"})
    grid = pairs(size["effective_batch"])
    measured = {pair: [] for pair in grid}
    for round_index in range(size["rounds"]):
        shift = round_index % len(grid)
        for m, k in grid[shift:] + grid[:shift]:
            report.progress(f"round {round_index + 1}/{size['rounds']}: m={m} k={k}")
            measured[(m, k)].append(one_run(m, k, size))

    rows = []
    baseline = measured[grid[0]]  # k = 1: the whole effective batch in one micro-batch
    for (m, k), results in measured.items():
        first = results[0]  # the learning is deterministic; the rounds repeat it only for the clock
        row = {"micro_batch_size": m, "grad_accum_steps": k,
               "seconds_per_effective_batch": statistics.median(r["wall"] for r in results),
               "cpu_seconds_per_effective_batch": statistics.median(r["cpu"] for r in results),
               # Each round's time over the same round's k=1 time: both from the same stretch of machine time.
               "slowdown_vs_k1": report.spread([r["wall"] / b["wall"] for r, b in zip(results, baseline)]),
               "cpu_slowdown_vs_k1": report.spread([r["cpu"] / b["cpu"] for r, b in zip(results, baseline)]),
               "final_eval_f1_by_round": [r["final_eval_f1"] for r in results],
               **{key: first[key] for key in ("optimizer_steps", "final_eval_f1", "final_eval_loss",
                                              "eval_f1_by_epoch", "losses")}}
        row["samples_per_s"] = size["effective_batch"] / row["seconds_per_effective_batch"]
        row["max_loss_difference_vs_k1"] = max(abs(a - b) for a, b in zip(row["losses"], baseline[0]["losses"]))
        rows.append(row)
    result["pairs"] = rows
    f1s = [f1 for r in rows for f1 in r["final_eval_f1_by_round"]]
    result["final_eval_f1_range"] = max(f1s) - min(f1s)
    result["max_loss_difference"] = max(r["max_loss_difference_vs_k1"] for r in rows)
    result["notes"] = [
        f"Same effective batch {size['effective_batch']}, exact normalisation: final eval F1 differs by at most "
        f"{result['final_eval_f1_range']:.4f} and per-step training loss by at most "
        f"{result['max_loss_difference']:.2e} across pairs.",
        "Times are this machine's (threads: %d); the claim is the slowdown ratio against k = 1." % threads,
    ]
    return report.finish(result, started)


def figure(result: dict):
    rows = result["pairs"]
    labels = [f"m={r['micro_batch_size']}, k={r['grad_accum_steps']}" for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Seconds per optimizer step (one effective batch)",
                                                        "Training loss per optimizer step"))
    for key, slowdown, name in (("seconds_per_effective_batch", "slowdown_vs_k1", "wall"),
                                ("cpu_seconds_per_effective_batch", "cpu_slowdown_vs_k1", "process CPU")):
        fig.add_bar(x=labels, y=[r[key] for r in rows], name=f"{name} s per step", legendgroup="time",
                    text=[f"×{r[slowdown]['median']:.1f}" for r in rows], textposition="outside", row=1, col=1)
    for label, row in zip(labels, rows):
        fig.add_scatter(y=row["losses"], x=list(range(1, len(row["losses"]) + 1)), mode="lines",
                        name=f"{label}: F1 {row['final_eval_f1']:.3f}", row=1, col=2)
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="optimizer step", row=1, col=2)
    fig.update_yaxes(title_text="loss", row=1, col=2)
    fig.update_layout(title=f"Effective batch {result['settings']['effective_batch']}: same curve, more time as "
                            "the micro-batch shrinks (labels: × the time of k=1)", template="plotly_white",
                      barmode="group")
    return fig


def table(result: dict):
    headers = ["m", "k", "s / effective batch", "samples/s", "× time of k=1", "CPU s / eff. batch", "× CPU of k=1",
               "(min–max)", "final eval F1", "max |Δloss| vs k=1"]
    rows = [[r["micro_batch_size"], r["grad_accum_steps"], r["seconds_per_effective_batch"], r["samples_per_s"],
             r["slowdown_vs_k1"]["median"], r["cpu_seconds_per_effective_batch"], r["cpu_slowdown_vs_k1"]["median"],
             f"{r['cpu_slowdown_vs_k1']['min']:.2f}–{r['cpu_slowdown_vs_k1']['max']:.2f}", r["final_eval_f1"],
             f"{r['max_loss_difference_vs_k1']:.1e}"] for r in result["pairs"]]
    return headers, rows
