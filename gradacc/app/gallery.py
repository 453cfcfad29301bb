"""Every demo as a static site (``python -m gradacc export-site DIR``): an index page and one replay page per demo,
from runs recorded on this machine, that opens from disk with no network and deploys as a free static Hugging
Face Space (DIR/README.md carries the Space's front matter, ``sdk: static``).

A demo with no finished run in this machine's store is recorded first, as the Demos page runs it: its runs queued
one after the other on a run manager over the same store, so the app's Demos page and ``export-html`` find them
too. A demo with gradient checks (``Scenario.checks``) has them computed for its page. That work runs a demo per
process, as many at once as the machine has cores: a process trains on one core (torch's intra-op threads do little
for these small models), and processes share no GIL and no random generator; the store is SQLite in WAL mode, which
they write side by side.
"""

from __future__ import annotations

import html
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import plotly

from gradacc.analysis import demos
from gradacc.analysis.equivalence import check
from gradacc.app import comparison, replay, runview, web_page
from gradacc.app.replay import frames
from gradacc.errors import GradaccError
from gradacc.serving import warmup
from gradacc.serving.checks import coupled_check_configs
from gradacc.serving.manager import RunManager
from gradacc.serving.store import RunStore

OWNER = "export-site"  # the owner of the runs it records
INDEX = "index.html"
# A static Space's front matter: its README.md says how the Space is built (here: the files as they are).
SPACE_README = """---
title: gradacc demos
emoji: 🧮
colorFrom: red
colorTo: gray
sdk: static
app_file: index.html
pinned: false
---

Recorded runs of gradacc's demos, replayed in the browser as the app showed them: {count} demos, recorded
{date}. Made with `python -m gradacc export-site`.
"""


def write_site(folder: Path, store, say: Callable[[str], None] = print, names: list[str] | None = None,
               workers: int | None = None) -> dict:
    """Write the gallery into ``folder`` (created if missing), recording the demos ``store`` has no finished run
    of; ``names``: these demos only (default every one); ``workers``: demos prepared at once (default: the
    machine's cores). Returns {"pages": [file names], "recorded": [demo names], "bytes": total size}."""
    scenarios = [demos.SCENARIOS[name] for name in (names or demos.SCENARIOS)]
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_plotly_path(), folder / replay.PLOTLY_FILE)
    places = {scenario.name: f"[{number}/{len(scenarios)}] {scenario.name}"
              for number, scenario in enumerate(scenarios, 1)}
    prepared = prepare(scenarios, store, places, say, workers or os.cpu_count() or 1)
    recorded = [scenario.name for scenario in scenarios if prepared[scenario.name][0]]
    cards = {}
    for scenario in scenarios:
        where = places[scenario.name]
        runs = web_page.demo_runs(scenario, store.list_runs(), store.events)
        checks = prepared[scenario.name][1]
        page = web_page.demo_page(scenario, runs, checks, plotly_src=replay.PLOTLY_FILE,
                                  crumbs=f'<a href="{INDEX}">← every demo</a>')
        (folder / f"{scenario.name}.html").write_text(page, encoding="utf-8")
        cards[scenario.name] = _card(scenario, runs)
        say(f"{where}: wrote {scenario.name}.html ({len(page) / 1e3:,.0f} kB)")
    written = {scenario.name for scenario in scenarios}
    for scenario in demos.SCENARIOS.values():  # a page left by an earlier pass (--demo) keeps its card
        if scenario.name not in written and (folder / f"{scenario.name}.html").is_file():
            try:
                cards[scenario.name] = _card(scenario, web_page.demo_runs(scenario, store.list_runs(), store.events))
            except GradaccError:
                continue  # its runs are gone from this store: its page stays, unlisted
    (folder / INDEX).write_text(_index([cards[name] for name in demos.SCENARIOS if name in cards]), encoding="utf-8")
    (folder / "README.md").write_text(SPACE_README.format(count=len(scenarios), date=time.strftime("%Y-%m-%d")),
                                      encoding="utf-8")
    pages = [INDEX, *(f"{scenario.name}.html" for scenario in scenarios)]
    total = sum(path.stat().st_size for path in folder.iterdir() if path.is_file())
    return {"pages": pages, "recorded": recorded, "bytes": total}


def prepare(scenarios: list[demos.Scenario], store, places: dict[str, str], say: Callable[[str], None],
            workers: int) -> dict[str, tuple[bool, list[dict] | None]]:
    """{demo name: (recorded here, its gradient checks)}: each demo with no finished run in ``store`` recorded, each
    demo's checks computed; a demo per process when there are several to do and several ``workers``."""
    done = {scenario.name: (False, None) for scenario in scenarios if _ready(scenario, store)}
    work = [scenario for scenario in scenarios if scenario.name not in done]
    if len(work) < 2 or workers < 2:
        for scenario in work:
            done[scenario.name] = _prepare(scenario, store, _prefixed(say, places[scenario.name]))
        return done
    say(f"Preparing {len(work)} demos, {min(workers, len(work))} at a time (a process each).")
    # spawn, not fork: the warm-up and the store's lock are threads a forked child would inherit mid-step.
    with ProcessPoolExecutor(min(workers, len(work)), mp_context=get_context("spawn")) as pool:
        futures = {scenario.name: pool.submit(_prepare_apart, scenario.name, str(store.path), places[scenario.name])
                   for scenario in work}
        for name, future in futures.items():
            done[name] = future.result()
    return done


