"""Memory planner: measure a model once per lever setting, then say which settings fit a budget, with which m and k.

Peak training memory, per setting of the levers (gradient checkpointing, precision, optimizer), is modelled as

    static (parameters + gradients + the optimizer's state)  +  activations(m)
    activations(m) = fixed + per_example · m          (a straight line, fitted to measured forward passes)

Activations are what autograd saves for backward during the forward pass (``memory.ActivationMeter``);
framework overhead, the allocator's slack and temporary buffers are not in the model, so leave headroom.
Gradient accumulation is why this works: k does not change memory, only m does. m is a power of two that
divides the target effective batch, so m × k is the target exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradacc import recipes
from gradacc.recipes import shares_learning_rate
from gradacc.labels import field_label
from gradacc.errors import GradaccError
from gradacc.units import MB
from gradacc.training.memory.budget import largest_fitting_micro_batch
from gradacc.training.run.engine import quiet_libraries

# torch, transformers and the training modules that import them at their top are imported inside the functions that
# train or measure: the Memory planner page imports this module before torch loads (tests/core/test_layout.py).

NORM_MODELS = ("bow-batchnorm", "bow-layernorm")

LEVERS = ("gradient_checkpointing", "precision", "optimizer")
FIT_SIZES = (1, 2, 4)  # micro-batch sizes the activation line is fitted on
HELD_OUT_SIZE = 8  # the line is checked on a micro-batch it was not fitted on


@dataclass(frozen=True)
class ActivationFit:
    """activations(m) = fixed_bytes + bytes_per_example · m."""

    fixed_bytes: float
    bytes_per_example: float

    def predict(self, micro_batch_size: int) -> float:
        return self.fixed_bytes + self.bytes_per_example * micro_batch_size


def fit_activations(points: dict[int, float]) -> ActivationFit:
    """Least-squares line through (micro-batch size, activation bytes); one point: through the origin."""
    if not points:
        raise GradaccError("No activation measurements to fit.")
    sizes, values = list(points), [float(points[s]) for s in points]
    if len(set(sizes)) == 1:
        return ActivationFit(0.0, sum(values) / len(values) / sizes[0])
    n = len(sizes)
    mean_m, mean_b = sum(sizes) / n, sum(values) / n
    slope = sum((m - mean_m) * (b - mean_b) for m, b in zip(sizes, values)) / sum((m - mean_m) ** 2 for m in sizes)
    slope = max(slope, 0.0)  # more examples never save memory; noise must not say otherwise
    return ActivationFit(max(mean_b - slope * mean_m, 0.0), slope)


def check_plan_inputs(budget_mb: float, target_effective_batch: int) -> None:
    """The planner's two inputs, refused in the page's words (one home for the plain and the levers planner)."""
    if isinstance(target_effective_batch, bool) or not isinstance(target_effective_batch, int) \
            or target_effective_batch < 1:
        raise GradaccError(f"{field_label('target_effective_batch')} must be a whole number of at least 1; "
                           f"got {target_effective_batch!r}.", "target_effective_batch")
    if not budget_mb or budget_mb <= 0 or math.isnan(budget_mb):
        raise GradaccError(f"{field_label('budget_mb')} must be more than 0; got {budget_mb!r}.", "budget_mb")


def predicted_peaks(static_bytes: int, fit: ActivationFit, sizes) -> dict[int, float]:
    return {int(m): static_bytes + fit.predict(m) for m in sizes}


def chart_sizes(micro_batch_size: int | None, measured=(*FIT_SIZES, HELD_OUT_SIZE)) -> list[int]:
    """Powers of two from 1 past the chosen micro-batch: where the prediction line is drawn."""
    top = max(max(measured), 2 * micro_batch_size if micro_batch_size else 16)
    sizes, m = [], 1
    while m <= top:
        sizes.append(m)
        m *= 2
    return sorted({*sizes, *measured, *([micro_batch_size] if micro_batch_size else [])})


# ---- a planner over every lever (python -m gradacc plan, the Memory planner page) ------------------

TIMED_MICRO_BATCH = 4
TIMED_MICRO_BATCHES = 3
LEVER_GRID = tuple({"gradient_checkpointing": checkpointing, "precision": precision, "optimizer": optimizer}
                   for checkpointing in (False, True) for precision in ("fp32", "bf16")
                   for optimizer in ("adamw", "sgd", "adafactor"))
# Settings that share a model and its forward/backward passes: measured together (one model load each).
LEVER_GROUPS = tuple(dict.fromkeys((levers["gradient_checkpointing"], levers["precision"]) for levers in LEVER_GRID))


def lever_group(checkpointing: bool, precision: str, grid=LEVER_GRID) -> tuple[dict, ...]:
    """The settings of ``grid`` with this checkpointing and precision (one optimizer each)."""
    return tuple(levers for levers in grid if (levers["gradient_checkpointing"], levers["precision"])
                 == (checkpointing, precision))


def setting_label(levers: dict) -> str:
    """'checkpointing on · bf16 · adafactor': a lever setting (or a plan row) in a few words."""
    return (f"checkpointing {'on' if levers['gradient_checkpointing'] else 'off'} · {levers['precision']} · "
            f"{levers['optimizer']}")


def levers_of(row: dict) -> dict:
    return {name: row[name] for name in LEVERS}


def check_plannable(model: str) -> None:
    """GradaccError (field ``model``) for a model the planner cannot measure: the coupled-loss checks' small models
    have no gradient checkpointing, and BatchNorm refuses the planner's micro-batch of 1."""
    if model.strip() in NORM_MODELS:
        raise GradaccError(f"{field_label('model')} {model.strip()} cannot be planned: it is a small model for the "
                           "coupled-loss checks, without gradient checkpointing; plan tiny-bert, all-MiniLM-L6-v2, "
                           "tiny-gpt or a folder.", "model")


