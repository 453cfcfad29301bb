"""How many optimizer steps each built-in classifier needs to learn, at its recipe's learning rate.

A large effective batch leaves few optimizer steps in an epoch (2,000 examples at 256 a step: 8), and a run of too
few steps ends on one label for every example (the planner's default pick did: 16 steps, F1 0.642 at accuracy
0.472). For every built-in classifier, at its recipe (learning rate, warmup, sequence length, dropout) on the
built-in data, runs of more and more epochs (so more optimizer steps) at a fixed effective batch are scored on the
held-out set, each over a few seeds. A run learnt when ``health.beats_majority`` says so: more than one label
predicted, F1 and accuracy above always predicting the most frequent label. A model's minimum is the fewest steps
from which every seed learnt, at that count and at every larger one tried; the recipes hold it
(``Recipe.min_optimizer_steps``), measured at the largest effective batch of its cases. Nothing is timed.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go

from gradacc import recipes
from gradacc.bench import report, runs
from gradacc.config import RunConfig
from gradacc.recipes import RECIPES, default_dataset
from gradacc.steps import total_optimizer_steps
from gradacc.training.run.health import beats_majority

# (model, effective batch, epochs tried, seeds). tiny-bert also at 64 a step: whether fewer examples a step need more
# steps. Six seeds where a run is seconds, three for the slower ones.
SIX_SEEDS, THREE_SEEDS = (42, 43, 44, 45, 46, 47), (42, 43, 44)
FULL_CASES = (("tiny-bert", 256, (2, 3, 4, 6, 8, 12), SIX_SEEDS), ("bow-layernorm", 256, (1, 2, 3, 4, 6, 8), SIX_SEEDS),
              ("bow-batchnorm", 256, (1, 2, 3, 4, 6, 8), SIX_SEEDS), ("tiny-bert", 64, (1, 2, 3), THREE_SEEDS),
              ("all-MiniLM-L6-v2", 256, (1, 2), THREE_SEEDS))
FULL = dict(cases=FULL_CASES, micro_batch_size=64, train_samples=2000, eval_samples=400)
QUICK = dict(cases=(("bow-layernorm", 16, (1, 2), (42,)),), micro_batch_size=8, train_samples=64, eval_samples=32)


def one_run(model: str, effective_batch: int, epochs: int, seed: int, size: dict) -> dict:
    m = min(size["micro_batch_size"], effective_batch)
    config = RunConfig(model=model, dataset=default_dataset(model), micro_batch_size=m,
                       grad_accum_steps=effective_batch // m, epochs=epochs, seed=seed, instrument=False,
                       train_samples=size["train_samples"], eval_samples=size["eval_samples"]).check()
    sink = runs.AppSink()
    runs.train(config, sink)
    last = sink.of("eval")[-1]
    steps = len(sink.of("step"))
    assert steps == total_optimizer_steps(config, size["train_samples"]), (steps, config)  # the planner's count
    return {"seed": seed, "optimizer_steps": steps, "learnt": beats_majority(last),
            **{key: last.get(key) for key in ("eval_f1", "eval_accuracy", "majority_f1", "majority_accuracy",
                                              "labels_predicted")}}


def minimum_steps(rows: list[dict]) -> int | None:
    """The fewest optimizer steps from which every seed learnt, there and at every larger count tried (rows of one
    model and effective batch); None when even the largest count left a seed unlearnt."""
    found = None
    for row in sorted(rows, key=lambda row: row["optimizer_steps"], reverse=True):
        if not all(run["learnt"] for run in row["runs"]):
            break
        found = row["optimizer_steps"]
    return found


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("learning-steps", quick, threads, {
        **size, "cases": [list(case) for case in size["cases"]],
        "recipe": "each model's recipe (learning rate, warmup, sequence length, dropout) on its built-in data; "
                  "AdamW; exact loss normalization"})
    rows = []
    for model, effective_batch, epochs_tried, seeds in size["cases"]:
        for epochs in epochs_tried:
            report.progress(f"{model} at {effective_batch} a step, {epochs} epochs")
            runs_ = [one_run(model, effective_batch, epochs, seed, size) for seed in seeds]
            report.progress(f"  {runs_[0]['optimizer_steps']} steps: learnt "
                            f"{sum(run['learnt'] for run in runs_)}/{len(runs_)}, F1 "
                            + " ".join(f"{run['eval_f1']:.3f}" for run in runs_) + ", accuracy "
                            + " ".join(f"{run['eval_accuracy']:.3f}" for run in runs_))
            rows.append({"model": model, "effective_batch": effective_batch, "epochs": epochs,
                         "learning_rate": recipes.learning_rate(model, "adamw"),
                         "optimizer_steps": runs_[0]["optimizer_steps"], "runs": runs_,
                         "seeds_learnt": sum(run["learnt"] for run in runs_)})
    minimums = {}
    for model, effective_batch, _, _ in size["cases"]:
        minimums.setdefault(model, {})[effective_batch] = minimum_steps(
            [row for row in rows if (row["model"], row["effective_batch"]) == (model, effective_batch)])
    # Each model's rule: its minimum at the largest effective batch measured (where steps are scarcest).
    measured = {model: by_batch[max(by_batch)] for model, by_batch in minimums.items()}
    recipe_has = {model: RECIPES[model].min_optimizer_steps for model in measured}
    result.update(rows=rows, minimums={model: {str(b): s for b, s in by_batch.items()}
                                       for model, by_batch in minimums.items()}, min_optimizer_steps=measured)
    result["goals"] = {"recipes hold these minimums": {
        "measured": "all match" if measured == recipe_has else {"measured": measured, "recipe": recipe_has},
        "goal": "gradacc.recipes.RECIPES' min_optimizer_steps = the minimums measured here",
        "met": measured == recipe_has}}
    result["notes"] = [
        "Learnt: more than one label predicted and F1 and accuracy above always predicting the most frequent label "
        "(gradacc.training.run.health.beats_majority); the seeds of each case are in its rows.",
        f"Fewest optimizer steps from which every seed learnt, by model and effective batch: {result['minimums']}",
    ]
    return report.finish(result, started)


def figure(result: dict):
    fig = go.Figure()
    for model, by_batch in result["minimums"].items():
        for batch in by_batch:
            cases = [row for row in result["rows"] if row["model"] == model and str(row["effective_batch"]) == batch]
            fig.add_scatter(x=[row["optimizer_steps"] for row in cases],
                            y=[row["seeds_learnt"] / len(row["runs"]) for row in cases], mode="lines+markers",
                            name=f"{model}, {batch} a step")
    fig.update_xaxes(type="log", title_text="optimizer steps")
    fig.update_yaxes(title_text="share of seeds that learnt", range=[-0.05, 1.05])
    fig.update_layout(title="Share of seeds above the most-frequent-label baseline, by optimizer steps",
                      template="plotly_white")
    return fig


def table(result: dict):
    headers = ["model", "effective batch", "epochs", "optimizer steps", "learnt", "F1 by seed", "accuracy by seed",
               "majority accuracy", "labels predicted"]
    rows = [[row["model"], row["effective_batch"], row["epochs"], row["optimizer_steps"],
             f"{row['seeds_learnt']}/{len(row['runs'])}", " ".join(f"{run['eval_f1']:.3f}" for run in row["runs"]),
             " ".join(f"{run['eval_accuracy']:.3f}" for run in row["runs"]),
             " ".join(f"{run['majority_accuracy']:.3f}" for run in row["runs"]),
             " ".join(str(run["labels_predicted"]) for run in row["runs"])] for row in result["rows"]]
    return headers, rows
