"""Finished runs (a demo's, stored ones, --metrics-out files) as one self-contained HTML page that replays them:
what to export (this module) and how a page replays (``gradacc.app.replay``).

A speaker's fallback when the venue's machine fails, and what a free static Hugging Face Space serves (one page,
or a gallery: ``gradacc.app.gallery``). The page is the Demos page replayed: the runs' panels, the headline and
the line under it, every chart in the app's look, the table, the gradient checks; plotly.js is inlined or beside
it, nothing is fetched.
"""

from __future__ import annotations

import json
from pathlib import Path

from gradacc import events as ev
from gradacc.analysis import demos
from gradacc.analysis.run_names import differing_labels
from gradacc.app import replay
from gradacc.errors import GradaccError
from gradacc.serving.store import LIVE_STATUSES


def page_html(title: str, runs: list[tuple[str, list[dict]]], explanation: str = "",
              compares: tuple[int, int] = (0, 1)) -> str:
    """Runs that are not a demo: the Compare page's view of them, replayed."""
    return replay.page_html(title, runs, explanation, "Runs: " + " · ".join(label for label, _ in runs),
                            pairs=[compares] if compares != (0, 1) else None)


def demo_page(scenario: demos.Scenario, runs: list[tuple[str, list[dict]]], checks: list[dict] | None = None,
              plotly_src: str | None = None, crumbs: str = "") -> str:
    """A finished demo's page: its title, explanation, runs and expectation, its runs replayed as the Demos page
    showed them, its headline; ``checks``: its gradient checks' reports, if it has them."""
    # Described from the demo's settings, which its runs were made with (demo_runs): a run that failed before it
    # started logged no settings of its own.
    caption = "Runs, in this order: " + " · ".join(
        f"**{label}** ({_described(config.to_dict())})" for label, config in scenario.configs()) + \
        f". Expect: {scenario.expect}"
    return replay.page_html(scenario.title, runs, scenario.explanation, caption,
                            pairs=[scenario.compares, *scenario.controls], story=scenario.chart, checks=checks,
                            plotly_src=plotly_src, crumbs=crumbs)


def _described(config: dict) -> str:
    epochs = config.get("epochs")
    return (f"{config.get('backend')}, m={config.get('micro_batch_size')}, k={config.get('grad_accum_steps')}, "
            f"{config.get('train_samples')} examples × {epochs} epoch{'s' if epochs != 1 else ''}")


# ---- what to export: a demo, stored runs, --metrics-out files (the CLI and the Demos page) --------------------

def demo_runs(scenario: demos.Scenario, stored: list[dict], events_of) -> list[tuple[str, list[dict]]]:
    """The newest ended run of each of the demo's runs (``stored``: RunStore.list_runs, newest first) made with the
    demo's settings as they are now (a run of an older version of the demo, or at another GRADACC_DEMO_SCALE, is
    not its run); a failed one counts (memory-wall's first run fails on purpose)."""
    settings = {label: _same_form(config.to_dict()) for label, config in scenario.configs()}
    found = []
    for run in scenario.runs:
        label = scenario.run_label(run.label)
        match = next((r for r in stored if r.get("label") == label and r["status"] not in LIVE_STATUSES
                      and _same_form(r.get("config") or {}) == settings[run.label]), None)
        if match is None:
            raise GradaccError(f"RUN_OR_DEMO {scenario.name!r}: the demo has no finished run {run.label!r} here; "
                               "run it on the Demos page first.")
        found.append((run.label, events_of(match["run_id"])))
    return found


def _same_form(config: dict) -> str:
    """A config as stored (JSON), to compare one read back with one built now."""
    return json.dumps(config, sort_keys=True, default=str)


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