def measure_levers(model: str, max_seq_length: int, grid=LEVER_GRID, seed: int = 42) -> list[dict]:
    """Per lever setting: static bytes (a dry step of its optimizer), activations of 1, 2 and 4 examples at
    ``max_seq_length`` tokens fitted as a line and checked on 8, and seconds per example of a short timed run
    (3 micro-batches of 4 forward and backward, then one optimizer step).

    Forward and backward depend on checkpointing and precision only, the optimizer step on the optimizer only: the
    model is loaded once per (checkpointing, precision) and those passes measured and timed once; each optimizer
    then takes one untimed step (it allocates its state) and one timed step on the same gradients. Time per
    example = (the timed passes + the timed step) / 12. The model's recipe dropout is on, as in the run the plan is
    for (its masks are activations too). In the app, call it only once the warm-up's imports are done
    (``gradacc.serving.warmup``): it imports torch."""
    # here: they import torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.fsdp import group_sizes
    from gradacc.training.memory.levers import LeverRig, timed

    check_plannable(model)
    quiet_libraries()
    groups: dict[tuple, list[dict]] = {}
    for levers in grid:
        groups.setdefault((levers["gradient_checkpointing"], levers["precision"]), []).append(levers)
    measured = {}
    for (checkpointing, precision), settings in groups.items():
        rig = LeverRig(model, max_seq_length, {"gradient_checkpointing": checkpointing, "precision": precision},
                       examples=max(HELD_OUT_SIZE, TIMED_MICRO_BATCH), seed=seed)
        sizes = group_sizes(rig.model)  # how FSDP would shard it (gradacc.analysis.sharding.plan_processes)
        shape = {name: sizes[name] for name in ("parameters", "largest_group", "first_reduced", "root")}
        activations = {size: rig.activation_bytes(size) for size in (*FIT_SIZES, HELD_OUT_SIZE)}
        fit = fit_activations({size: activations[size] for size in FIT_SIZES})
        held_out_error = (fit.predict(HELD_OUT_SIZE) - activations[HELD_OUT_SIZE]) / activations[HELD_OUT_SIZE]
        rig.forward_backward(TIMED_MICRO_BATCH)  # the first backward of a fresh model allocates: not timed
        passes, _ = timed(lambda: [rig.forward_backward(TIMED_MICRO_BATCH) for _ in range(TIMED_MICRO_BATCHES)])
        for levers in settings:
            rig.use_optimizer(levers["optimizer"])
            rig.step(zero_grad=False)  # allocates the optimizer's state: once per run, not per step
            step, _ = timed(lambda: rig.step(zero_grad=False))
            measured[tuple(levers.items())] = {
                "levers": levers, "static": rig.static_need(), "shape": shape,
                "fit": {"fixed_bytes": fit.fixed_bytes, "bytes_per_example": fit.bytes_per_example},
                "activations": activations, "held_out_error": held_out_error,
                "seconds_per_example": (passes + step) / (TIMED_MICRO_BATCH * TIMED_MICRO_BATCHES)}
    return [measured[tuple(levers.items())] for levers in grid]


