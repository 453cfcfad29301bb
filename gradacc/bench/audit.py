"""What gradacc.audit costs a user's run: the audit's own seconds against one window's forward+backward.

A stock ``transformers.Trainer`` (no ``compute_loss_func``: the #47688 case) on tiny-bert, and in the full run
also on all-MiniLM-L6-v2 (22M parameters), trains ``steps`` optimizer steps with the audit callback and,
paired in the same round, without it. A timing callback clocks each window from ``on_step_begin`` to
``on_pre_optimizer_step`` (its k forwards and backwards, and the clipping). Three figures, each over the median
window of the same run (windows 2..steps; the first pays the lazy initialisation):

- ``forward+backward ÷ window``: the reference's own pass(es) over the window;
- ``audit ÷ window``: all the audit's seconds (the reference, the comparison over every parameter, the
  verdict) — the claim, ≤ 1;
- ``first step's extra ÷ window``: how much longer step 1 took than the median step in the audited run, minus
  the same in the run without it — everything the audit adds (its counters too), measured side by side.

The reference replays each micro-batch from the random state the run used for it, with dropout on and off alike; both
are measured (dropout on draws the masks again). The audit runs once per run: each audited run's log history holds
exactly one ``gradacc_audit`` entry.
"""

from __future__ import annotations

import statistics
import time

import plotly.graph_objects as go
from transformers import TrainerCallback

from gradacc.analysis.stock_audit import audit_stock_trainer
from gradacc.bench import report
from gradacc.config import RunConfig
from gradacc.training.run.engine import quiet_libraries

# Per model: optimizer steps per run and rounds (even: each of with/without goes first equally often).
FULL = dict(micro_batch_size=8, grad_accum_steps=4, max_seq_length=64,
            models={"tiny-bert": dict(steps=8, rounds=6), "all-MiniLM-L6-v2": dict(steps=5, rounds=4)})
QUICK = dict(micro_batch_size=4, grad_accum_steps=2, max_seq_length=32, models={"tiny-bert": dict(steps=3, rounds=2)})
MODES = {"dropout on": 0.1, "dropout off": 0.0}
GOAL = 1.0


class WindowTimer(TrainerCallback):
    """Seconds of each window's forward+backward, and of each whole optimizer step."""

    def __init__(self):
        self.windows, self.steps, self.audits = [], [], 0
        self._began = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._began = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # Before the audit's own callback: on step 1 the audit measures after this; windows 2.. are clean anyway.
        self.windows.append(time.perf_counter() - self._began)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.perf_counter() - self._began)
        self.audits = sum("gradacc_audit" in entry for entry in state.log_history)


def measure(config: RunConfig, steps: int, audited: bool) -> dict:
    timer = WindowTimer()
    verdict = audit_stock_trainer(config, steps=steps, callbacks=[timer], audited=audited)
    window = statistics.median(timer.windows[1:])
    step = statistics.median(timer.steps[1:])
    return {"audit_seconds": verdict.audit_seconds if verdict else None,
            "reference_seconds": verdict.reference_seconds if verdict else None, "window_s": window,
            "first_step_extra_s": timer.steps[0] - step, "audits": timer.audits,
            "reference": verdict.replay if verdict else None, "gradient": verdict.gradient if verdict else None}


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("audit", quick, threads, {**size, "trainer": "stock, no compute_loss_func",
                                                        "modes": MODES})
    quiet_libraries()
    rows = []
    for (model, runs_of), (mode, dropout) in ((m, d) for m in size["models"].items() for d in MODES.items()):
        steps, rounds = runs_of["steps"], runs_of["rounds"]
        config = RunConfig(model=model, micro_batch_size=size["micro_batch_size"],
                           grad_accum_steps=size["grad_accum_steps"], max_seq_length=size["max_seq_length"],
                           dropout=dropout)
        audit_ratios, reference_ratios, extra_ratios, windows, audits = [], [], [], [], set()
        measure(config, 2, audited=False)  # warm-up: the first run of a mode pays for new shapes
        for round_index in range(rounds):
            report.progress(f"{model}, {mode}: round {round_index + 1} of {rounds}")
            # Which goes first alternates (an even number of rounds: each first equally often).
            order = (True, False) if round_index % 2 == 0 else (False, True)
            runs = {audited: measure(config, steps, audited) for audited in order}
            with_audit, without = runs[True], runs[False]
            audit_ratios.append(with_audit["audit_seconds"] / with_audit["window_s"])
            reference_ratios.append(with_audit["reference_seconds"] / with_audit["window_s"])
            extra_ratios.append((with_audit["first_step_extra_s"] - without["first_step_extra_s"])
                                / without["window_s"])
            windows.append(without["window_s"])
            audits.add(with_audit["audits"])
            reference, gradient = with_audit["reference"], with_audit["gradient"]
        rows.append({"model": model, "mode": mode, "reference": reference, "gradient": gradient,
                     "window_s": round(statistics.median(windows), 4), "audit_vs_window": report.spread(audit_ratios),
                     "reference_vs_window": report.spread(reference_ratios),
                     "first_step_extra_vs_window": report.spread(extra_ratios), "audits_per_run": sorted(audits)})
    once = all(row["audits_per_run"] == [1] for row in rows)
    worst_pass = max(row["reference_vs_window"]["median"] for row in rows)
    worst_audit = max(row["audit_vs_window"]["median"] for row in rows)
    result["rows"] = rows
    result["goals"] = {
        "the reference's forward+backward ÷ one window's (worst row, median), once per run": report.goal(
            round(worst_pass, 3), f"≤ {GOAL}", worst_pass <= GOAL and once),
        "the whole audit ÷ one window's forward+backward (worst row, median), once per run": report.goal(
            round(worst_audit, 3), f"≤ {GOAL}", worst_audit <= GOAL and once)}
    result["notes"] = ["windows timed from on_step_begin to on_pre_optimizer_step; the first window is left out "
                       "(lazy initialisation); the ratios are per round, then the median over rounds"]
    return report.finish(result, started)


def figure(result: dict):
    rows = result["rows"]
    figure = go.Figure()
    for key, name in (("reference_vs_window", "its forward+backward ÷ window"), ("audit_vs_window", "audit ÷ window"),
                      ("first_step_extra_vs_window",
                                                             "first step's extra ÷ window (paired)")):
        figure.add_trace(go.Bar(x=[f"{r['model']}<br>{r['mode']}" for r in rows], y=[r[key]["median"] for r in rows],
                                name=name))
    figure.add_hline(y=GOAL, line_dash="dash", annotation_text="one window's forward+backward")
    settings = result["settings"]
    figure.update_layout(title=f"gradacc.audit's cost, once per run (stock Trainer, m={settings['micro_batch_size']}, "
                               f"k={settings['grad_accum_steps']})", yaxis_title="× one window", barmode="group")
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["model", "dropout", "verdict", "window s", "its forward+backward ÷ window", "audit ÷ window (median)",
               "min–max", "first step's extra ÷ window", "audits per run"]
    rows = [[r["model"], r["mode"], r["gradient"], r["window_s"], r["reference_vs_window"]["median"],
             r["audit_vs_window"]["median"],
             f"{r['audit_vs_window']['min']:.2f}–{r['audit_vs_window']['max']:.2f}",
             r["first_step_extra_vs_window"]["median"], ",".join(map(str, r["audits_per_run"]))]
            for r in result["rows"]]
    return headers, rows
