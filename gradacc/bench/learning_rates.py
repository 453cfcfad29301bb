"""Learning rates of SGD and Adafactor for each built-in model's recipe, found by a short sweep.

The recipes (gradacc.recipes.RECIPES) were tuned for AdamW. SGD (momentum gradacc.training.backends.optimizer
.SGD_MOMENTUM) and Adafactor (a fixed rate, no relative step) update the weights on other scales, so each gets a
rate of its own: for every built-in model, a few log-spaced rates per optimizer at the recipe's other settings
(epochs, warmup, sequence length, dropout; m = 8, k = 4; the built-in data), each over a few seeds. The score is
the held-out one the Train page shows: eval F1 for a classifier (beside the F1 of always predicting the most
frequent label, which a model stuck on a plateau also reaches), eval perplexity for tiny-gpt. The rate with the
best mean over the seeds is chosen; one at the edge of the grid is flagged (a better one may lie beyond).
AdamW at the recipe's own rate runs beside them on the same seeds, as the reference. A chosen rate is ``usable``
(fit for the recipe) only when it comes close to that reference: F1 at most USABLE_F1_GAP lower, perplexity at
most USABLE_PERPLEXITY_RATIO times higher. A best rate that trains far worse (SGD stuck predicting one class)
is no recipe: the optimizer then has none for that model. Nothing is timed.
"""

from __future__ import annotations

import math
import statistics
import time

from plotly.subplots import make_subplots

from gradacc.bench import report, runs
from gradacc.choices import BUILTIN_MODEL_TASKS
from gradacc.config import RunConfig
from gradacc.recipes import RECIPES, default_dataset
from gradacc.training.tasks import task_named

# Half-decade steps. SGD's rates are larger than AdamW's (its step is the gradient itself, not a normalised one).
GRIDS = {"sgd": (3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0), "adafactor": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)}
USABLE_F1_GAP = 0.1
USABLE_PERPLEXITY_RATIO = 2.0
FULL = dict(models=tuple(RECIPES), grids=GRIDS, seeds=(42, 43), train_samples=2000, eval_samples=400,
            # The pretrained MiniLM is the one slow model: its recipe was measured on 512 examples.
            train_samples_by_model={"all-MiniLM-L6-v2": 512})
QUICK = dict(models=("bow-layernorm",), grids={"sgd": (1e-2, 1e-1), "adafactor": (1e-3, 1e-2)}, seeds=(42,),
             train_samples=64, eval_samples=32, train_samples_by_model={})


def metric(model: str) -> tuple[str, bool]:
    """The held-out score of ``model``'s task and whether higher is better."""
    return task_named(BUILTIN_MODEL_TASKS.get(model)).headline_metric


def one_run(model: str, optimizer: str, learning_rate: float, seed: int, size: dict) -> dict:
    config = RunConfig(model=model, dataset=default_dataset(model), optimizer=optimizer,
                       learning_rate=learning_rate, seed=seed, instrument=False,
                       train_samples=size["train_samples_by_model"].get(model, size["train_samples"]),
                       eval_samples=size["eval_samples"])
    sink = runs.AppSink()
    runs.train(config, sink)
    last = sink.of("eval")[-1]
    name, _ = metric(model)
    score = last[name]
    return {"score": score if score is not None and math.isfinite(score) else None,
            "majority_f1": last.get("majority_f1"), "optimizer_steps": len(sink.of("step"))}


def best(rows: list[dict], higher_is_better: bool) -> dict | None:
    """The row with the best mean score; a rate that diverged on any seed (no finite score) is never best."""
    scored = [row for row in rows if row["mean_score"] is not None]
    if not scored:
        return None
    return (max if higher_is_better else min)(scored, key=lambda row: row["mean_score"])


def usable(score: float, reference: float | None, higher_is_better: bool) -> bool:
    """Whether a best rate trains close enough to AdamW at the recipe's rate to be the recipe's rate."""
    if reference is None:
        return False
    if higher_is_better:
        return score >= reference - USABLE_F1_GAP
    return score <= reference * USABLE_PERPLEXITY_RATIO


