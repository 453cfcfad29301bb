"""Did a run go well? One-line warnings from its events, for ``run_ended`` (no torch, no Streamlit).

A green "Completed" under a collapsed model is worse than no status at all: these checks read only the
event list and the config, so the engine, the store and a test all reach the same verdict. They live in the
training layer because a run judges itself at its end (the engine puts them on ``run_ended``); the layers
above only read the verdict.
"""

from __future__ import annotations

import math
import statistics

from gradacc import events as ev
from gradacc.choices import PITFALLS
from gradacc.config import RunConfig
from gradacc import recipes
from gradacc.recipes import is_pretrained, shares_learning_rate

# A step whose loss is this many times the median of the steps before it is a spike...
SPIKE_FACTOR = 3.0
# ...measured against this many earlier steps, once there are at least SPIKE_MIN_HISTORY of them...
SPIKE_WINDOW = 20
SPIKE_MIN_HISTORY = 5
# ...and only when it also climbs back to at least this share of the starting loss: from-scratch models
# reach losses near 0, where a step at 3× the median is noise, not divergence.
SPIKE_MIN_SHARE_OF_START = 0.5
# Steps averaged at each end of the run to tell whether the loss went down.
ENDS = 5
# F1 (or accuracy) within this of always predicting the majority class counts as "no better".
F1_MARGIN = 0.01
# A learning rate this many times the model's recipe is named as the likely cause.
HIGH_LR_FACTOR = 3.0


def run_warnings(run_events: list[dict], config: RunConfig | dict) -> list[str]:
    """One sentence per sign of a bad run, most telling first; [] when all is well."""
    config = RunConfig.from_dict(config) if isinstance(config, dict) else config
    losses = [e["loss"] for e in run_events if e.get("event") == ev.STEP and e.get("loss") is not None]
    evals = [e for e in run_events if e.get("event") == ev.EVAL]
    found = [w for w in (_one_label(evals) or _no_better_than_majority(evals), _loss_went_up(losses), _spike(losses))
             if w]
    cause = likely_cause(config) if found else None
    return pitfall_warnings(run_events, config) + found + ([cause] if cause else [])


# ---- pitfalls: what a deliberately wrong line did, against the right loop in the same run ------------------
# A logged loss, gradient norm or learning rate within this share of the right one's counts as unchanged.
SAME = 0.01


def pitfall_warnings(run_events: list[dict], config: RunConfig | dict) -> list[str]:
    """One sentence per pitfall the run asked for, with its effect as measured in the run: each step event's
    ``pitfall`` figures hold what the right loop would have done at that step (see gradacc.training.backends.pitfalls)."""
    config = RunConfig.from_dict(config) if isinstance(config, dict) else config
    steps = [e for e in run_events if e.get("event") == ev.STEP and e.get("pitfall")]
    if not config.pitfalls or not steps:
        return []
    started = next((e for e in run_events if e.get("event") == ev.RUN_STARTED), {})
    found = []
    for name in config.pitfalls:
        effect = _PITFALL_EFFECTS[name](steps, started, config)
        found.append(f"Pitfall {name} ({PITFALLS[name]}): {effect}")
    return found


def _scheduler_effect(steps, started, config) -> str:
    lrs = [s["lr"] for s in steps]
    planned = [s["pitfall"]["planned_lr"] for s in steps]
    total = started.get("total_steps") or len(steps)
    mean_ratio = statistics.fmean(lrs) / statistics.fmean(planned) if statistics.fmean(planned) else None
    ratio = f"; the mean learning rate was {mean_ratio:.2f}× the planned schedule's" if mean_ratio is not None else ""
    zero = next((s for s, lr, plan in zip(steps, lrs, planned) if lr == 0 and plan > 0), None)
    if zero is not None:
        return (f"the learning rate reached 0 at optimizer step {zero['step']} of {total}, where the planned schedule "
                f"was still at {zero['pitfall']['planned_lr']:.3g}{ratio}.")
    if all(math.isclose(lr, plan, rel_tol=SAME, abs_tol=1e-12) for lr, plan in zip(lrs, planned)):
        return "the learning rate followed the planned schedule at every step: no effect in this run (k = 1?)."
    return f"the learning rate ended at {lrs[-1]:.3g}, where the planned schedule was at {planned[-1]:.3g}{ratio}."