def _ready(scenario: demos.Scenario, store) -> bool:
    """Nothing to do for this demo: a finished run here, and no gradient checks to compute."""
    if scenario.checks:
        return False
    try:
        web_page.demo_runs(scenario, store.list_runs(), store.events)
    except GradaccError:
        return False
    return True


def _prepare(scenario: demos.Scenario, store, say: Callable[[str], None]) -> tuple[bool, list[dict] | None]:
    recorded = False
    try:
        web_page.demo_runs(scenario, store.list_runs(), store.events)
    except GradaccError:
        say(f"no finished run here; recording it ({len(scenario.runs)} runs, as the Demos page runs them)")
        record(scenario, store, say)
        recorded = True
    return recorded, gradient_checks(scenario, say)


def _prepare_apart(name: str, store_path: str, where: str) -> tuple[bool, list[dict] | None]:
    """``_prepare`` in a process of its own, saying its progress on the terminal it shares."""
    store = RunStore(store_path)
    try:
        return _prepare(demos.SCENARIOS[name], store, _prefixed(lambda line: print(line, flush=True), where))
    finally:
        store.close()


def _prefixed(say: Callable[[str], None], where: str) -> Callable[[str], None]:
    return lambda line: say(f"{where} · {line}")


def record(scenario: demos.Scenario, store, say: Callable[[str], None]) -> list[str]:
    """Run the demo's runs one after the other into ``store``, as the Demos page does, saying each run's progress;
    the run ids. A run that fails ends its line with its reason (memory-wall's first fails on purpose)."""
    warmup.start()  # the runs import torch through the warm-up, as the app's do
    # One slot, no time or memory limit of a deployment, and never touching runs of an app that shares the store.
    manager = RunManager(store, max_concurrent=1, max_run_seconds=0, max_run_memory_mb=0, recover=False)
    try:
        run_ids = [manager.submit(config, OWNER, label=scenario.run_label(label)) for label, config in scenario.configs()]
        for (label, _), run_id in zip(scenario.configs(), run_ids):
            shown = None
            while not manager.wait(run_id, timeout=1.0):
                progress = runview.progress(manager.get(run_id))
                line = f"{label}: {progress[1]}" if progress else f"{label}: queued"
                if line != shown and _worth_saying(line, shown):
                    say(line)
                    shown = line
            run = manager.get(run_id)
            _, sentence = runview.status_message(run)
            say(f"{label}: {sentence}")
    finally:
        manager.shutdown()
    return run_ids


def _worth_saying(line: str, said: str | None) -> bool:
    """A new phase, or a tenth more of the run's steps: a progress line every few seconds, not every second."""
    if said is None:
        return True
    if "optimizer step" not in line or "optimizer step" not in said:
        return line.split("…")[0] != said.split("…")[0]  # a phase's seconds count up: said once
    done = int(line.split("optimizer step ")[1].split(" of ")[0])
    before, total = (int(part.split(" ")[0]) for part in said.split("optimizer step ")[1].split(" of "))
    return done - before >= max(1, total // 10)


def gradient_checks(scenario: demos.Scenario, say: Callable[[str], None]) -> list[dict] | None:
    """The demo's gradient checks (``Scenario.checks``), computed here as the server's check queue would."""
    if not scenario.checks:
        return None
    warmup.start()
    warmup.wait_until_warm()
    reports = []
    for config in coupled_check_configs(scenario.checks):
        say(f"gradient check: {config.model}, m={config.micro_batch_size}, k={config.grad_accum_steps}")
        reports.append(check(config))
    return reports


def _card(scenario: demos.Scenario, runs: list[tuple[str, list[dict]]]) -> str:
    labels = {f"run-{index}": label for index, (label, _) in enumerate(runs)}
    states = frames.runs_at(runs, len(runs), 0)
    figures = comparison.headline(states, [scenario.compares, *scenario.controls])
    said = html.escape(figures["headline"]) if figures else "No result: a compared run did not train."
    moments = frames.moments(runs)
    seconds = moments[-1][0] if moments else 0.0
    return (f'<div class="card"><h3><a href="{scenario.name}.html">{html.escape(scenario.title)}</a></h3>'
            f'<p>{said}</p><p class="caption">{len(runs)} runs, replayed in {seconds:.0f} s · '
            f'{html.escape(" · ".join(labels.values()))}</p></div>')


def _index(cards: list[str]) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>gradacc demos</title>'
            f"<style>{replay.CSS}</style></head><body><main><h1>gradacc demos</h1>"
            f'<p>Gradient accumulation, seen and trusted: each demo below is a set of runs recorded on one machine, '
            f"replayed at the pace they trained, with every chart, the table and the result the app showed.</p>"
            f'<div class="gallery">{"".join(cards)}</div></main></body></html>')


def _plotly_path() -> Path:
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

