"""The result of two runs in figures and one sentence: run B described against run A (the Compare and Demos
pages and ``python -m gradacc compare``)."""

from __future__ import annotations

import math
import statistics

from gradacc import events as ev
from gradacc.choices import PITFALLS
from gradacc.analysis import divergence, window_scale
from gradacc.analysis.run_names import DATA_FIELDS, _value, config_differences, field_name


# Curves closer than this (largest relative difference at the same samples seen) are "identical": float
# summation order alone moves the loss by ~1e-7.
IDENTICAL = 1e-4
# ... and closer than this "match" (dropout on, or another backend's kernels).
MATCH = 1e-2
# A loss this many times the other's is said as a ratio ("570× larger"): a relative difference, bounded by 100 %,
# would hide it.
RATIO = 2.0
# A loss below this share of its run's first loss is near zero, where the ratio of two losses is noise (0.002 against
# 0.0001 reads "20×"): ratios and differences are medians over the steps where both losses are above it.
NOISE_SHARE = 0.05
# Eval keys that are bookkeeping, not a metric.
NOT_METRICS = {"event", "time", "epoch", "step", *ev.BASELINE_METRICS}


def run_figures(run_events: list[dict]) -> dict:
    """What the headline needs from one run's events: its loss curve and its costs."""
    started = next((e for e in run_events if e.get("event") == ev.RUN_STARTED), {}) or {}
    steps = [e for e in run_events if e.get("event") == ev.STEP]
    evals = [e for e in run_events if e.get("event") == ev.EVAL]
    activations = [e["activation_bytes"] for e in steps if e.get("activation_bytes") is not None]
    last = steps[-1] if steps else {}
    return {
        "config": started.get("config") or {},
        "effective_batch": started.get("effective_batch"),
        "curve": {e["samples_seen"]: e["loss"] for e in steps if e.get("loss") is not None},
        "steps": {e["samples_seen"]: e["step"] for e in steps},
        "peak_activation_bytes": max(activations) if activations else None,
        "time_per_step_s": last["elapsed_s"] / last["step"] if last.get("step") else None,
        "step_seconds": step_seconds(steps, "elapsed_s"),
        # The steps' own work (events.StepEvent.cpu_s), where every step measured it.
        "step_cpu_seconds": step_seconds(steps, "cpu_s") if steps and all("cpu_s" in e for e in steps) else None,
        "samples_per_s": last.get("samples_per_s"),
        "eval": {key: value for key, value in (evals[-1] if evals else {}).items()
                 if key not in NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool)},
    }


def step_seconds(steps: list[dict], clock: str = "elapsed_s") -> list[float]:
    """Seconds each optimizer step took by ``clock`` (elapsed_s: wall; cpu_s: the training thread's CPU), from
    consecutive steps; the first, which pays for warm-up, and a step after an evaluation are left out."""
    seconds, previous = [], None
    for event in steps:
        if previous is not None and event.get("epoch") == previous.get("epoch"):
            seconds.append(event[clock] - previous[clock])
        previous = event
    return seconds


def quartiles(values: list[float]) -> tuple[float, float, float] | None:
    """(first quartile, median, third quartile), or None for fewer than 4 values."""
    if len(values) < 4:
        return None
    ordered = sorted(values)

    def at(fraction):
        position = fraction * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return at(0.25), at(0.5), at(0.75)


def above_noise(curve_a: dict, curve_b: dict) -> list:
    """The samples seen both runs logged where each loss is at least NOISE_SHARE of its own run's first loss."""
    shared = sorted(set(curve_a) & set(curve_b))
    if not shared:
        return []
    floor_a, floor_b = (NOISE_SHARE * abs(curve[min(curve)]) for curve in (curve_a, curve_b))
    return [x for x in shared if abs(curve_a[x]) >= floor_a and abs(curve_b[x]) >= floor_b and curve_a[x] and curve_b[x]]


def loss_ratios(curve_a: dict, curve_b: dict) -> list[float]:
    """B's loss over A's at each samples seen where both are above noise (``above_noise``)."""
    return [curve_b[x] / curve_a[x] for x in above_noise(curve_a, curve_b)]


def relative_differences(curve_a: dict, curve_b: dict) -> list[float]:
    """|B − A| over the larger of the two, at each samples seen where both are above noise."""
    return [abs(curve_a[x] - curve_b[x]) / max(abs(curve_a[x]), abs(curve_b[x])) for x in above_noise(curve_a, curve_b)]


