"""Memory planner: measure a model once, then say which micro-batch fits a budget and which k reaches a target.

Peak training memory is modelled as

    static (parameters + gradients + AdamW state)  +  activations(m)
    activations(m) = fixed + per_example · m          (a straight line, fitted to measured forward passes)

Activations are what autograd saves for backward during the forward pass (``memory.ActivationMeter``);
framework overhead, the allocator's slack and temporary buffers are not in the model, so leave headroom.
Gradient accumulation is why this works: k does not change memory, only m does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gradacc.serving import warmup
from gradacc.config import MAX_MICRO_BATCH, RunConfig, effective_batch, field_label
from gradacc.errors import GradaccError

MEASURED_SIZES = (1, 2, 4, 8)
MB = 1_000_000


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


@dataclass(frozen=True)
class Plan:
    micro_batch_size: int
    grad_accum_steps: int
    effective_batch: int
    static_bytes: int
    activation_bytes: float
    largest_fitting_micro_batch: int

    @property
    def peak_bytes(self) -> float:
        return self.static_bytes + self.activation_bytes


def check_plan_inputs(budget_mb: float, target_effective_batch: int) -> None:
    """The planner's two inputs, refused in the page's words (one home for the plain and the levers planner)."""
    if isinstance(target_effective_batch, bool) or not isinstance(target_effective_batch, int) \
            or target_effective_batch < 1:
        raise GradaccError(f"{field_label('target_effective_batch')} must be a whole number of at least 1; "
                           f"got {target_effective_batch!r}.", "target_effective_batch")
    if not budget_mb or budget_mb <= 0 or math.isnan(budget_mb):
        raise GradaccError(f"{field_label('budget_mb')} must be more than 0; got {budget_mb!r}.", "budget_mb")


def recommend(static_bytes: int, fit: ActivationFit, budget_bytes: float, target_effective_batch: int,
              num_processes: int = 1) -> Plan:
    """The fewest accumulation steps k that reach ``target_effective_batch`` with micro-batches that fit
    ``budget_bytes``, and the micro-batch m for that k; GradaccError when even m = 1 does not fit."""
    check_plan_inputs(budget_bytes / MB if budget_bytes else budget_bytes, target_effective_batch)
    room = budget_bytes - static_bytes - fit.fixed_bytes
    if room < fit.bytes_per_example or room <= 0:
        need = static_bytes + fit.predict(1)
        raise GradaccError(f"{budget_bytes / MB:,.1f} MB is too small: even a micro-batch of 1 needs about "
                           f"{need / MB:,.1f} MB (parameters, gradients and optimizer state alone are "
                           f"{static_bytes / MB:,.1f} MB).", "budget_mb")
    fitting = MAX_MICRO_BATCH if fit.bytes_per_example <= 0 else min(MAX_MICRO_BATCH,
                                                                      int(room // fit.bytes_per_example))
    per_process_target = math.ceil(target_effective_batch / num_processes)
    # The fewest micro-batches per step that reach the target, then the smallest m that still does:
    # m = 239 fits but m = 128, k = 2 reaches 256 exactly where 239 × 2 would overshoot to 478.
    k = math.ceil(per_process_target / min(fitting, per_process_target))
    micro_batch = math.ceil(per_process_target / k)
    return Plan(micro_batch_size=micro_batch, grad_accum_steps=k,
                effective_batch=effective_batch(micro_batch, k, num_processes), static_bytes=int(static_bytes),
                activation_bytes=fit.predict(micro_batch), largest_fitting_micro_batch=fitting)


def predicted_peaks(static_bytes: int, fit: ActivationFit, sizes) -> dict[int, float]:
    return {int(m): static_bytes + fit.predict(m) for m in sizes}


def chart_sizes(plan: Plan | None, measured=MEASURED_SIZES) -> list[int]:
    """Powers of two from 1 past the recommended micro-batch: where the prediction line is drawn."""
    top = max(max(measured), 2 * plan.micro_batch_size if plan else 16)
    sizes, m = [], 1
    while m <= top:
        sizes.append(m)
        m *= 2
    return sorted({*sizes, *measured, *([plan.micro_batch_size] if plan else [])})


# ---- measuring (imports torch) --------------------------------------------------------------------

@dataclass
class Measurement:
    model: str
    max_seq_length: int
    static: dict  # parameters, gradients, optimizer_state, total (bytes)
    activations: dict[int, int] = field(default_factory=dict)  # micro-batch size -> bytes

    @property
    def fit(self) -> ActivationFit:
        return fit_activations(self.activations)


def measure(model: str, max_seq_length: int, sizes=MEASURED_SIZES, seed: int = 42) -> Measurement:
    """Load ``model`` (CPU), count static bytes, and count activation bytes of one training-mode forward
    pass per micro-batch size with every sequence padded to ``max_seq_length`` tokens."""
    warmup.wait_until_warm()  # no import of torch beside the app's warm-up (see gradacc.serving.warmup)
    import torch

    from gradacc.training import memory
    from gradacc.training.sources import builtin_data, models
    from gradacc.training.backends.common import make_optimizer
    from gradacc.training.engine import quiet_libraries

    config = RunConfig(model=model, max_seq_length=max_seq_length, seed=seed).validate()
    quiet_libraries()
    loaded = models.load(config, len(builtin_data.LABEL_NAMES), list(builtin_data.LABEL_NAMES))
    network = loaded.model
    network.train()  # dropout masks are activations too
    static = memory.static_bytes(network, make_optimizer(network, config))
    texts, labels = builtin_data.make_sentiment(max(sizes), seed)
    meter = memory.ActivationMeter(network)
    activations = {}
    for size in sorted(set(sizes)):
        batch = loaded.tokenizer(texts[:size], padding="max_length", truncation=True, max_length=max_seq_length,
                                 return_tensors="pt")
        batch["labels"] = torch.tensor(labels[:size])
        with meter.measure():
            outputs = network(**batch)
        activations[size] = meter.bytes
        del outputs  # frees the graph before the next, larger pass
    return Measurement(model=model, max_seq_length=max_seq_length, static=static, activations=activations)


# ---- a planner over every lever (python -m gradacc plan) -------------------------------------------

FIT_SIZES = (1, 2, 4)
HELD_OUT_SIZE = 8  # the line is checked on a micro-batch it was not fitted on
TIMED_MICRO_BATCH = 4
TIMED_MICRO_BATCHES = 3
LEVER_GRID = tuple({"gradient_checkpointing": checkpointing, "precision": precision, "optimizer": optimizer}
                   for checkpointing in (False, True) for precision in ("fp32", "bf16")
                   for optimizer in ("adamw", "sgd", "adafactor"))


def measure_levers(model: str, max_seq_length: int, grid=LEVER_GRID, seed: int = 42) -> list[dict]:
    """Per lever setting: static bytes (a dry step of its optimizer), activations of 1, 2 and 4 examples at
    ``max_seq_length`` tokens fitted as a line and checked on 8, and seconds per example of a short timed
    run (3 micro-batches of 4: forward and backward under the setting, then one optimizer step)."""
    warmup.wait_until_warm()
    import time

    import torch

    from gradacc.training import budget, memory
    from gradacc.training.backends.common import Precision, enable_gradient_checkpointing, make_optimizer
    from gradacc.training.engine import quiet_libraries
    from gradacc.training.sources import builtin_data, models

    quiet_libraries()
    texts, labels = builtin_data.make_sentiment(max(HELD_OUT_SIZE, TIMED_MICRO_BATCH), seed)
    rows = []
    for levers in grid:
        config = RunConfig(model=model, max_seq_length=max_seq_length, seed=seed, dropout=0.0, **levers).validate()
        loaded = models.load(config, len(builtin_data.LABEL_NAMES), list(builtin_data.LABEL_NAMES))
        network = loaded.model
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(network, model)
        network.train()
        precision = Precision(config, "cpu")

        def batch(size):
            encoded = loaded.tokenizer(texts[:size], padding="max_length", truncation=True, max_length=max_seq_length,
                                       return_tensors="pt")
            encoded["labels"] = torch.tensor(labels[:size])
            return encoded

        meter = memory.ActivationMeter(network)
        activations = {}
        for size in (*FIT_SIZES, HELD_OUT_SIZE):
            with precision.autocast(), meter.measure():
                outputs = network(**batch(size))
            activations[size] = meter.bytes
            del outputs
        fit = fit_activations({size: activations[size] for size in FIT_SIZES})
        held_out_error = (fit.predict(HELD_OUT_SIZE) - activations[HELD_OUT_SIZE]) / activations[HELD_OUT_SIZE]
        optimizer = make_optimizer(network, config, "cpu")
        timed = batch(TIMED_MICRO_BATCH)
        began = time.perf_counter()
        for _ in range(TIMED_MICRO_BATCHES):
            with precision.autocast():
                loss = network(**timed).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds = (time.perf_counter() - began) / (TIMED_MICRO_BATCH * TIMED_MICRO_BATCHES)
        rows.append({"levers": levers, "static": budget.static_need(network, config, "cpu"),
                     "fit": {"fixed_bytes": fit.fixed_bytes, "bytes_per_example": fit.bytes_per_example},
                     "activations": activations, "held_out_error": held_out_error, "seconds_per_example": seconds})
    return rows


def plan_levers(measured: list[dict], budget_mb: float, target_effective_batch: int) -> dict:
    """For each setting: m (a power of two dividing the target, so m × k = target exactly) that fits the budget, k,
    the predicted peak; the recommendation is the fastest setting that fits, the cheapest-memory one beside it."""
    from gradacc.training.budget import largest_fitting_micro_batch

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
                     "seconds_per_example": setting["seconds_per_example"],
                     "held_out_error": setting["held_out_error"]})
    fitting = sorted((row for row in rows if row["fits"]), key=lambda row: row["seconds_per_example"])
    return {"budget_mb": budget_mb, "target_effective_batch": target_effective_batch,
            "rows": fitting + [row for row in rows if not row["fits"]],
            "fastest": fitting[0] if fitting else None,
            "cheapest_memory": min(fitting, key=lambda row: row["predicted_peak_bytes"]) if fitting else None,
            "largest_held_out_error": max(abs(row["held_out_error"]) for row in rows)}
