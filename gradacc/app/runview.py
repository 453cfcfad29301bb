"""What the live panel says about one run (status sentence, progress, latest scores); no Streamlit here."""

from __future__ import annotations

from gradacc import events as ev

# Which Streamlit alert shows each status.
STATUS_STYLE = {"queued": "info", "running": "info", "completed": "success", "stopped": "warning",
                "interrupted": "warning", "failed": "error"}


def status_message(run, queue_position: int | None) -> tuple[str, str]:
    """(alert kind, one sentence) for the run's status."""
    status = run.status
    style = STATUS_STYLE.get(status, "info")
    if status == "queued":
        where = f"position {queue_position} in the queue" if queue_position else "waiting for a free slot"
        return style, f"Queued: {where}. It starts when the run ahead of it ends."
    if status == "running":
        started = run.started
        if started is None:
            return style, "Running: loading the model and data…"
        return style, (f"Running on {started.get('device', 'cpu')}: effective batch {started['effective_batch']} "
                       f"(m={run.config['micro_batch_size']} × k={run.config['grad_accum_steps']}).")
    ended = run.ended or {}
    # An interrupted run has no run_ended (the server died mid-run): count the steps it logged.
    steps = ended["steps"] if "steps" in ended else run.progress()[0]
    wall = ended.get("wall_s")
    took = f" in {wall:.1f} s" if wall else ""
    if status == "completed":
        return style, f"Completed: {steps} optimizer steps{took}."
    if status == "failed":
        return style, f"Failed: {run.reason or 'no reason given'}"
    return style, f"{status.capitalize()} after {steps} optimizer steps{took}: {run.reason or 'no reason given'}."


def progress(run) -> tuple[float, str]:
    """(fraction done 0..1, 'step 3 of 8 · about 4 s left')."""
    done, total = run.progress()
    if not total:
        return 0.0, "waiting for the first optimizer step"
    text = f"optimizer step {done} of {total}"
    eta = run.eta_seconds()
    if eta is not None and done < total:
        text += f" · about {eta:.0f} s left"
    return min(1.0, done / total), text


def latest_eval(run) -> dict | None:
    evals = run.of(ev.EVAL)
    return evals[-1] if evals else None


def notes(run) -> list[str]:
    started = run.started
    return list((started or {}).get("notes") or [])


def tensorboard_zip(run) -> bytes:
    """The run's TensorBoard event files, zipped, written from its events (stored ones for an older run)."""
    from gradacc.export.trackers import tensorboard_zip as zip_events

    return zip_events(run.events, run.run_id)
