"""What gradacc's instrumentation costs, and what each backend costs against a bare PyTorch loop.

Per backend, three variants train the same model on the same data in the same order:

- ``instrumented``: ``instrument=True`` (activation hooks on the first micro-batch of each window, RSS
  at each step) and a sink doing what the app does (keep each event, serialise it to JSON);
- ``plain``: ``instrument=False`` and a sink that does nothing;
- ``reference``: a few lines of plain PyTorch on the Job that ``gradacc.training.run.job.prepare`` builds.

The three run in three processes in lockstep (see ``lockstep``): one optimizer step each, in turn, in a
rotating order, so step i of every variant meets the same machine; which process runs which variant
rotates from round to round. What is timed is each optimizer step, from the go to the next step event:
forward/backward of its k micro-batches, clipping, the optimizer and scheduler steps, the step report
and the sink's work. Imports, model building, Trainer/Accelerator set-up, step 1 (lazy initialisation)
and the evaluation are outside. Two clocks: process CPU time (the
work; the claim) and wall time. A round is one run of every variant and backend; its ratio is the median
over steps of the paired per-step ratios; the report gives the median and spread over rounds.

The probes are also timed apart (``component_costs``), so a gap can be put down to its parts.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
import timeit

from plotly.subplots import make_subplots
import torch
from torch.utils.data import DataLoader

from gradacc import events
from gradacc.bench import lockstep, report, runs
from gradacc.choices import BACKENDS
from gradacc.config import RunConfig
from gradacc.training.memory import measure
from gradacc.training.run.engine import quiet_libraries
from gradacc.training.run.job import prepare

FULL = dict(micro_batch_size=8, grad_accum_steps=4, steps=40, rounds=15, warmup_steps=3, max_seq_length=64,
            probe_repeats=200)
QUICK = dict(micro_batch_size=4, grad_accum_steps=2, steps=4, rounds=2, warmup_steps=0, max_seq_length=32,
             probe_repeats=10)
VARIANTS = ("instrumented", "plain", "reference")
CLOCKS = ("cpu", "wall")
GOAL = 0.97
# Imported once by the process the workers are forked from.
PRELOAD = ["gradacc.training.run.engine", "gradacc.training.backends.pytorch_loop", "gradacc.training.backends.accelerate_loop",
           "gradacc.training.backends.trainer_loop"]


def config_for(backend: str, size: dict, instrument: bool, steps: int) -> RunConfig:
    m, k = size["micro_batch_size"], size["grad_accum_steps"]
    return RunConfig(backend=backend, micro_batch_size=m, grad_accum_steps=k, epochs=1, max_steps=steps,
                     train_samples=m * k * steps, eval_samples=8, max_seq_length=size["max_seq_length"],
                     instrument=instrument)


def plan(size: dict) -> list[tuple[str, int, int]]:
    """The runs, in order: (backend, steps, shift); a short warm-up run of each backend first. Process i
    runs variant ``VARIANTS[(i + shift) % 3]``: the variants change processes from round to round, so a
    process that happens to be slower (its core, its memory) does not always weigh on the same variant."""
    runs_ = [(b, size["warmup_steps"], 0) for b in BACKENDS] if size["warmup_steps"] else []
    for round_index in range(size["rounds"]):
        order = round_index % len(BACKENDS)
        runs_ += [(b, size["steps"], round_index % len(VARIANTS)) for b in BACKENDS[order:] + BACKENDS[:order]]
    return runs_


def variant_of(process: int, shift: int) -> str:
    return VARIANTS[(process + shift) % len(VARIANTS)]


def worker(clock: lockstep.StepClock, process: int, size: dict, threads: int) -> dict:
    """One process: every run of the plan, stepping when the coordinator says so; what each run recorded (its step
    events and their memory figures). Process 0 then times the probes apart (everything is imported there already)."""
    torch.set_num_threads(threads)
    quiet_libraries()
    recorded = []
    for index, (backend, steps, shift) in enumerate(plan(size)):
        variant = variant_of(process, shift)
        tally = {"run": index, "backend": backend, "variant": variant, "steps": 0, "activation_bytes": 0,
                 "rss_bytes": 0}
        if variant == "reference":
            def on_step(tally=tally):
                tally["steps"] += 1
                clock.on_step()

            reference_loop(config_for(backend, size, instrument=False, steps=steps), on_step)
        else:
            app = runs.AppSink() if variant == "instrumented" else None

            def sink(event, app=app, tally=tally):
                if event["event"] == events.STEP:
                    clock.on_step()
                    tally["steps"] += 1
                    tally["activation_bytes"] += event["activation_bytes"] is not None
                    tally["rss_bytes"] += event["rss_bytes"] is not None
                if app is not None:  # after the go: the app's work is timed with the next step
                    app(event)

            runs.train(config_for(backend, size, instrument=variant == "instrumented", steps=steps), sink)
        clock.run_done()
        recorded.append(tally)
    return {"recorded": recorded, "costs": component_costs(size, size["probe_repeats"]) if process == 0 else None}


def recorded_by_round(outcomes: dict, size: dict) -> dict:
    """{backend: {variant: {"steps": [...], "activation_bytes": [...], "rss_bytes": [...]}}}, one entry per round:
    how many step events (the reference: steps) each variant's run had, and how many carried each memory figure."""
    warm_ups = len(BACKENDS) if size["warmup_steps"] else 0
    out = {b: {v: {"steps": [], "activation_bytes": [], "rss_bytes": []} for v in VARIANTS} for b in BACKENDS}
    runs_ = [run for outcome in outcomes.values() for run in outcome["recorded"] if run["run"] >= warm_ups]
    for run in sorted(runs_, key=lambda run: run["run"]):
        for figure in ("steps", "activation_bytes", "rss_bytes"):
            out[run["backend"]][run["variant"]][figure].append(run[figure])
    return out