def loss_difference(curve_a: dict, curve_b: dict) -> tuple[float | None, int]:
    """(largest relative difference of the two losses at the same samples seen, points compared).

    Points are compared where both runs logged the same number of samples; runs with different effective
    batches share fewer such points (every other one for 32 against 64), never none (the end of an epoch).
    """
    shared = sorted(set(curve_a) & set(curve_b))
    if not shared:
        return None, 0
    worst = max(abs(curve_a[x] - curve_b[x]) / max(abs(curve_a[x]), abs(curve_b[x]), 1e-12) for x in shared)
    return worst, len(shared)


def headline(events_a: list[dict], events_b: list[dict], name_differences: bool = True) -> dict:
    """The result of two runs in figures and one sentence: run B described against run A.

    Keys: ``loss_max_rel_diff`` and ``loss_points_compared`` (every shared point: what "identical" is judged on),
    ``loss_points_above_noise``, ``loss_ratio_median``, ``loss_rel_diff_median`` and
    ``loss_max_rel_diff_above_noise`` (over those points: what "differ" is said with), ``activation_ratio`` (A's
    peak activation bytes over B's: >1 means B holds fewer),
    ``time_per_step_ratio`` and ``samples_per_s_ratio`` (B over A; measured, never said: see ``_claims``),
    ``effective_batch`` [A, B], ``eval`` {metric: [A, B]} (F1 when both have it, else every eval metric both
    runs report), ``differences`` (config fields), ``same_data``, ``same_effective_batch``, ``agree_steps``,
    ``agree_max``, ``agree_last_step`` and ``part_step`` (where the curves agree and part: divergence.agreement),
    ``verdict`` (divergence.SAME, EXPLAINED, DIFFERS or FAILED: what the box that shows it means), and ``headline``.
    ``name_differences``: say which settings differ beside different curves (a page whose run names already say
    it passes False, so the headline stays short).
    """
    a, b = run_figures(events_a), run_figures(events_b)
    rel_diff, points = loss_difference(a["curve"], b["curve"])
    differences = config_differences(a["config"], b["config"])
    same_data = not set(differences) & set(DATA_FIELDS)
    same_batch = a["effective_batch"] == b["effective_batch"]
    shared_metrics = [key for key in a["eval"] if key in b["eval"]]
    for main_metric in ("eval_f1", "eval_perplexity", "eval_mrr_at_10"):  # one score says it; more: a paragraph
        if main_metric in shared_metrics:
            shared_metrics = [main_metric]
            break
    figures = {
        "loss_max_rel_diff": rel_diff,
        "loss_points_compared": points,
        "activation_ratio": _ratio(a["peak_activation_bytes"], b["peak_activation_bytes"]),
        "peak_activation_bytes": [a["peak_activation_bytes"], b["peak_activation_bytes"]],
        "time_per_step_ratio": _ratio(b["time_per_step_s"], a["time_per_step_s"]),
        "time_per_step_s": [a["time_per_step_s"], b["time_per_step_s"]],
        "samples_per_s_ratio": _ratio(b["samples_per_s"], a["samples_per_s"]),
        "samples_per_s": [a["samples_per_s"], b["samples_per_s"]],
        "effective_batch": [a["effective_batch"], b["effective_batch"]],
        "eval": {key: [a["eval"][key], b["eval"][key]] for key in shared_metrics},
        "differences": differences,
        "same_data": same_data,
        "same_effective_batch": same_batch,
    }
    ratios = loss_ratios(a["curve"], b["curve"])
    differences = relative_differences(a["curve"], b["curve"])
    figures["loss_points_above_noise"] = len(ratios)
    figures["loss_ratio_median"] = statistics.median(ratios) if ratios else None
    figures["loss_rel_diff_median"] = statistics.median(differences) if differences else None
    figures["loss_max_rel_diff_above_noise"] = max(differences) if differences else None
    # Measured for --json and the table, never said: two runs made one after the other are not a paired measurement
    # (the machine's load moves one and not the other; the same pair read "within noise", then "1.6× slower").
    # ``python -m gradacc bench sweep`` times m and k paired, in rotating rounds.
    clock = "step_cpu_seconds" if a["step_cpu_seconds"] and b["step_cpu_seconds"] else "step_seconds"
    figures["step_seconds_quartiles"] = [quartiles(a[clock]), quartiles(b[clock])]
    figures["step_seconds_clock"] = "cpu" if clock == "step_cpu_seconds" else "wall"
    figures.update(divergence.agreement(a["steps"], a["curve"], b["curve"]))
    failed = divergence.failure(events_a, events_b)
    if failed:  # a run without a curve has no figures to set beside the other's: say why, never "vs none"
        return {**figures, "loss_claim": failed, "loss_title": failed, "memory_claim": None, "scale_claim": None,
                "verdict": divergence.FAILED, "headline": failed}
    claim, reason, figures["verdict"] = _loss_claim(figures, a["config"], b["config"], name_differences,
                                                    events_a, events_b)
    figures["loss_claim"] = f"{claim}: {reason}" if reason else claim
    figures["loss_title"] = claim  # a chart's title: the claim, its reason left to the headline
    figures["memory_claim"] = _memory_claim(figures["activation_ratio"])
    figures["scale_claim"] = _scale_claim(events_a, events_b, a["config"], b["config"])
    parts = [_pitfall_claim(a["config"], b["config"]), figures["loss_claim"], figures["scale_claim"],
             figures["memory_claim"], _eval_claim(figures["eval"])]
    figures["headline"] = " · ".join(part for part in parts if part)
    return figures


