"""Finished runs (a demo's, stored ones, --metrics-out files) as one self-contained HTML page that replays them.

A speaker's fallback when the venue's machine fails, and what a free static Hugging Face Space serves: plotly.js
is inlined, nothing is fetched. The page draws the same loss and eval charts as the app (``charts``), frame by
frame at the pace the runs were recorded (queued runs one after the other, as the Demos page runs them), then
shows the headline the app shows.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from gradacc import events as ev
from gradacc.analysis import demos
from gradacc.analysis.headline import headline as two_run_headline
from gradacc.analysis.run_names import differing_labels
from gradacc.errors import GradaccError

# Frames of the replay at most: enough for smooth curves, few enough to keep the page small.
MAX_FRAMES = 60


def replay_frames(runs: list[tuple[str, list[dict]]], loss_title: str) -> list[dict]:
    """[{"t": seconds into the replay, "loss": figure JSON, "eval": figure JSON}]: the charts as they looked then.

    Each run's clock starts at its run_started event and the next run starts when it ended, so the replay keeps
    each run's recorded pace without the wait between recordings."""
    from gradacc.app import charts

    moments, offset = [], 0.0  # (replay second, run index, events shown of that run)
    for index, (_, events) in enumerate(runs):
        times = [e.get("time") for e in events]
        start = next((t for e, t in zip(events, times) if e.get("event") == ev.RUN_STARTED and t is not None),
                     next((t for t in times if t is not None), None))
        if start is None:
            continue
        for count, (event, time) in enumerate(zip(events, times), 1):
            if event.get("event") in (ev.STEP, ev.EVAL, ev.RUN_ENDED) and time is not None:
                moments.append((offset + max(time - start, 0.0), index, count))
        offset += max((t for t in times if t is not None), default=start) - start
    if len(moments) > MAX_FRAMES:  # evenly through the replay, always with the end
        keep = {round(i * (len(moments) - 1) / (MAX_FRAMES - 1)) for i in range(MAX_FRAMES)}
        moments = [moment for i, moment in enumerate(moments) if i in keep]
    frames = []
    for second, index, count in moments:
        shown = [(label, events if i < index else events[:count] if i == index else [])
                 for i, (label, events) in enumerate(runs)]
        last = (second, index, count) == moments[-1]
        frames.append({"t": round(second, 3),
                       "loss": charts.loss_figure(shown, x="samples_seen",
                                                  title=loss_title if last else "Training loss against samples seen"
                                                  ).to_plotly_json(),
                       "eval": charts.eval_figure(shown).to_plotly_json()})
    return frames


def run_headline(runs: list[tuple[str, list[dict]]], compares: tuple[int, int] = (0, 1)) -> dict | None:
    """The app's headline of the two compared runs (None with fewer than two runs that trained)."""
    if len(runs) < 2:
        return None
    a, b = runs[compares[0]][1], runs[compares[1]][1]
    try:
        return two_run_headline(a, b)
    except (GradaccError, KeyError, TypeError, ValueError):
        return None  # a run that never trained has nothing to compare


def page_html(title: str, runs: list[tuple[str, list[dict]]], explanation: str = "",
              compares: tuple[int, int] = (0, 1)) -> str:
    """The whole page: ``explanation`` (Markdown: paragraphs, **bold**, `code`), the replayed charts, the headline."""
    from plotly.offline import get_plotlyjs
    from plotly.utils import PlotlyJSONEncoder

    figures = run_headline(runs, compares)
    loss_title = figures["loss_claim"] if figures else "Training loss against samples seen"
    frames = replay_frames(runs, loss_title)
    if not frames:
        raise GradaccError("Nothing to replay: none of the runs logged a training step.")
    warnings = [f"{label}: {w}" for label, events in runs for e in events if e.get("event") == ev.RUN_ENDED
                for w in e.get("warnings") or []]
    data = json.dumps({"frames": frames, "headline": figures["headline"] if figures else "",
                       "warnings": warnings}, cls=PlotlyJSONEncoder)
    return _TEMPLATE.format(
        title=html.escape(title), explanation=_markdown(explanation),
        runs=html.escape(" · ".join(label for label, _ in runs)),
        plotly=get_plotlyjs(), data=data.replace("</", "<\\/"))  # no "</script>" inside the script


