"""What gradacc.audit costs a user's run: the audit's own seconds against one window's forward+backward.

A stock ``transformers.Trainer`` (no ``compute_loss_func``: the #47688 case) on tiny-bert, and in the full run
also on all-MiniLM-L6-v2 (22M parameters), trains ``steps`` optimizer steps with the audit callback and,
paired in the same round, without it. A timing callback clocks each window from ``on_step_begin`` to
``on_pre_optimizer_step`` (its k forwards and backwards, and the clipping). The same models also train in a plain
PyTorch loop (``loss = model(**batch).loss / k``, with ``audit_loop`` or without), its windows clocked from the
window's first forward to just before ``optimizer.step()``, where the audit judges. Three figures, each over the median
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
import torch
from transformers import TrainerCallback

from gradacc.analysis.stock_audit import audit_stock_trainer, stock_collator, stock_examples
from gradacc.audit import audit_loop
from gradacc.bench import report
from gradacc.config import RunConfig
from gradacc.training.run.engine import quiet_libraries
from gradacc.training import tasks
from gradacc.training.sources import data, models
from gradacc.training.tasks import TASKS

# Per model: optimizer steps per run and rounds (even: each of with/without goes first equally often).
FULL = dict(micro_batch_size=8, grad_accum_steps=4, max_seq_length=64,
            models={"tiny-bert": dict(steps=8, rounds=6), "all-MiniLM-L6-v2": dict(steps=5, rounds=4)})
QUICK = dict(micro_batch_size=4, grad_accum_steps=2, max_seq_length=32, models={"tiny-bert": dict(steps=3, rounds=2)})
MODES = {"dropout on": 0.1, "dropout off": 0.0}
WAYS = ("trainer", "plain loop")  # the plain loop with dropout on only: the replay is the same either way
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


def measure_loop(config: RunConfig, steps: int, audited: bool) -> dict:
    """A plain loop over the same model and data as the Trainer's run (the stock examples and collator)."""
    config = config.check()
    config = config.replace(task=models.infer_task(config))
    m, k = config.micro_batch_size, config.grad_accum_steps
    config = config.replace(train_samples=m * k * steps, eval_samples=8)
    text = data.load_text_data(config, None, labelled=TASKS[config.task].labelled)
    loaded = tasks.load_model(config, text.num_labels, text.label_names)
    collate = stock_collator(loaded.tokenizer, config.task)
    examples = stock_examples(loaded.tokenizer, text.train_texts, text.train_labels, config.max_seq_length)
    batches = [collate(examples[i:i + m]) for i in range(0, len(examples), m)]
    torch.manual_seed(config.seed)
    model = loaded.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    audit = audit_loop(model, optimizer) if audited else None
    windows, step_seconds = [], []
    for window in range(steps):
        began = time.perf_counter()
        for batch in batches[window * k:(window + 1) * k]:
            (model(**batch).loss / k).backward()
        windows.append(time.perf_counter() - began)
        optimizer.step()
        optimizer.zero_grad()
        step_seconds.append(time.perf_counter() - began)
    verdict = audit.verdict if audit else None
    window, step = statistics.median(windows[1:]), statistics.median(step_seconds[1:])
    return {"audit_seconds": verdict.audit_seconds if verdict else None,
            "reference_seconds": verdict.reference_seconds if verdict else None, "window_s": window,
            "first_step_extra_s": step_seconds[0] - step, "audits": 1 if verdict else 0,
            "reference": verdict.replay if verdict else None, "gradient": verdict.gradient if verdict else None}


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("audit", quick, threads, {**size, "trainer": "stock, no compute_loss_func",
                                                        "modes": MODES})
    quiet_libraries()
    rows = []
    cases = [(m, d, way) for m in size["models"].items() for way in WAYS for d in MODES.items()
             if way == "trainer" or d[0] == "dropout on"]
    for (model, runs_of), (mode, dropout), way in cases:
        steps, rounds = runs_of["steps"], runs_of["rounds"]
        timed = measure if way == "trainer" else measure_loop
        config = RunConfig(model=model, micro_batch_size=size["micro_batch_size"],
                           grad_accum_steps=size["grad_accum_steps"], max_seq_length=size["max_seq_length"],
                           dropout=dropout)
        audit_ratios, reference_ratios, extra_ratios, windows, audits = [], [], [], [], set()
        timed(config, 2, audited=False)  # warm-up: the first run of a mode pays for new shapes
        for round_index in range(rounds):
            report.progress(f"{model}, {way}, {mode}: round {round_index + 1} of {rounds}")
            # Which goes first alternates (an even number of rounds: each first equally often).
            order = (True, False) if round_index % 2 == 0 else (False, True)
            runs = {audited: timed(config, steps, audited) for audited in order}
            with_audit, without = runs[True], runs[False]
            audit_ratios.append(with_audit["audit_seconds"] / with_audit["window_s"])
            reference_ratios.append(with_audit["reference_seconds"] / with_audit["window_s"])
            extra_ratios.append((with_audit["first_step_extra_s"] - without["first_step_extra_s"])
                                / without["window_s"])
            windows.append(without["window_s"])
            audits.add(with_audit["audits"])
            reference, gradient = with_audit["reference"], with_audit["gradient"]
        rows.append({"model": model, "way": way, "mode": mode, "reference": reference, "gradient": gradient,
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
        figure.add_trace(go.Bar(x=[f"{r['model']}<br>{r.get('way', 'trainer')}, {r['mode']}" for r in rows],
                                y=[r[key]["median"] for r in rows], name=name))
    figure.add_hline(y=GOAL, line_dash="dash", annotation_text="one window's forward+backward")
    settings = result["settings"]
    figure.update_layout(title=f"gradacc.audit's cost, once per run (stock Trainer and a plain loop, "
                               f"m={settings['micro_batch_size']}, k={settings['grad_accum_steps']})",
                         yaxis_title="× one window", barmode="group")
    return figure


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["model", "way", "dropout", "verdict", "window s", "its forward+backward ÷ window", "audit ÷ window (median)",
               "min–max", "first step's extra ÷ window", "audits per run"]
    rows = [[r["model"], r.get("way", "trainer"), r["mode"], r["gradient"], r["window_s"], r["reference_vs_window"]["median"],
             r["audit_vs_window"]["median"],
             f"{r['audit_vs_window']['min']:.2f}–{r['audit_vs_window']['max']:.2f}",
             r["first_step_extra_vs_window"]["median"], ",".join(map(str, r["audits_per_run"]))]
            for r in result["rows"]]
    return headers, rows
