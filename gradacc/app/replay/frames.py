"""The replay's timeline: what the Demos page showed at each moment of recorded runs, built with the page's own
functions (``comparison``, ``runview``, ``charts``), and sent small.

Each run's clock starts at its run_started event and the next run starts when it ended, so the replay keeps each
run's recorded pace without the wait between recordings. At each moment the runs are cut to the events they had
then, and the view is built from them: the runs' panels, the headline and the line under it, the warnings, the
table and every chart. A frame sends only what changed since the frame before; a chart's trace that only grew is
sent as its length in the last frame's trace (the browser cuts it), so sixty frames cost little more than one.
"""

from __future__ import annotations

import base64
import math

import numpy as np

from gradacc import events as ev
from gradacc.app import charts, comparison, runview
from gradacc.app.replay import parts
from gradacc.serving.run_state import RunState

# Moments of the replay at most: smooth curves, a page built in seconds.
MAX_FRAMES = 80
# Significant digits of a number sent to the browser: more than a chart or its hover can show.
DIGITS = 7


def moments(runs: list[tuple[str, list[dict]]]) -> list[tuple[float, int, int]]:
    """(replay second, run index, events shown of that run): each run_started, step, eval and run_ended, at most
    MAX_FRAMES of them, evenly through the replay and always with the end."""
    found, offset = [], 0.0
    for index, (_, events) in enumerate(runs):
        times = [e.get("time") for e in events]
        start = next((t for e, t in zip(events, times) if e.get("event") == ev.RUN_STARTED and t is not None),
                     next((t for t in times if t is not None), None))
        if start is None:
            continue
        for count, (event, time) in enumerate(zip(events, times), 1):
            if event.get("event") in (ev.RUN_STARTED, ev.STEP, ev.EVAL, ev.RUN_ENDED) and time is not None:
                found.append((offset + max(time - start, 0.0), index, count))
        offset += max((t for t in times if t is not None), default=start) - start
    if len(found) > MAX_FRAMES:
        keep = {round(i * (len(found) - 1) / (MAX_FRAMES - 1)) for i in range(MAX_FRAMES)}
        found = [moment for i, moment in enumerate(found) if i in keep]
    return found


def runs_at(runs: list[tuple[str, list[dict]]], index: int, count: int) -> list[RunState]:
    """The runs as the page held them when run ``index`` had logged ``count`` events: those before it ended, those
    after it queued."""
    states = []
    for i, (label, events) in enumerate(runs):
        shown = events if i < index else events[:count] if i == index else []
        started = next((e for e in shown if e.get("event") == ev.RUN_STARTED), None)
        ended = next((e for e in reversed(shown) if e.get("event") == ev.RUN_ENDED), None)
        status = ended.get("status", ev.FAILED) if ended else "running" if shown else "queued"
        config = (started or {}).get("config") or _config(events)
        states.append(RunState(f"run-{i}", "replay", label, config, status, (ended or {}).get("reason"),
                               events=shown))
    return states


def _config(events: list[dict]) -> dict:
    return next((e.get("config") or {} for e in events if e.get("event") == ev.RUN_STARTED), {})


def view(runs: list[RunState], labels: dict[str, str], pairs: list[tuple[int, int]] | None, story: str | None,
         checks: list[dict] | None, last: bool) -> dict:
    """What the page shows of these runs: {"panels", "headline", "warnings", "table", "checks": HTML; "charts":
    {name: figure as plain JSON}}. The gradient checks (``checks``, reports) are shown with the result."""
    figures = comparison.headline(runs, pairs)
    panels = [(labels[run.run_id], *runview.status_message(run), runview.progress(run)) for run in runs]
    rows, shown = comparison.table_rows(runs, labels)
    curves = [(labels[run.run_id], run.events) for run in runs]
    built = comparison.build_figures(curves, figures, story=story, pairs=pairs)
    return {"panels": parts.panels(panels, waiting=any(run.is_live for run in runs)),
            "headline": parts.headline(figures, comparison.headline_box(figures, runs) if figures else None,
                                       comparison.against_line(figures, labels) if figures else ""),
            "warnings": parts.warnings(comparison.warning_lines(runs, labels)),
            "table": parts.table(rows, shown),
            "checks": parts.checks(checks) if checks and last else "",
            "charts": {name: plain_figure(figure) for name, figure in built.items()}}


def plain_figure(figure) -> dict:
    """A figure as the browser's plotly takes it: lists of rounded numbers, without plotly's template (the page
    gives every chart the app's look, page_look.js)."""
    as_dict = _plain(figure.to_plotly_json())
    layout = {key: value for key, value in as_dict.get("layout", {}).items() if key != "template"}
    return {"data": as_dict.get("data", []), "layout": charts.fit_legend(layout, as_dict.get("data", []))}


def _plain(value):
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, dict) and "bdata" in value and "dtype" in value:  # plotly's packed array: numbers again
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        if isinstance(shape, str):  # "2, 3"
            shape = tuple(int(size) for size in shape.split(","))
        return _plain(array.reshape(shape) if shape else array)
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.{DIGITS}g}")
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def timeline(runs: list[tuple[str, list[dict]]], labels: dict[str, str], pairs, story, checks) -> dict:
    """{"end": replay seconds, "final": {chart: figure}, "frames": [{"t", part: HTML (changed parts only),
    "charts": {chart: delta}}]}: the whole replay (see ``chart_delta``)."""
    found = moments(runs)
    views = [(second, view(runs_at(runs, index, count), labels, pairs, story, checks, i == len(found) - 1))
             for i, (second, index, count) in enumerate(found)]
    if not views:
        return {"end": 0.0, "final": {}, "frames": []}
    final = views[-1][1]["charts"]
    frames, previous = [], {}
    for second, shown in views:
        frame = {"t": round(second, 3)}
        for part in ("panels", "headline", "warnings", "table", "checks"):
            if shown[part] != previous.get(part):
                frame[part] = shown[part]
        charts = {name: chart_delta(figure, final[name]) for name, figure in shown["charts"].items()}
        changed = {name: delta for name, delta in charts.items() if delta != (previous.get("charts") or {}).get(name)}
        if changed:
            frame["charts"] = changed
        frames.append(frame)
        previous = {**shown, "charts": charts}
    return {"end": frames[-1]["t"], "final": final, "frames": frames}


def chart_delta(figure: dict, final: dict) -> dict:
    """The figure against the final one: {"layout": ... (only if it differs), "traces": [[final trace index, points]
    (a trace that is the start of the final one) or a whole trace]}."""
    delta = {} if figure["layout"] == final["layout"] else {"layout": figure["layout"]}
    traces = []
    for trace in figure["data"]:
        index = next((i for i, whole in enumerate(final["data"]) if _starts(trace, whole)), None)
        traces.append([index, _length(trace)] if index is not None else trace)
    delta["traces"] = traces
    return delta


def _starts(trace: dict, whole: dict) -> bool:
    """``trace`` is ``whole`` cut after its first points: the same settings, every array a start of whole's."""
    if trace.keys() != whole.keys():
        return False
    for key, value in trace.items():
        other = whole[key]
        if isinstance(value, list) and isinstance(other, list) and key in ARRAYS:
            if value != other[:len(value)] or len(value) != _length(trace):
                return False
        elif value != other:
            return False
    return True


# A trace's per-point arrays (what the browser cuts to a length).
ARRAYS = ("x", "y", "text", "customdata")


def _length(trace: dict) -> int:
    return len(trace.get("x") or trace.get("y") or [])