def _clip_effect(steps, started, config) -> str:
    if config.max_grad_norm <= 0:
        return f"{config.max_grad_norm:g} as the max gradient norm clips nothing: no effect in this run."
    ratios = [s["pitfall"]["grad_norm_stepped"] / s["pitfall"]["grad_norm_right"] for s in steps
              if s["pitfall"]["grad_norm_right"]]
    cosines = [s["pitfall"]["grad_cosine"] for s in steps if s["pitfall"].get("grad_cosine") is not None]
    ratio = statistics.median(ratios) if ratios else 1.0
    angle = math.degrees(math.acos(max(-1.0, min(1.0, statistics.median(cosines))))) if cosines else 0.0
    if abs(ratio - 1) < SAME and angle < 1:
        return (f"clipping never engaged (every partial gradient stayed under the max gradient norm "
                f"{config.max_grad_norm:g}): no effect in this run.")
    return (f"gradients clipped every micro-batch: the gradient each optimizer step used was {ratio:.2f}× the norm of "
            f"the right one (the window's gradient clipped once, to {config.max_grad_norm:g}) and {angle:.0f}° away "
            f"from it (medians over {len(steps)} steps).")


def _zero_grad_effect(steps, started, config) -> str:
    used = statistics.median(s["pitfall"]["examples_stepped"] for s in steps)
    seen = statistics.median(s["pitfall"]["examples_seen"] for s in steps)
    ratios = [s["pitfall"]["grad_norm_stepped"] / s["pitfall"]["grad_norm_right"] for s in steps
              if s["pitfall"]["grad_norm_right"]]
    if used == seen:
        return f"each optimizer step still used all {seen:g} examples of its window: no effect in this run (k = 1?)."
    norm = f" (its gradient {statistics.median(ratios):.2f}× the right one's norm)" if ratios else ""
    return (f"each optimizer step used {used:g} examples, not {seen:g}: zero_grad() inside the window kept only the "
            f"last micro-batch's gradient{norm}; medians over {len(steps)} steps.")


def _logged_loss_effect(steps, started, config) -> str:
    ratios = [s["loss"] / s["pitfall"]["loss_right"] for s in steps if s["pitfall"]["loss_right"]]
    ratio = statistics.median(ratios) if ratios else 1.0
    if abs(ratio - 1) < SAME:
        return "the logged loss equals the right one: no effect in this run (k = 1?)."
    return (f"the logged loss was {ratio:.2f}× the right one (median over {len(steps)} steps); the training itself "
            "was unchanged, only the curve is wrong.")


def _drop_last_effect(steps, started, config) -> str:
    planned = (started.get("train_examples") or 0) * (config.epochs or 1)
    trained = steps[-1]["pitfall"]["examples_trained"]
    total = started.get("total_steps") or len(steps)
    if config.max_steps is not None and len(steps) >= config.max_steps:
        return "the run stopped at its max optimizer steps, so which examples never trained is not counted."
    if not planned or trained >= planned:
        return f"every one of the {planned} examples was trained: no short last window in this run."
    window = config.effective_batch
    leaks = sum(1 for s in steps if s["pitfall"]["examples_stepped"] > window)
    carried = (f"; {leaks} later step{'s' if leaks > 1 else ''} also stepped with the epoch before's leftover "
               "gradients" if leaks else "")
    which = "the last epoch's" if leaks else "the epoch's"
    return (f"{planned - trained} examples never trained ({trained} of {planned}: {which} short last window never "
            f"stepped); {len(steps)} optimizer steps instead of {total}{carried}.")


_PITFALL_EFFECTS = {"scheduler-per-micro-batch": _scheduler_effect, "clip-per-micro-batch": _clip_effect,
                    "zero-grad-per-micro-batch": _zero_grad_effect, "log-undivided-loss": _logged_loss_effect,
                    "drop-last-window": _drop_last_effect}


def beats_majority(evaluation: dict) -> bool:
    """Whether a classifier's eval event shows it learnt something it can use: more than one label predicted, and
    F1 and accuracy each more than F1_MARGIN above always predicting the most frequent label (a score the event
    lacks, as events recorded before it existed do, is not held against it). The run's warnings and the measured
    minimum of optimizer steps (gradacc.bench.learning_steps) judge by this one rule."""
    return not _one_label([evaluation]) and _below_floor(evaluation) is None


def _below_floor(evaluation: dict) -> tuple[str, float, float] | None:
    """The first score (name, value, floor) within F1_MARGIN of the most frequent label's; None when both clear it."""
    for name, score, floor in (("F1", "eval_f1", "majority_f1"), ("accuracy", "eval_accuracy", "majority_accuracy")):
        value, baseline = evaluation.get(score), evaluation.get(floor)
        if value is not None and baseline is not None and value <= baseline + F1_MARGIN:
            return name, value, baseline
    return None