def mean(scores: list[float | None]) -> float | None:
    return None if any(s is None for s in scores) else statistics.fmean(scores)


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("learning-rates", quick, threads, {
        **size, "models": list(size["models"]), "seeds": list(size["seeds"]),
        "grids": {name: list(rates) for name, rates in size["grids"].items()},
        "micro_batch_size": RunConfig.micro_batch_size, "grad_accum_steps": RunConfig.grad_accum_steps,
        "recipe": "each model's recipe (epochs, warmup, sequence length, dropout) on its built-in data"})
    rows, chosen, reference = [], {}, {}
    for model in size["models"]:
        name, higher = metric(model)
        recipe_rate = RECIPES[model].learning_rate
        report.progress(f"{model}: adamw at the recipe's {recipe_rate:g}")
        runs_ = [one_run(model, "adamw", recipe_rate, seed, size) for seed in size["seeds"]]
        reference[model] = {"optimizer": "adamw", "learning_rate": recipe_rate, "metric": name,
                            "scores": [r["score"] for r in runs_], "mean_score": mean([r["score"] for r in runs_]),
                            "majority_f1": runs_[0]["majority_f1"]}
        chosen[model] = {}
        for optimizer, rates in size["grids"].items():
            tried = []
            for rate in rates:
                report.progress(f"{model}: {optimizer} at {rate:g}")
                runs_ = [one_run(model, optimizer, rate, seed, size) for seed in size["seeds"]]
                scores = [r["score"] for r in runs_]
                tried.append({"model": model, "optimizer": optimizer, "learning_rate": rate, "metric": name,
                              "scores": scores, "mean_score": mean(scores), "majority_f1": runs_[0]["majority_f1"],
                              "optimizer_steps": runs_[0]["optimizer_steps"]})
            top = best(tried, higher)
            for row in tried:
                row["chosen"] = row is top
            rows += tried
            if top is not None:
                chosen[model][optimizer] = {"learning_rate": top["learning_rate"], "mean_score": top["mean_score"],
                                            "at_edge": top["learning_rate"] in (rates[0], rates[-1]),
                                            "usable": usable(top["mean_score"], reference[model]["mean_score"],
                                                             higher)}
    result.update(rows=rows, chosen=chosen, reference=reference)
    edges = [f"{model} {optimizer}" for model, picks in chosen.items() for optimizer, pick in picks.items()
             if pick["at_edge"]]
    result["recipe_rates"] = {model: {optimizer: pick["learning_rate"] for optimizer, pick in picks.items()
                                      if pick["usable"]} for model, picks in chosen.items()}
    # The recipes are this sweep's output: say where they and a fresh sweep disagree (a --quick grid always does).
    differ = {model: {"sweep": rates, "recipe": RECIPES[model].optimizer_rates}
              for model, rates in result["recipe_rates"].items() if rates != RECIPES[model].optimizer_rates}
    result["goals"] = {"recipes hold these rates": {
        "measured": "all match" if not differ else differ,
        "goal": "gradacc.recipes.RECIPES' optimizer_rates = the usable rates chosen here", "met": not differ}}
    result["notes"] = [
        "Scores: eval F1 for classifiers (higher is better; compare with majority_f1), eval perplexity for tiny-gpt "
        f"(lower is better); means over seeds {', '.join(map(str, size['seeds']))}.",
        f"Usable (close to AdamW at the recipe's rate: F1 at most {USABLE_F1_GAP:g} lower, perplexity at most "
        f"{USABLE_PERPLEXITY_RATIO:g}× higher), the recipes' optimizer_rates: {result['recipe_rates']}",
        "Chosen at the edge of its grid (a better rate may lie beyond): " + (", ".join(edges) if edges else "none"),
    ]
    return report.finish(result, started)


def figure(result: dict):
    models = list(result["chosen"])
    metric_names = {model: result["reference"][model]["metric"].replace("eval_", "") for model in models}
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=[f"{m} ({metric_names[m]})" for m in models])
    colours = {"sgd": "#1f77b4", "adafactor": "#ff7f0e", "adamw": "#2ca02c"}
    for col, model in enumerate(models, start=1):
        for optimizer in result["settings"]["grids"]:
            tried = [row for row in result["rows"] if row["model"] == model and row["optimizer"] == optimizer]
            fig.add_scatter(x=[row["learning_rate"] for row in tried], y=[row["mean_score"] for row in tried],
                            mode="lines+markers", name=optimizer, legendgroup=optimizer, showlegend=col == 1,
                            line_color=colours.get(optimizer), row=1, col=col)
        ref = result["reference"][model]
        fig.add_scatter(x=[ref["learning_rate"]], y=[ref["mean_score"]], mode="markers", name="adamw (recipe)",
                        legendgroup="adamw", showlegend=col == 1, marker=dict(color=colours["adamw"], size=10,
                                                                               symbol="star"), row=1, col=col)
        fig.update_xaxes(type="log", title_text="learning rate", row=1, col=col)
    fig.update_layout(title="Held-out score by learning rate, per optimizer (mean over seeds)",
                      template="plotly_white")
    return fig


def table(result: dict):
    headers = ["model", "optimizer", "learning rate", "score", "mean", "by seed", "majority F1", "chosen"]
    rows = []
    for model, ref in result["reference"].items():
        rows.append([model, "adamw (recipe)", ref["learning_rate"], ref["metric"], ref["mean_score"],
                     " ".join(_score(s) for s in ref["scores"]), ref["majority_f1"], ""])
        for row in (r for r in result["rows"] if r["model"] == model):
            rows.append([model, row["optimizer"], row["learning_rate"], row["metric"], row["mean_score"],
                         " ".join(_score(s) for s in row["scores"]), row["majority_f1"],
                         _chosen(row, result["chosen"][model][row["optimizer"]]) if row["chosen"] else ""])
    return headers, rows


def _chosen(row: dict, pick: dict) -> str:
    return "◀ chosen" if pick["usable"] else "◀ best, not usable"


def _score(value: float | None) -> str:
    return "diverged" if value is None else f"{value:.3f}"
