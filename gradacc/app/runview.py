"""What the live panel says about one run (status sentence, progress, latest scores); no Streamlit here."""

from __future__ import annotations

import heapq
import statistics

from gradacc import events as ev
from gradacc.choices import BUILTIN_MODEL_TASKS
from gradacc.config import RunConfig
from gradacc.export.trackers import tensorboard_zip as zip_events
from gradacc.training.tasks import Task, task_named

RECENT_RUNS = 10  # finished runs whose durations estimate a queued run's wait

# Which Streamlit alert shows each status.
STATUS_STYLE = {"queued": "info", "running": "info", "completed": "success", "stopped": "warning",
                "interrupted": "warning", "failed": "error"}


def status_message(run, queue: tuple[int, str] | None = None) -> tuple[str, str]:
    """(alert kind, one sentence) for the run's status; ``queue``: (position, ``queue_wait`` phrase) if queued."""
    status = run.status
    style = STATUS_STYLE.get(status, "info")
    if status == "queued":
        if not queue:
            return style, "Queued: waiting for a free slot."
        position, wait = queue
        return style, f"Queued: position {position} in the queue; {wait}."
    if status == "running":
        started = run.started
        if started is None:  # the phase of preparing it is in, counting up: something moves from the first second
            return style, f"Running: {_phase(run) or 'loading the model and data…'}"
        return style, (f"Running on {started.get('device', 'cpu')}: effective batch {started['effective_batch']} "
                       f"(m={run.config['micro_batch_size']} × k={run.config['grad_accum_steps']}).")
    ended = run.ended or {}
    # An interrupted run has no run_ended (the server died mid-run): count the steps it logged.
    steps = ended["steps"] if "steps" in ended else run.progress()[0]
    wall = ended.get("wall_s")
    took = f" in {wall:.1f} s" if wall else ""
    if status == "completed":
        warnings = ended.get("warnings") or []
        if warnings:  # a run that completed badly is not a green success
            return "warning", f"Completed: {steps} optimizer steps{took}, but it went badly. " + " ".join(
                w[0].upper() + w[1:] for w in warnings)
        return style, f"Completed: {steps} optimizer steps{took}."
    if status == "failed":
        return style, f"Failed: {run.reason or 'no reason given'}"
    return style, f"{status.capitalize()} after {steps} optimizer steps{took}: {run.reason or 'no reason given'}."


def fit_with_accumulation(run):
    """The failed out-of-memory run's config with the m and k that fit its budget (same effective batch), or None."""
    fit = ((run.ended or {}).get("out_of_memory") or {}).get("fit") if run.status == ev.FAILED else None
    if not fit:
        return None
    return RunConfig.from_dict(run.config).replace(**fit)


def progress(run) -> tuple[float, str] | None:
    """(fraction done 0..1, 'optimizer step 3 of 8 · about 4 s left'), or None where a bar would say nothing
    true: a queued run (the status says its place) or one that ended before it counted its steps."""
    done, total = run.progress()
    if run.status == "queued" or (not total and not run.is_live):
        return None
    if not total:
        return 0.0, _phase(run) or "loading the model and data"
    text = f"optimizer step {done} of {total}"
    eta = run.eta_seconds()
    if eta is not None and done < total:
        text += f" · about {eta:.0f} s left"
    return min(1.0, done / total), text


def _phase(run) -> str | None:
    phase_text = getattr(run, "phase_text", None)  # a RunState; a stored run read back has no phase
    return phase_text() if phase_text else None


def queue(manager, run_id: str) -> tuple[int, str] | None:
    """(position, wait phrase) of a queued run for ``status_message``; None when it is not waiting."""
    position = manager.queue_position(run_id)
    if not position:
        return None
    running, ahead = manager.ahead_of(run_id)
    return position, queue_wait(running, ahead, manager.max_concurrent, manager.recent_wall_seconds(),
                                manager.max_run_seconds or None)


def queue_wait(running: list, ahead: list, slots: int, recent_s: list[float], limit_s: float | None) -> str:
    """How long a queued run waits, as a phrase: each run holding a slot ends at its own pace (its ETA), and
    each queued run ahead then takes as long as this server's recent runs did (their median), capped by the
    time limit. Without finished runs to go by, the limit gives an upper bound; without a limit, no figure."""
    typical = statistics.median(recent_s[-RECENT_RUNS:]) if recent_s else limit_s
    if typical is not None and limit_s:
        typical = min(typical, limit_s)
    etas = [run.eta_seconds() for run in running]
    if typical is None and (ahead or None in etas):
        return "wait unknown until a run has finished here"
    free_at = [eta if eta is not None else typical for eta in etas] + [0.0] * max(0, slots - len(etas))
    heapq.heapify(free_at)
    for _ in ahead:  # each run ahead takes the slot that frees first
        heapq.heapreplace(free_at, free_at[0] + typical)
    bound = not recent_s and (ahead or None in etas)  # only the limit to go by: an upper bound
    if bound:
        return f"at most {_duration(free_at[0])} to wait (runs stop after {_duration(limit_s)})"
    return f"about {_duration(free_at[0])} to wait"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def has_anything_to_show(run) -> bool:
    """False for a run that ended without a single optimizer step: no scores, charts or "yet" to draw."""
    return run.is_live or bool(run.of(ev.STEP))


def eval_scores(run) -> list[tuple[str, str]]:
    """The two latest eval scores the run's task has (``Task.metric_rows``), as (name, shown value): perplexity
    and next-token accuracy for a causal LM, F1 and accuracy for a classifier ("—" before the first eval)."""
    latest = latest_eval(run)
    return [(label, _shown(latest, key, form)) for label, key, form in run_task(run).metric_rows]


def run_task(run) -> Task:
    """The spec of a run's task: the one it named (its run_started event names the model's), else its built-in
    model's."""
    config = (run.started or {}).get("config") or run.config or {}
    return task_named(config.get("task") or BUILTIN_MODEL_TASKS.get(config.get("model")))


def _shown(latest: dict | None, key: str, form: str) -> str:
    value = (latest or {}).get(key)
    return form.format(value) if value is not None else "—"


def latest_eval(run) -> dict | None:
    evals = run.of(ev.EVAL)
    return evals[-1] if evals else None


def notes(run) -> list[str]:
    started = run.started
    return list((started or {}).get("notes") or [])


def tensorboard_zip(run) -> bytes:
    """The run's TensorBoard event files, zipped, written from its events (stored ones for an older run)."""
    return zip_events(run.events, run.run_id)


def live_demo_run_ids(runs, scenario) -> list[str]:
    """The ids of a demo's newest runs, in the scenario's order, while one of them is still queued or running
    (``runs``: the manager's, newest first); [] otherwise. A visitor who opens the demo's link while a speaker
    runs it watches these runs live instead of being asked to start them again."""
    newest = {}
    for run in runs:
        newest.setdefault(run.label, run)
    found = [newest.get(scenario.run_label(demo_run.label)) for demo_run in scenario.runs]
    if any(run is None for run in found) or not any(run.is_live for run in found):
        return []
    return [run.run_id for run in found]