def _one_label(evals: list[dict]) -> str | None:
    last = evals[-1] if evals else {}
    if last.get("labels_predicted") != 1:
        return None
    scores = ", ".join(f"{name} {last[key]:.3f}" for name, key in (("F1", "eval_f1"), ("accuracy", "eval_accuracy"))
                       if last.get(key) is not None)
    return (f"the model predicted one label for every eval example ({scores}): it learnt nothing it can use; "
            "a run of too few optimizer steps often ends so (the Memory planner says how many a model needs).")


def _no_better_than_majority(evals: list[dict]) -> str | None:
    below = _below_floor(evals[-1]) if evals else None
    if below is None:
        return None
    name, value, floor = below
    return (f"eval {name} {value:.3f} is no better than always predicting the most frequent label ({floor:.3f}): "
            "the model learnt nothing it can use.")


def _loss_went_up(losses: list[float]) -> str | None:
    if len(losses) < 2:
        return None
    ends = max(1, min(ENDS, len(losses) // 4))
    start, end = statistics.fmean(losses[:ends]), statistics.fmean(losses[-ends:])
    if end <= start:
        return None
    return f"the loss ended higher than it started ({end:.3g} against {start:.3g})."


def _spike(losses: list[float]) -> str | None:
    if len(losses) <= SPIKE_MIN_HISTORY:
        return None
    start = statistics.fmean(losses[:max(1, min(ENDS, len(losses) // 4))])
    for index in range(SPIKE_MIN_HISTORY, len(losses)):
        median = statistics.median(losses[max(0, index - SPIKE_WINDOW):index])
        loss = losses[index]
        if median > 0 and loss > SPIKE_FACTOR * median and loss >= SPIKE_MIN_SHARE_OF_START * start:
            return (f"the loss spiked at step {index + 1}: {loss:.3g}, {loss / median:.1f}× the median "
                    f"of the steps before ({median:.3g}).")
    return None


def learning_rate_is_high(config: RunConfig) -> bool:
    """A learning rate HIGH_LR_FACTOR or more times the recipe's rate for the run's optimizer: the likeliest cause
    of a spike or collapse. Where the recipe has no rate for the optimizer, nothing is measured against."""
    lr, recipe_rate = config.learning_rate, recipes.learning_rate(config.model, config.optimizer)
    return lr is not None and recipe_rate is not None and lr >= HIGH_LR_FACTOR * recipe_rate


def _high_learning_rate(config: RunConfig) -> str:
    kind = "a pretrained model" if is_pretrained(config.model) else config.model
    optimizer = "" if shares_learning_rate("adamw", config.optimizer) else f" with {config.optimizer}"
    return (f"learning rate {config.learning_rate:g} is high for {kind}{optimizer}; its recipe uses "
            f"{recipes.learning_rate(config.model, config.optimizer):g}")


def learning_rate_warning(config: RunConfig) -> str | None:
    """Said before Start: a learning rate far above the recipe's for the run's optimizer (what ``likely_cause``
    names after a bad run), or AdamW's recipe rate typed in (a form keeps it) for an optimizer that needs its
    own. A rate the recipe filled in is always the run's own optimizer's (recipes.learning_rate)."""
    if learning_rate_is_high(config):
        return (f"The {_high_learning_rate(config)}: a run this far above it usually spikes or collapses "
                "(F1 no better than always guessing one class).")
    own = recipes.learning_rate(config.model, config.optimizer)
    if (config.learning_rate == config.recipe.learning_rate and not shares_learning_rate("adamw", config.optimizer)
            and config.learning_rate != own):
        instead = f"its recipe's is {own:g}" if own is not None else "it needs a learning rate of its own"
        return (f"Learning rate {config.learning_rate:g} is {config.model}'s recipe for AdamW, not {config.optimizer}'s: "
                f"{instead}; set it before Start.")
    return None


def likely_cause(config: RunConfig) -> str | None:
    """The setting most likely to blame, said with the value the model's recipe uses."""
    # log-undivided-loss changes only what is logged, never the training: it causes no bad result.
    training = [name for name in config.pitfalls if name != "log-undivided-loss"]
    if training:
        lines = "lines" if len(training) > 1 else "line"
        return f"Likely cause: the wrong {lines} run on purpose ({', '.join(training)})."
    if learning_rate_is_high(config):
        return f"Likely cause: {_high_learning_rate(config)}."
    if config.trainer_library_default and config.backend == "trainer" and config.grad_accum_steps > 1:
        return (f"Likely cause: Trainer's library default on this model scales the loss and gradients "
                f"{config.grad_accum_steps}× too large; gradacc's compute_loss_func fixes it.")
    return None