def plan_levers(measured: list[dict], budget_mb: float, target_effective_batch: int) -> dict:
    """For each setting: m (a power of two dividing the target, so m × k = target exactly) that fits the budget, k,
    the predicted peak; the recommendation is the fastest setting that fits, the cheapest-memory one beside it:
    the one that needs least at m = 1 (``least_bytes``; comparing peaks would compare each setting at the largest m
    it fits, which fills any budget alike). When nothing fits, ``reason`` says so in one line."""
    check_plan_inputs(budget_mb, target_effective_batch)
    rows = []
    for setting in measured:
        static, fit = setting["static"]["total"], setting["fit"]
        m = largest_fitting_micro_batch(static, fit["fixed_bytes"], fit["bytes_per_example"], budget_mb * MB,
                                        target_effective_batch)
        peak = None if m is None else static + fit["fixed_bytes"] + fit["bytes_per_example"] * m
        rows.append({**setting["levers"], "fits": m is not None, "micro_batch_size": m,
                     "grad_accum_steps": None if m is None else target_effective_batch // m,
                     "predicted_peak_bytes": peak, "static_bytes": static,
                     "least_bytes": static + fit["fixed_bytes"] + fit["bytes_per_example"],
                     "seconds_per_example": setting["seconds_per_example"],
                     "held_out_error": setting["held_out_error"]})
    fitting = sorted((row for row in rows if row["fits"]), key=lambda row: row["seconds_per_example"])
    reason = None
    if not fitting:
        lightest = min(rows, key=lambda row: row["least_bytes"])
        reason = (f"{field_label('budget_mb')} {budget_mb:g} is too small for every setting: even a "
                  f"micro-batch of 1 with the lightest ({setting_label(lightest)}) needs about "
                  f"{lightest['least_bytes'] / MB:,.1f} MB (its parameters, gradients and optimizer state alone are "
                  f"{lightest['static_bytes'] / MB:,.1f} MB).")
    return {"budget_mb": budget_mb, "target_effective_batch": target_effective_batch,
            "rows": fitting + [row for row in rows if not row["fits"]],
            "fastest": fitting[0] if fitting else None,
            "cheapest_memory": min(fitting, key=lambda row: row["least_bytes"]) if fitting else None,
            "reason": reason, "largest_held_out_error": max(abs(row["held_out_error"]) for row in rows)}


# Timings closer than this share (a short timed run) are noise: the pick then takes the setting with fewer levers.
TIME_NOISE = 0.10


def lever_count(row: dict, optimizer: str) -> int:
    """Levers a setting pulls besides accumulation: checkpointing, a lower precision, another optimizer."""
    return (bool(row["gradient_checkpointing"]) + (row["precision"] != "fp32")
            + (not shares_learning_rate(optimizer, row["optimizer"])))


def allowed_rows(plan: dict, optimizer: str, change_optimizer: bool, *, model: str) -> list[dict]:
    """The plan's rows the pick may choose from: only ``optimizer``'s (the Train form's) unless the user allows
    another one; then also those of each optimizer whose learning rate ``model``'s recipe holds (measured), never
    one that would have to borrow another optimizer's rate."""
    return [row for row in plan["rows"] if shares_learning_rate(optimizer, row["optimizer"])
            or (change_optimizer and recipes.learning_rate(model, row["optimizer"]) is not None)]


def unrated_optimizers(plan: dict, optimizer: str, model: str) -> list[str]:
    """Optimizers that fit the budget but that the planner does not offer: ``model``'s recipe has no learning rate
    measured for them (a pretrained folder or hub id with SGD or Adafactor)."""
    return list(dict.fromkeys(row["optimizer"] for row in plan["rows"] if row["fits"]
                              and not shares_learning_rate(optimizer, row["optimizer"])
                              and recipes.learning_rate(model, row["optimizer"]) is None))


