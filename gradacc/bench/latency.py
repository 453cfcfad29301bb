"""How long until the first loss: seconds from start to the first ``step`` event.

- cold: ``python -m gradacc train --json`` in a fresh subprocess, timed from launch to the first step line
  on its stdout, so interpreter start and every import (torch, transformers, accelerate) count; the time
  to the ``run_started`` line (imports, data, model) is kept too;
- warm: ``engine.train`` in this process after a warm-up run (libraries imported, tokenizer cached), timed
  from the call to the first step event;
- browser: from clicking Start to the first point on the loss chart, read from the file given with
  ``--browser-times`` (what ``scripts/page_latency.py`` prints, or the timings a browser test session wrote);
  never measured here, and never looked for in a place the tests write to: a figure says where it came from.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import plotly.graph_objects as go

from gradacc.bench import report, runs
from gradacc.choices import BACKENDS
from gradacc.config import RunConfig
from gradacc.errors import RunFailed

ROOT = Path(__file__).resolve().parents[2]
RUN = dict(micro_batch_size=8, grad_accum_steps=1, max_steps=2, train_samples=64, eval_samples=8, epochs=1)
FULL = dict(repeats=3, cold_backends=BACKENDS)
QUICK = dict(repeats=1, cold_backends=("pytorch",))


def cold(backend: str, threads: int) -> dict:
    """A fresh interpreter: launch → run_started line, launch → first step line."""
    args = [sys.executable, "-m", "gradacc", "train", "--json", "--backend", backend,
            "-m", str(RUN["micro_batch_size"]), "-k", str(RUN["grad_accum_steps"]),
            "--max-steps", str(RUN["max_steps"]), "--epochs", "1", "--train-samples", str(RUN["train_samples"]),
            "--eval-samples", str(RUN["eval_samples"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": str(threads)}
    times = {}
    launched = time.perf_counter()
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                          cwd=ROOT) as process:
        for line in process.stdout:
            try:
                kind = json.loads(line).get("event")
            except (ValueError, AttributeError):  # a stray line from a library: not an event
                continue
            if kind in ("run_started", "step") and kind not in times:
                times[kind] = time.perf_counter() - launched
        code = process.wait()
    if code != 0 or "step" not in times:
        raise RunFailed(f"the cold {backend} run exited with {code} before a step event")
    return {"to_run_started_s": times["run_started"], "to_first_step_s": times["step"]}


def warm(backend: str) -> dict:
    """In-process, libraries already imported: train() call → run_started, → first step."""
    marks = {}
    called = time.perf_counter()

    def sink(event):
        if event["event"] in ("run_started", "step") and event["event"] not in marks:
            marks[event["event"]] = time.perf_counter() - called

    runs.train(RunConfig(backend=backend, **RUN), sink)
    return {"to_run_started_s": marks["run_started"], "to_first_step_s": marks["step"]}


def browser(path: str | None) -> dict:
    """The click → first loss figure from ``path``: a JSON with ``first_run_click_to_first_loss_s`` (the browser
    tests' timings) or a list ``click_to_first_loss_s`` (scripts/page_latency.py's output)."""
    if not path:
        return {"measured": False, "reason": "no --browser-times file given: not measured in this run"}
    source = Path(path)
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError) as error:
        return {"measured": False, "reason": f"--browser-times {path}: {error}"}
    first = data.get("first_run_click_to_first_loss_s")
    if first is None and isinstance(data.get("click_to_first_loss_s"), list) and data["click_to_first_loss_s"]:
        first = data["click_to_first_loss_s"][0]
    if first is None:
        return {"measured": False, "reason": f"--browser-times {path}: no click_to_first_loss_s in it"}
    return {"measured": True, "source": str(source),
            "source_modified": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(source.stat().st_mtime)),
            "click_to_first_loss_s": first, "runs": data.get("runs", []), "unit": data.get("unit", "seconds")}


def summarise(samples: list[dict]) -> dict:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]} | {"repeats": samples}


def run(quick: bool = False, threads: int = 1, browser_times: str | None = None) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("latency", quick, threads, {
        **size, "run": RUN, "model": "tiny-bert",
        "cold": "fresh `python -m gradacc train --json` subprocess: launch → first step line on stdout",
        "warm": "engine.train in-process after a warm-up run: call → first step event"})

    report.progress("warm-up run (imports, tokenizer cache)")
    warm("pytorch")
    warm_samples = {b: [] for b in BACKENDS}
    cold_samples = {b: [] for b in size["cold_backends"]}
    for repeat in range(size["repeats"]):  # interleaved, so a busy moment hits every backend alike
        for backend in BACKENDS:
            report.progress(f"repeat {repeat + 1}/{size['repeats']}: {backend}")
            warm_samples[backend].append(warm(backend))
            if backend in cold_samples:
                cold_samples[backend].append(cold(backend, threads))
    result["warm"] = {b: summarise(s) for b, s in warm_samples.items()}
    result["cold"] = {b: summarise(s) for b, s in cold_samples.items()}
    result["browser"] = browser(browser_times)
    result["notes"] = ["Seconds are this machine's, medians of the repeats."]
    skipped = [b for b in BACKENDS if b not in cold_samples]
    if skipped:
        result["notes"].append(f"Cold start not measured for {', '.join(skipped)} in --quick.")
    if not result["browser"]["measured"]:
        result["notes"].append("Browser click → first loss: " + result["browser"]["reason"] + ".")
    return report.finish(result, started)


def figure(result: dict):
    fig = go.Figure()
    for kind, name in (("cold", "fresh process (imports count)"), ("warm", "in-process, libraries loaded")):
        shown = [b for b in BACKENDS if b in result[kind]]
        values = [result[kind][b]["to_first_step_s"] for b in shown]
        fig.add_bar(name=name, x=shown, y=values, text=[f"{v:.2f} s" for v in values], textposition="outside")
    browser_result = result["browser"]
    if browser_result["measured"] and browser_result["click_to_first_loss_s"] is not None:
        value = browser_result["click_to_first_loss_s"]
        fig.add_bar(name="app in a browser: click Start → first loss point", x=["app"], y=[value],
                    text=[f"{value:.1f} s"], textposition="outside")
    fig.update_layout(title="Seconds from start to the first optimizer step (log scale)", barmode="group",
                      yaxis=dict(type="log", title="seconds"), template="plotly_white",
                      legend=dict(orientation="h", y=-0.15))
    return fig


def table(result: dict):
    headers = ["backend", "cold → run_started s", "cold → first step s", "warm → run_started s",
               "warm → first step s"]
    rows = [[b, result["cold"].get(b, {}).get("to_run_started_s"), result["cold"].get(b, {}).get("to_first_step_s"),
             result["warm"][b]["to_run_started_s"], result["warm"][b]["to_first_step_s"]] for b in BACKENDS]
    browser_result = result["browser"]
    rows.append(["browser (click → first loss)", None,
                 browser_result.get("click_to_first_loss_s") if browser_result["measured"] else "not measured",
                 None, None])
    return headers, rows