def _ratio(top, bottom) -> float | None:
    if top is None or bottom is None or not bottom or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def _versus(name: str, config_a: dict, config_b: dict) -> str:
    """'normalisation naive vs exact': B's value first, as the headline describes B against A."""
    return f"{field_name(name)} {_value(config_b.get(name))} vs {_value(config_a.get(name))}"


def _size(rel_diff: float) -> str:
    return "0" if rel_diff == 0 else f"{rel_diff:.0e}" if rel_diff < MATCH else f"{rel_diff:.0%}"


def _times(ratio: float) -> str:
    """4.0× larger, 570× smaller: B's loss against A's."""
    factor = max(ratio, 1 / ratio)
    return f"{factor:.1f}× {'larger' if ratio > 1 else 'smaller'}" if factor < 10 else \
        f"{factor:.0f}× {'larger' if ratio > 1 else 'smaller'}"


def _differs(figures: dict) -> str:
    """How far apart two curves are, as medians over the steps where both losses are above noise: ": loss 4.0×
    larger" once one is twice the other (a percentage, bounded by 100 %, would hide it), else " by 12%"."""
    median_ratio, median_diff = figures["loss_ratio_median"], figures["loss_rel_diff_median"]
    steps = figures["loss_points_above_noise"]
    if median_ratio is None:
        return f" by up to {_size(figures['loss_max_rel_diff'])} (no step above noise to take a median over)"
    if max(median_ratio, 1 / median_ratio) >= RATIO:
        return f": loss {_times(median_ratio)} (median of {steps} steps)"
    largest = figures["loss_max_rel_diff_above_noise"]
    if median_diff < IDENTICAL <= MATCH <= largest:  # apart at a few steps only: "differ by 1e-07" contradicts itself
        return f" by up to {_percent(largest)} (median {_percent(median_diff)})"
    return f" by {_percent(median_diff)} (median of {steps} steps)"


def _percent(share: float) -> str:
    """12%, 2.1%, 4e-05 (a share below 0.1 % as a number: "0.0%" would say none)."""
    if share == 0:
        return "0%"
    return f"{share:.0%}" if share >= 0.095 else f"{share:.1%}" if share >= 0.001 else f"{share:.0e}"