def reference_loop(config: RunConfig, on_step) -> None:
    """The bare loop: forward, weighted loss, backward; every k micro-batches clip, step, schedule, zero."""
    job = prepare(config.check(), lambda event: None, threading.Event())
    config = job.config  # checked: the recipe's learning rate and warm-up filled in
    model, k = job.model, config.grad_accum_steps
    model.train()
    loader = DataLoader(job.train_examples, batch_size=config.micro_batch_size, collate_fn=job.collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    total, warmup = job.total_steps, math.ceil(config.warmup_ratio * job.total_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, then linear decay to 0
        optimizer, lambda s: s / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    steps = 0
    for index, batch in enumerate(loader):
        batch = {key: value.to(job.device) for key, value in batch.items()}
        loss = model(**batch).loss * (job.batch_items[index] / job.window_items[index])
        loss.backward()
        if (index + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            steps += 1
            on_step()
            if steps == total:
                break


def component_costs(size: dict, repeats: int) -> dict:
    """CPU seconds of each probe, measured apart: the hooked forward's extra (paired with an un-hooked
    forward+backward of the same micro-batch, alternating), one RSS read, one step event to JSON."""
    config = config_for("pytorch", size, instrument=True, steps=size["steps"])
    job = prepare(config.check(), lambda event: None, threading.Event())
    model = job.model
    model.train()
    batch = {key: value.to(job.device) for key, value in
             job.collate(job.train_examples[:config.micro_batch_size]).items()}
    meter = measure.ActivationMeter(model)

    def forward_backward(hooked: bool) -> float:
        started = time.process_time()
        with meter.measure() if hooked else contextlib.nullcontext():
            loss = model(**batch).loss
        loss.backward()
        model.zero_grad()
        return time.process_time() - started

    for hooked in (False, True, False, True):  # warm-up
        forward_backward(hooked)
    plain, hooked = [], []
    for index in range(repeats):
        order = (False, True) if index % 2 == 0 else (True, False)
        for flag in order:
            (hooked if flag else plain).append(forward_backward(flag))
    step = events.step(step=1, epoch=1, samples_seen=32, tokens_seen=512, micro_batches=4, loss=0.69, grad_norm=1.0,
                       lr=1e-3, elapsed_s=1.0, memory=measure.snapshot(1000, job.device))
    number = 2000
    return {"forward_backward_s": statistics.median(plain),
            "hook_extra_s": statistics.median(h - p for h, p in zip(hooked, plain)),
            "rss_read_s": timeit.timeit(measure.rss_bytes, number=number, timer=time.process_time) / number,
            "event_json_s": timeit.timeit(lambda: events.to_json(step), number=number,
                                          timer=time.process_time) / number,
            "repeats": repeats}


def paired(times: dict, clock: int, numerator: str, denominator: str) -> float:
    """Steps/s of ``numerator`` ÷ steps/s of ``denominator``: the median over steps i of the inverse
    ratio of their step-i times (step i of both ran on the same data, moments apart)."""
    return statistics.median(d[clock] / n[clock] for n, d in zip(times[numerator], times[denominator]))


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    result = report.envelope("overhead", quick, threads, {
        **size, "effective_batch": size["micro_batch_size"] * size["grad_accum_steps"], "model": "tiny-bert",
        "timed": "each optimizer step from go to its step event, the three variants in lockstep in three "
                 "processes (no imports, set-up, step 1 or eval); process CPU time (headline) and wall time",
        "instrumented_sink": "keep each event and json-serialise it (what the app does, minus SQLite)",
        "plain_sink": "none (instrument=False)", "reference": "bare PyTorch loop on the same prepared Job"})

    report.progress(f"starting {len(VARIANTS)} processes, one per variant")
    rounds = {b: [] for b in BACKENDS}  # per backend: each round's step times by variant
    with lockstep.Lockstep(len(VARIANTS), worker, (size, threads), preload=PRELOAD) as coordinator:
        for index, (backend, steps, shift) in enumerate(plan(size)):
            warm_up = index < len(BACKENDS) and size["warmup_steps"]
            report.progress(f"{'warm-up' if warm_up else 'round'}: {backend}, {steps} steps in lockstep")
            times = coordinator.run(steps)
            if not warm_up:
                rounds[backend].append({variant_of(p, shift): t for p, t in times.items()})
        report.progress("probe costs, measured apart")
        outcomes = coordinator.results()
    costs = outcomes[0]["costs"]
    result["recorded"] = recorded_by_round(outcomes, size)

    result["steps_per_s"] = {}
    for c, clock in enumerate(CLOCKS):
        result["steps_per_s"][clock] = {b: {v: report.spread([1 / statistics.median(t[c] for t in r[v])
                                                              for r in rounds[b]]) for v in VARIANTS}
                                        for b in BACKENDS}
    for backend in BACKENDS:
        result[backend] = {clock: {
            "instrumented_vs_plain": report.spread([paired(r, c, "instrumented", "plain") for r in rounds[backend]]),
            "backend_vs_reference": report.spread([paired(r, c, "plain", "reference") for r in rounds[backend]]),
            "instrumented_vs_reference": report.spread([paired(r, c, "instrumented", "reference")
                                                        for r in rounds[backend]]),
        } for c, clock in enumerate(CLOCKS)}
        result[backend].update(result[backend]["cpu"])  # the headline keys: CPU-time ratios

    # One hooked forward per window, one RSS read and one serialised step event per optimizer step.
    costs["per_step_s"] = costs["hook_extra_s"] + costs["rss_read_s"] + costs["event_json_s"]
    costs["predicted_instrumented_vs_plain"] = {
        b: 1 / (1 + costs["per_step_s"] * result["steps_per_s"]["cpu"][b]["plain"]["median"]) for b in BACKENDS}
    result["probe_costs"] = costs
    result["goals"] = {f"{b} instrumented/plain": report.goal(result[b]["instrumented_vs_plain"]["median"],
                                                              f">= {GOAL} (CPU time)",
                                                              result[b]["instrumented_vs_plain"]["median"] >= GOAL)
                       for b in BACKENDS}
    result["notes"] = [
        f"Probes measured apart: the activation hook adds {costs['hook_extra_s'] * 1e3:.3f} ms to a "
        f"{costs['forward_backward_s'] * 1e3:.2f} ms forward+backward (once per window of k), an RSS read "
        f"{costs['rss_read_s'] * 1e6:.0f} µs, a step event to JSON {costs['event_json_s'] * 1e6:.0f} µs: "
        f"{costs['per_step_s'] * 1e3:.3f} ms per optimizer step.",
        "instrumented_vs_plain is gradacc's own cost (hooks, RSS reads, event serialisation); "
        "backend_vs_reference of the pytorch backend is gradacc's loop scaffolding (reporting, loss.item, "
        "finite checks); the rest of accelerate's and trainer's backend_vs_reference is the library's.",
        "Absolute steps/s are this machine's; the claims are the ratios.",
    ]
    return report.finish(result, started)


def figure(result: dict):
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=(
        "by process CPU time (the claim)", "by wall time (includes other processes' load)"))
    for col, clock in enumerate(CLOCKS, start=1):
        for key, name, color in (("instrumented_vs_plain", "instrumented ÷ un-instrumented", "#636efa"),
                                 ("backend_vs_reference", "backend (un-instrumented) ÷ bare PyTorch loop", "#ef553b")):
            xs = [b for b in BACKENDS for _ in result[b][clock][key]["values"]]
            ys = [v for b in BACKENDS for v in result[b][clock][key]["values"]]
            # A box per backend: median, quartiles and every round as a point: the spread is the message.
            fig.add_box(x=xs, y=ys, name=name, marker_color=color, boxpoints="all", jitter=0.4, pointpos=0,
                        showlegend=col == 1, legendgroup=key, row=1, col=col)
        fig.add_hline(y=GOAL, line_dash="dash", line_color="gray", row=1, col=col)
        fig.add_hline(y=1.0, line_color="lightgray", row=1, col=col)
    fig.update_yaxes(title_text="ratio of optimizer steps/s (one point per round)", row=1, col=1)
    rounds = result["settings"]["rounds"]
    fig.update_layout(title=f"Steps/s ratios over {rounds} interleaved rounds (dashed: goal {GOAL})",
                      boxmode="group", template="plotly_white", legend=dict(orientation="h", y=-0.15))
    return fig


def table(result: dict):
    headers = ["backend", "clock", "instrumented/plain", "(min–max)", "backend/reference", "(min–max)",
               "steps/s instr.", "plain", "reference"]
    rows = []
    for b in BACKENDS:
        for clock in CLOCKS:
            ip, br = result[b][clock]["instrumented_vs_plain"], result[b][clock]["backend_vs_reference"]
            sps = result["steps_per_s"][clock][b]
            rows.append([b, clock, ip["median"], f"{ip['min']:.3f}–{ip['max']:.3f}", br["median"],
                         f"{br['min']:.3f}–{br['max']:.3f}", sps["instrumented"]["median"], sps["plain"]["median"],
                         sps["reference"]["median"]])
    return headers, rows
