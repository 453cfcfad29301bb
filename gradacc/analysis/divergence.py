"""Why two loss curves differ, from the two runs' own events: where they agree (to what, over which steps), where they
part, and the cause the events can establish. The headline says it; nothing here lays a difference at m and k's door
unless the curves parted where only m and k differ.
"""

from __future__ import annotations

from gradacc import events as ev
from gradacc.analysis import window_scale
from gradacc.analysis.run_names import _value, field_name

# Losses this close (relative) are the same loss, one summation order apart: fp32 rounding moves tiny-bert's loss by
# ~1e-8, and it takes training tens of steps to amplify that past 1e-5.
AGREE = 1e-5
# A part after at least this many agreeing steps is rounding amplified; an earlier one is a different update (step 1's
# loss is taken before any update, so step 2 is the first to show one).
ROUNDING_AFTER = 5
# Config fields that change only the order of the same sums (the rest change what is computed).
SUMMATION_ONLY = ("micro_batch_size", "grad_accum_steps", "backend", "instrument", "memory_budget_mb",
                  "gradient_checkpointing", "eval_samples", "fsdp", "grad_sync", "num_processes")
ACCUMULATION = ("micro_batch_size", "grad_accum_steps")
# What a verdict means, for the box that shows it: the same curves; a difference with its cause (not accumulation);
# a difference measured where accumulation is; a run with no curve to compare.
SAME, EXPLAINED, DIFFERS, FAILED = "same", "explained", "differs", "failed"
ROUNDING = ("not accumulation: another summation order, amplified by training (the gradients agree: see the "
            "Equivalence page's gradient check)")
DROPOUT = "each run draws its own dropout masks: set Dropout to 0 to compare the accumulation alone"


def agreement(steps_a: dict, curve_a: dict, curve_b: dict) -> dict:
    """Where two curves agree to AGREE, from the first samples seen both logged: ``agree_steps`` (how many shared
    points in a row from the first), ``agree_max`` (the largest relative difference over them, None over none),
    ``agree_last_step`` and ``part_step`` (run A's step numbers, None where the curves never part)."""
    shared = sorted(set(curve_a) & set(curve_b))
    agreed = []
    for x in shared:
        difference = abs(curve_a[x] - curve_b[x]) / max(abs(curve_a[x]), abs(curve_b[x]), 1e-12)
        if difference > AGREE:
            break
        agreed.append(difference)
    parted = shared[len(agreed)] if len(agreed) < len(shared) else None
    return {"agree_steps": len(agreed), "agree_max": max(agreed) if agreed else None,
            "agree_last_step": steps_a.get(shared[len(agreed) - 1]) if agreed else None,
            "part_step": steps_a.get(parted) if parted is not None else None}


def where(found: dict) -> str:
    """'identical to 2e-06 for steps 1–42, apart from step 43', or 'apart from step 1'."""
    if not found["agree_steps"]:
        return f"apart from step {found['part_step']}"
    to = "to the bit" if found["agree_max"] == 0 else f"to {found['agree_max']:.0e}"
    steps = (f"step {found['agree_last_step']}" if found["agree_steps"] == 1
             else f"steps 1–{found['agree_last_step']}")
    return f"identical {to} for {steps}, apart from step {found['part_step']}"


def cause(found: dict, differences: list[str], config_a: dict, config_b: dict, events_a: list[dict],
          events_b: list[dict], name_differences: bool = True) -> tuple[str | None, str]:
    """(why two curves of the same data and effective batch part, the verdict): the settings that change what is
    computed first, then dropout, then float rounding, else the place where only m, k (and what sums in another order)
    differ. ``name_differences`` False: a page names each run by what differs, so a different setting is left to the
    names (None: nothing to add), and the headline stays short; what the names cannot say is said."""
    computed = [name for name in differences if name not in SUMMATION_ONLY and name != "dropout"]
    dropout_a, dropout_b = (config.get("dropout") or 0 for config in (config_a, config_b))
    reasons = []
    if computed and name_differences:  # else the runs' names say it (a page names each run by what differs)
        named = ", ".join(f"{field_name(n)} {_value(config_b.get(n))} vs {_value(config_a.get(n))}" for n in computed)
        reasons.append(f"{named} differ{'s' if len(computed) == 1 else ''}")
    if (dropout_a or dropout_b) and (set(differences) - set(computed)):
        said = (f"dropout {dropout_b:g} in both runs" if dropout_a == dropout_b
                else f"dropout {dropout_b:g} vs {dropout_a:g}")
        reasons.append(f"{said}: {DROPOUT}")
    if reasons or computed:
        return "; ".join(reasons) or None, EXPLAINED
    off = _off_gradient(events_a, events_b)
    if off:
        return off, DIFFERS
    precisions = {config_a.get("precision") or "fp32", config_b.get("precision") or "fp32"} - {"fp32"}
    if precisions:
        return (f"{', '.join(sorted(precisions))} rounds every sum, so another summation order alone can part the "
                "curves; the Equivalence page's gradient check tells accumulation apart"), DIFFERS
    if found["agree_steps"] >= ROUNDING_AFTER:
        return ROUNDING, EXPLAINED
    names = [field_name(n) for n in differences]
    if not names:
        return "where nothing in the config differs", DIFFERS
    only = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    alone = ": accumulation is not the big batch here" if set(differences) == set(ACCUMULATION) else ""
    return f"where only {only} differ{'s' if len(names) == 1 else ''}{alone}", DIFFERS


def _off_gradient(events_a: list[dict], events_b: list[dict]) -> str | None:
    """'naive: 2 of 126 steps at 0.5× their gradient' where the two runs stepped a window at another scale of its
    gradient (naive ÷k on another short window); None where every shared window was scaled alike."""
    scales_a, scales_b = (window_scale.step_scales(run_events) for run_events in (events_a, events_b))
    if not scales_a or not scales_b:
        return None
    by_samples = {seen: (low, high) for seen, low, high in scales_a}
    if all(by_samples.get(seen, (low, high)) == (low, high) for seen, low, high in scales_b):
        return None
    for run_events in (events_b, events_a):
        said = window_scale.claim(run_events)
        if said:
            started = next((e for e in run_events if e.get("event") == ev.RUN_STARTED), {})
            return f"{(started.get('config') or {}).get('loss_normalization')}: {said}"
    return None


def failure(events_a: list[dict], events_b: list[dict]) -> str | None:
    """'No loss to compare: the second run failed before its first step (model 'x' not found)', for a run
    without a step; None when both have one."""
    said = []
    for which, run_events in (("first", events_a), ("second", events_b)):
        if any(e.get("event") == ev.STEP for e in run_events):
            continue
        ended = next((e for e in reversed(run_events) if e.get("event") == ev.RUN_ENDED), None)
        if ended is None:
            said.append(f"the {which} run has no step yet")
        else:
            reason = f" ({ended['reason']})" if ended.get("reason") else ""
            said.append(f"the {which} run {ended.get('status') or ev.FAILED} before its first step{reason}")
    return "No loss to compare: " + "; ".join(said) if said else None