def _loss_claim(figures: dict, config_a: dict, config_b: dict, name_differences: bool = True,
                events_a: list[dict] = (), events_b: list[dict] = ()) -> tuple[str, str | None, str]:
    """(what the loss curves show, where they part and why, the verdict: divergence.SAME, EXPLAINED or DIFFERS)."""
    rel_diff = figures["loss_max_rel_diff"]
    caveats = []
    if not figures["same_data"]:
        fields = [name for name in figures["differences"] if name in DATA_FIELDS]
        caveats.append("different data (" + ", ".join(_versus(n, config_a, config_b) for n in fields) + ")")
    if not figures["same_effective_batch"]:
        batch_a, batch_b = figures["effective_batch"]
        caveats.append(f"different effective batches ({batch_b} vs {batch_a})")
    if rel_diff is None:
        return "; ".join(caveats + ["no loss at the same samples seen to compare"]).capitalize(), None, \
            divergence.EXPLAINED if caveats else divergence.DIFFERS
    if caveats:  # honest: such curves are not expected to be equal, whatever the numbers say
        return ("; ".join(caveats) + f": loss differs{_differs(figures).removeprefix(': loss')}").capitalize(), None, \
            divergence.EXPLAINED
    if config_a.get("trainer_library_default") != config_b.get("trainer_library_default") and \
            figures.get("loss_ratio_median") and config_a.get("grad_accum_steps") == config_b.get("grad_accum_steps"):
        k = config_a.get("grad_accum_steps")
        median = figures["loss_ratio_median"]
        default_is_b = bool(config_b.get("trainer_library_default"))
        side = "with Trainer's default" if default_is_b else "with gradacc's fix"
        return (f"Loss {_times(median)} {side} "
                f"(median of {figures['loss_points_above_noise']} steps)",
                f"Trainer's default did not divide the loss by k={k}", divergence.EXPLAINED)
    if rel_diff < IDENTICAL:  # identity is judged on every shared step: the largest difference
        return f"Loss curves identical (max difference {_size(rel_diff)})", None, divergence.SAME
    if rel_diff < MATCH:
        return f"Loss curves match (max difference {_size(rel_diff)})", None, divergence.SAME
    # The charts' x axis says "samples seen": the headline stays short.
    why, verdict = divergence.cause(figures, figures["differences"], config_a, config_b, list(events_a),
                                    list(events_b), name_differences)
    return f"Loss curves differ{_differs(figures)}", why and f"{divergence.where(figures)} — {why}", verdict


def _pitfall_claim(config_a: dict, config_b: dict) -> str | None:
    """'Broken on purpose: scheduler-per-micro-batch (accelerate #963)' for pitfalls B runs and A does not
    ('fixed: ...' the other way round); None when both run the same."""
    a, b = config_a.get("pitfalls") or [], config_b.get("pitfalls") or []

    def named(names):
        return ", ".join(f"{name} ({PITFALLS.get(name, 'unknown')})" for name in names)

    parts = [f"broken on purpose: {named(n for n in b if n not in a)}" if set(b) - set(a) else None,
             f"fixed: {named(n for n in a if n not in b)}" if set(a) - set(b) else None]
    claim = "; ".join(p for p in parts if p)
    return claim[:1].upper() + claim[1:] or None


def _scale_claim(events_a: list[dict], events_b: list[dict], config_a: dict, config_b: dict) -> str | None:
    """Where two runs differ in loss normalisation: the steps one of them applied off their gradient ("naive: 24 of
    744 steps at 0.25× their gradient"), B's first; None when neither did or the events cannot tell."""
    if config_a.get("loss_normalization") == config_b.get("loss_normalization"):
        return None
    for events, config in ((events_b, config_b), (events_a, config_a)):
        said = window_scale.claim(events)
        if said:
            return f"{_value(config.get('loss_normalization'))}: {said}"
    return None


def _memory_claim(ratio: float | None) -> str | None:
    if ratio is None:
        return None
    if abs(ratio - 1) < 0.05:
        return "activations the same"
    return f"activations {ratio:.1f}× smaller" if ratio > 1 else f"activations {1 / ratio:.1f}× larger"


def _eval_claim(metrics: dict) -> str | None:
    """The final scores, shown and never explained: one run of each setting cannot tell an effect from the spread
    of the same setting over seeds, so a difference says "one seed each"."""
    parts = []
    for key, (value_a, value_b) in metrics.items():
        name = METRIC_NAMES.get(key, key.removeprefix("eval_").replace("_", " "))
        if _score(value_a) == _score(value_b):
            parts.append(f"{name} {_score(value_a)} both")
        else:
            parts.append(f"{name} {_score(value_b)} vs {_score(value_a)}")  # B's first: B is described against A
    if not parts:
        return None
    return ", ".join(parts) + ("" if all(part.endswith(" both") for part in parts) else " (one seed each)")


def _score(value: float) -> str:
    """0.874 (a score on 0–1), 91.54 (a perplexity): four figures at most, enough to tell two runs apart."""
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.4g}"


METRIC_NAMES = {"eval_f1": "F1", "eval_accuracy": "accuracy", "eval_loss": "eval loss", "eval_mrr_at_10": "MRR@10",
                "eval_recall_at_1": "recall@1"}
