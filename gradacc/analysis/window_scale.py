"""What each optimizer step's gradient was scaled by, against the gradient of its window's mean loss (1× is what a
full batch of the window's examples would give), read from a run's recorded events.

Where a loss is per example (a classifier of whole texts) on one process, naive ÷k weights every micro-batch's mean
loss by 1/k whatever the window holds, and exact by its share of the window's examples
(``gradacc.training.windows.loss_weight``). A micro-batch of n examples in a window of N therefore carries N/(k·n)
of its due under naive and exactly its due under exact: a window of one micro-batch when k=4 is stepped at 0.25×.
A token-level loss weighs micro-batches by tokens, which the events do not record per micro-batch; Trainer, the
pitfalls and several processes change the weighting in their own ways: no scales there (None).
"""

from __future__ import annotations

from gradacc import events as ev
from gradacc.training.tasks import task_named

# Scales this close to 1 are 1 (float rounding of N/(k·n) never comes near).
SAME = 1e-9


def step_scales(run_events: list[dict]) -> list[tuple[int, float, float]] | None:
    """[(samples seen, smallest, largest micro-batch scale)] for each optimizer step, or None where the events
    cannot tell (see the module's docstring)."""
    started = next((e for e in run_events if e.get("event") == ev.RUN_STARTED), None)
    config = (started or {}).get("config") or {}
    # A label per text: each example is one item of the loss.
    if (started is None or not task_named(config.get("task")).labelled or config.get("pitfalls")
            or config.get("backend") == "trainer" or (config.get("num_processes") or 1) != 1
            or config.get("loss_normalization") not in ("naive", "exact")):
        return None
    m, k = config.get("micro_batch_size"), config.get("grad_accum_steps")
    if not m or not k:
        return None
    scales, seen = [], 0
    for step in (e for e in run_events if e.get("event") == ev.STEP):
        window, micro_batches = step["samples_seen"] - seen, step.get("micro_batches") or 0
        seen = step["samples_seen"]
        if window <= 0 or micro_batches <= 0:
            continue
        if config["loss_normalization"] == "exact":
            scales.append((seen, 1.0, 1.0))
            continue
        last = window - (micro_batches - 1) * m  # every micro-batch is m examples but an epoch's last
        sizes = {m, last} if micro_batches > 1 else {last}
        found = [window / (k * size) for size in sizes if size > 0]
        scales.append((seen, min(found), max(found)))
    return scales


def off_steps(scales: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """The steps whose gradient was not applied whole."""
    return [scale for scale in scales if abs(scale[1] - 1) > SAME or abs(scale[2] - 1) > SAME]


def claim(run_events: list[dict]) -> str | None:
    """'24 of 744 steps at 0.25× their gradient' for a run that stepped some windows off their gradient; None for
    one that applied every window whole, or whose scales the events cannot tell."""
    scales = step_scales(run_events)
    if not scales:
        return None
    off = off_steps(scales)
    if not off:
        return None
    low, high = min(s[1] for s in off), max(s[2] for s in off)
    at = f"{low:.2g}×" if abs(high - low) <= SAME else f"{low:.2g}–{high:.2g}×"
    return f"{len(off)} of {len(scales)} steps at {at} their gradient"
