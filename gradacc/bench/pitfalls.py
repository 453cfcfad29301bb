"""Each pitfall of the plain loop against the right loop, side by side in one run of this suite.

The right loop and the same run with one deliberately wrong line (``pitfalls``) train the same model from the
same initial weights on the same data in the same order (tiny-bert, dropout 0). Reported per pitfall: the final
logged loss, eval loss and F1, the final learning rate, the examples whose gradient reached an optimizer step and
the optimizer steps, for both runs; and the broken run's own warning, which measures its effect against the
right loop inside that run (gradacc.training.backends.pitfalls). The training set is 16 examples past a whole number of
windows, so every epoch ends with a short window for drop-last-window to drop. clip-per-micro-batch has its
own pair with a tight max gradient norm: tiny-bert's gradients stay under the default 1.0, where clipping, right
or wrong, never engages. Nothing is timed.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go

from gradacc.bench import report, runs
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig

FULL = dict(micro_batch_size=8, grad_accum_steps=4, train_samples=2000, eval_samples=200, epochs=1)
QUICK = dict(micro_batch_size=4, grad_accum_steps=4, train_samples=72, eval_samples=32, epochs=1)
# Tight enough that clipping engages on tiny-bert's gradients (norms about 0.1 to 0.6).
TIGHT_CLIP = {"max_grad_norm": 0.1}
PAIR_CHANGES = {"clip-per-micro-batch": TIGHT_CLIP}


def config(size: dict, pitfalls: list[str], changes: dict) -> RunConfig:
    return RunConfig(backend="pytorch", model="tiny-bert", seed=42, dropout=0.0, instrument=False,
                     pitfalls=pitfalls, **size, **changes)


def measured(run_config: RunConfig) -> dict:
    sink = runs.AppSink()
    ended = runs.train(run_config, sink)
    steps, evals = sink.of("step"), sink.of("eval")
    last = steps[-1]
    trained = last["pitfall"]["examples_trained"] if "pitfall" in last else last["samples_seen"]
    return {"final_loss": last["loss"], "eval_loss": evals[-1]["eval_loss"], "eval_f1": evals[-1]["eval_f1"],
            "final_lr": last["lr"], "examples_trained": trained, "optimizer_steps": len(steps),
            "warnings": ended["warnings"]}


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("pitfalls", quick, threads, {
        **size, "model": "tiny-bert", "backend": "pytorch", "dropout": 0.0, "pair_changes": PAIR_CHANGES,
        "compared": "each pitfall's run against the right loop with the same settings"})
    right_runs: dict[str, dict] = {}
    rows = []
    for pitfall in PITFALLS:
        changes = PAIR_CHANGES.get(pitfall, {})
        key = repr(sorted(changes.items()))
        if key not in right_runs:
            report.progress(f"right loop {changes or ''}")
            right_runs[key] = measured(config(size, [], changes))
        report.progress(f"{pitfall} {changes or ''}")
        broken = measured(config(size, [pitfall], changes))
        effect = next((w for w in broken["warnings"] if w.startswith(f"Pitfall {pitfall}")), None)
        rows.append({"pitfall": pitfall, "upstream": PITFALLS[pitfall], "changes": changes,
                     "right": {k: v for k, v in right_runs[key].items() if k != "warnings"},
                     "broken": {k: v for k, v in broken.items() if k != "warnings"}, "effect": effect})
    result["rows"] = rows
    log, drop = (next(row for row in rows if row["pitfall"] == name) for name in ("log-undivided-loss",
                                                                                  "drop-last-window"))
    result["goals"] = {
        "every_pitfall_says_what_it_broke": report.goal(
            sum(row["effect"] is not None for row in rows), "every broken run's warnings name its pitfall",
            all(row["effect"] for row in rows)),
        "log_only_changes_the_log": report.goal(
            log["broken"]["final_loss"] / log["right"]["final_loss"],
            "log-undivided-loss: the same eval loss, a larger logged loss",
            log["broken"]["eval_loss"] == log["right"]["eval_loss"]
            and log["broken"]["final_loss"] > log["right"]["final_loss"]),
        "drop_last_trains_fewer_examples": report.goal(
            drop["right"]["examples_trained"] - drop["broken"]["examples_trained"],
            "drop-last-window: fewer examples trained than the right loop",
            drop["broken"]["examples_trained"] < drop["right"]["examples_trained"]),
    }
    return report.finish(result, started)


def figure(result: dict):
    rows = result["rows"]
    figure = go.Figure()
    for side, colour in (("right", "#2ca02c"), ("broken", "#d62728")):
        figure.add_trace(go.Bar(x=[r["pitfall"] for r in rows], y=[r[side]["eval_loss"] for r in rows],
                                name=f"{side} loop", marker_color=colour,
                                customdata=[r[side]["eval_f1"] for r in rows],
                                hovertemplate="eval loss %{y:.4f}, F1 %{customdata:.3f}<extra></extra>"))
    figure.update_layout(title="tiny-bert: final eval loss of the right loop and of each pitfall's run",
                         barmode="group", yaxis=dict(title="final eval loss"), legend=dict(orientation="h", y=-0.2))
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["pitfall", "upstream", "final loss right/broken", "eval F1 right/broken", "final lr right/broken",
               "examples trained right/broken", "steps right/broken"]
    rows = []
    for r in result["rows"]:
        a, b = r["right"], r["broken"]
        rows.append([r["pitfall"], r["upstream"], f"{a['final_loss']:.4f} / {b['final_loss']:.4f}",
                     f"{a['eval_f1']:.3f} / {b['eval_f1']:.3f}", f"{a['final_lr']:.2e} / {b['final_lr']:.2e}",
                     f"{a['examples_trained']} / {b['examples_trained']}",
                     f"{a['optimizer_steps']} / {b['optimizer_steps']}"])
    return headers, rows