def _markdown(text: str) -> str:
    """The little Markdown the demos' explanations use, escaped first so nothing else becomes HTML."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text or "") if p.strip()]
    out = []
    for paragraph in paragraphs:
        escaped = html.escape(paragraph)
        escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
        escaped = re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)
        out.append(f"<p>{escaped}</p>")
    return "\n".join(out)


# ---- what to export: a demo, stored runs, --metrics-out files (the CLI and the Demos page) --------------------

def demo_runs(scenario: demos.Scenario, stored: list[dict], events_of) -> list[tuple[str, list[dict]]]:
    """The newest ended run of each of the demo's runs (``stored``: RunStore.list_runs, newest first); a failed one
    counts (memory-wall's first run fails on purpose)."""
    from gradacc.serving.store import LIVE_STATUSES

    found = []
    for run in scenario.runs:
        label = scenario.run_label(run.label)
        match = next((r for r in stored if r.get("label") == label and r["status"] not in LIVE_STATUSES), None)
        if match is None:
            raise GradaccError(f"RUN_OR_DEMO {scenario.name!r}: the demo has no finished run {run.label!r} here; "
                               "run it on the Demos page first.")
        found.append((run.label, events_of(match["run_id"])))
    return found


def demo_page(scenario: demos.Scenario, runs: list[tuple[str, list[dict]]]) -> str:
    """A finished demo's page: its title, explanation and expectation, its runs replayed, its headline."""
    return page_html(scenario.title, runs, f"{scenario.explanation}\n\nExpect: {scenario.expect}", scenario.compares)


def resolve(sources: list[str], store) -> tuple[str, list[tuple[str, list[dict]]], demos.Scenario | None, tuple]:
    """(title, [(label, events)], the demo or None, compares) for the CLI's RUN_OR_DEMO arguments: one demo name, or
    stored run ids and --metrics-out files in any mix. GradaccError in the argument's words otherwise."""
    if len(sources) == 1 and demos.get(sources[0]):
        scenario = demos.get(sources[0])
        return scenario.title, demo_runs(scenario, store.list_runs(), store.events), scenario, scenario.compares
    runs, configs = [], {}
    for source in sources:
        if demos.get(source):
            raise GradaccError(f"RUN_OR_DEMO {source!r} is a demo: export a demo on its own.")
        if Path(source).is_file():
            events = ev.read_events(source)
        elif store.get_run(source) is not None:
            events = store.events(source)
        else:
            raise GradaccError(f"RUN_OR_DEMO {source!r} is not a demo ({', '.join(demos.SCENARIOS)}), a stored run "
                               "id or an events file written by --metrics-out.")
        started = next((e for e in events if e.get("event") == ev.RUN_STARTED), None)
        configs[source] = (started or {}).get("config") or {}
        runs.append((source, events))
    labels = differing_labels(configs) if len(runs) > 1 else {source: Path(source).stem for source in configs}
    return "gradacc runs", [(labels.get(source) or source, events) for source, events in runs], None, (0, 1)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · gradacc</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1200px; margin: 2rem auto; padding: 0 1rem; color: #222; }}
.charts {{ display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }}
.chart {{ height: 420px; }}
#headline {{ font-size: 1.3rem; font-weight: 600; padding: 0.8rem 1rem; background: #e8f5e9; border-radius: 6px; }}
#headline:empty {{ display: none; }}
.muted {{ color: #666; font-size: 0.9rem; }}
code {{ background: #f3f3f3; padding: 0 0.2rem; }}
</style>
</head>
<body>
<h1>{title}</h1>
{explanation}
<p class="muted">Runs: {runs}. Replayed at the pace they were recorded, from recorded events (gradacc).
<button id="replay" type="button">Replay</button> <span id="clock"></span></p>
<div id="headline"></div>
<ul id="warnings" class="muted"></ul>
<div class="charts"><div id="loss" class="chart"></div><div id="eval" class="chart"></div></div>
<script>{plotly}</script>
<script>
const REPLAY = {data};
const config = {{displaylogo: false, responsive: true}};
let timers = [];
function draw(frame) {{
  Plotly.react("loss", frame.loss.data, frame.loss.layout, config);
  Plotly.react("eval", frame.eval.data, frame.eval.layout, config);
}}
function finish() {{
  document.getElementById("headline").textContent = REPLAY.headline;
  const list = document.getElementById("warnings");
  list.replaceChildren(...REPLAY.warnings.map(w => {{ const li = document.createElement("li"); li.textContent = "⚠️ " + w; return li; }}));
}}
function replay() {{
  timers.forEach(clearTimeout);
  document.getElementById("headline").textContent = "";
  document.getElementById("warnings").replaceChildren();
  draw(REPLAY.frames[0]);
  const end = REPLAY.frames[REPLAY.frames.length - 1].t;
  timers = REPLAY.frames.map((frame, i) => setTimeout(() => {{
    draw(frame);
    document.getElementById("clock").textContent = frame.t.toFixed(1) + " s of " + end.toFixed(1) + " s";
    if (i === REPLAY.frames.length - 1) finish();
  }}, frame.t * 1000));
}}
document.getElementById("replay").addEventListener("click", replay);
replay();
</script>
</body>
</html>
"""