def pick(plan: dict, optimizer: str, change_optimizer: bool, *, model: str) -> dict | None:
    """The setting to use and why, or None when no allowed setting fits.

    Accumulation costs no time per example; checkpointing recomputes the forward pass and another precision or
    optimizer changes the training. So among the allowed settings that fit, the fastest wins only when it is more
    than TIME_NOISE faster than a setting with fewer levers; otherwise the one with fewest levers (accumulation
    alone, where it fits) is picked. Returns {"row", "why", "learning_rate"}: ``why`` is one sentence for the page;
    ``learning_rate`` is the picked optimizer's own rate from ``model``'s recipe when the pick changes the
    optimizer to one that does not take ``optimizer``'s rate, else None (the run keeps its rate)."""
    fitting = [row for row in allowed_rows(plan, optimizer, change_optimizer, model=model) if row["fits"]]
    if not fitting:
        return None
    fastest = min(row["seconds_per_example"] for row in fitting)
    close = [row for row in fitting if row["seconds_per_example"] <= fastest * (1 + TIME_NOISE)]
    chosen = min(close, key=lambda row: (lever_count(row, optimizer), row["seconds_per_example"]))
    rate = None if shares_learning_rate(optimizer, chosen["optimizer"]) \
        else recipes.learning_rate(model, chosen["optimizer"])
    return {"row": chosen, "why": _why(chosen, fitting, plan["rows"], optimizer, model, rate), "learning_rate": rate}


def _why(chosen: dict, fitting: list[dict], rows: list[dict], optimizer: str, model: str, rate: float | None) -> str:
    levers = lever_count(chosen, optimizer)
    mk = f"m = {chosen['micro_batch_size']}, k = {chosen['grad_accum_steps']}"
    slower = [row for row in fitting if lever_count(row, optimizer) > levers
              and row["seconds_per_example"] > chosen["seconds_per_example"]]
    costs = "; ".join(f"{setting_label(row)} fits too but takes "
                      f"{row['seconds_per_example'] / chosen['seconds_per_example'] - 1:+.0%} time per example"
                      for row in sorted(slower, key=lambda row: row["seconds_per_example"])[:2])
    if levers == 0:
        why = f"Accumulation alone fits ({mk}): no lever that costs time or changes the training is needed"
        return why + (f" ({costs})." if costs else ".")
    plain = [row for row in rows if lever_count(row, optimizer) < levers
             and shares_learning_rate(optimizer, row["optimizer"])]
    if not any(row["fits"] for row in plain):
        why = (f"Accumulation alone does not fit: without {_levers_named(chosen, optimizer)} not even a "
               f"micro-batch of 1 fits the budget; with it, {mk}")
    else:
        fewer = min((row for row in plain if row["fits"]), key=lambda row: row["seconds_per_example"])
        why = (f"{_levers_named(chosen, optimizer).capitalize()} is "
               f"{1 - chosen['seconds_per_example'] / fewer['seconds_per_example']:.0%} faster per example than "
               f"{setting_label(fewer)} (more than the timing's noise), at {mk}")
    if rate is not None:
        why += (f". {chosen['optimizer']} trains at its own learning rate, {rate:g}, measured for "
                f"{recipes.recipe_named(model)} (python -m gradacc bench learning-rates), not {optimizer}'s")
    return why + "."


def _levers_named(row: dict, optimizer: str) -> str:
    named = (["checkpointing"] if row["gradient_checkpointing"] else []) + \
        ([row["precision"]] if row["precision"] != "fp32" else []) + \
        ([row["optimizer"]] if not shares_learning_rate(optimizer, row["optimizer"]) else [])
    return " and ".join(named)


def measurement_of(measured: list[dict], levers: dict) -> dict:
    """The measurement of one lever setting (``levers``: a setting or a plan row)."""
    wanted = levers_of(levers)
    return next(setting for setting in measured if setting["levers"] == wanted)


def held_out_check(setting: dict) -> dict:
    """The activation line, fitted on FIT_SIZES, against the micro-batch it was not fitted on."""
    fit = ActivationFit(**setting["fit"])
    activations = {int(size): value for size, value in setting["activations"].items()}
    return {"size": HELD_OUT_SIZE, "fitted_on": list(FIT_SIZES), "measured": activations[HELD_OUT_SIZE],
            "predicted": fit.predict(HELD_OUT_SIZE), "error": setting["held_out_error"]}
