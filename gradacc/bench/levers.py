"""Accumulation beside the other memory levers: peak memory and time per effective batch, as ratios to the baseline.

The shape of the transformers docs' single-GPU table (bert-large on a V100: batch 4 → 14.9 GB; batch 1 ×
accumulation 4 → 8.7 GB at 1.14× the time; + gradient checkpointing → 6.8 GB at 1.48×; + fp16 → 7.3 GB at
0.88×; + 8-bit Adam → 5.4 GB), measured on gradacc's built-in model and on all-MiniLM-L6-v2. Rows, at one
effective batch E:

    baseline          m = E, k = 1
    accumulation      m = E/4, k = 4
    + checkpointing   accumulation with gradient checkpointing (non-reentrant)
    + bf16            accumulation under bf16 autocast (fp16 needs a CUDA GPU)
    + adafactor       accumulation with Adafactor, the lightest optimizer offered (factored second moments,
                      no first moment: less state than SGD with momentum; 8-bit AdamW needs CUDA)
    combined          accumulation with all three

Each "+" row adds one lever to accumulation alone (the docs' rows add them one on top of another; "combined" is
their last row). Every row is its own model (``training.levers.LeverRig``) trained on the same examples, each
padded to max_seq_length, with the model's recipe (learning rate, dropout).

Memory: static bytes (parameters, gradients, and the state tensors the optimizer really holds after its first
step: ``measure.static_bytes``) + the activation bytes of one micro-batch (``measure.ActivationMeter``: what autograd
saves in a training-mode forward pass, under autocast and checkpointing), as a run's events report them. On CUDA
also ``torch.cuda.max_memory_allocated`` over a window, less what the other rows hold. Timed: one optimizer step
per row per round (k micro-batches forward and backward, step, zero; 5 in a row for tiny-bert, whose step is
short), wall and process CPU time, after one untimed step per row; the rounds rotate the order of the rows, and each ratio is taken against the baseline of
the same round (median [min–max] over rounds), so load drift hits every row alike.
"""

from __future__ import annotations

import statistics
import time

import torch
from plotly.subplots import make_subplots

from gradacc.bench import report
from gradacc.training.memory import measure
from gradacc.training.memory.levers import LeverRig, timed
from gradacc.training.run.engine import quiet_libraries
from gradacc.training.run.job import pick_device

LIGHT_OPTIMIZER = "adafactor"
ROWS = (("baseline", 1, {}),
        ("accumulation", 4, {}),
        ("+ checkpointing", 4, {"gradient_checkpointing": True}),
        ("+ bf16", 4, {"precision": "bf16"}),
        (f"+ {LIGHT_OPTIMIZER}", 4, {"optimizer": LIGHT_OPTIMIZER}),
        ("combined", 4, {"gradient_checkpointing": True, "precision": "bf16", "optimizer": LIGHT_OPTIMIZER}))
# (model, effective batch E, sequence length, rounds, optimizer steps timed per row per round): tiny-bert's step
# takes ~0.08 s here, so 5 of them per turn keep the timer's and the scheduler's jitter small beside it.
FULL = dict(models=(("tiny-bert", 32, 64, 15, 5), ("all-MiniLM-L6-v2", 32, 64, 7, 1)))
# Quick: big enough that activations outweigh autocast's bf16 copies of the weights (at m=2 × 16 tokens they do not).
QUICK = dict(models=(("tiny-bert", 16, 32, 2, 1),))
# The anchor, from the transformers docs (Methods and tools for efficient training on a single GPU): GB, × time.
ANCHOR = {"source": "transformers docs, single-GPU training: bert-large, V100, sequence 512",
          "rows": [("batch 4", 14.9, 1.0), ("batch 1 × accumulation 4", 8.7, 1.14),
                   ("+ gradient checkpointing", 6.8, 1.48), ("+ fp16", 7.3, 0.88), ("+ 8-bit Adam", 5.4, None)]}


def measure_model(model: str, effective_batch: int, length: int, rounds: int, steps: int, device) -> dict:
    rigs = []
    for name, k, levers in ROWS:
        report.progress(f"{model}: set up {name}")
        rig = LeverRig(model, length, levers, examples=effective_batch, device=device)
        rig.use_optimizer()
        m = effective_batch // k
        rig.window(m, k)  # untimed: the first backward allocates, the first step creates the optimizer's state
        rigs.append({"name": name, "m": m, "k": k, "levers": levers, "rig": rig,
                     "activation_bytes": rig.activation_bytes(m), "static": rig.static_bytes(),
                     "activation_bytes_by_dtype": rig.last_activation_bytes_by_dtype, "wall": [], "cpu": [],
                     "cuda_peak": []})
    on_cuda = torch.device(device).type == "cuda"
    for round_index in range(rounds):
        shift = round_index % len(rigs)
        report.progress(f"{model}: round {round_index + 1}/{rounds}")
        for row in rigs[shift:] + rigs[:shift]:
            rig = row["rig"]
            if on_cuda:
                measure.reset_cuda_peak(device)
                before = torch.cuda.memory_allocated(device)
            wall, cpu = timed(lambda: [rig.window(row["m"], row["k"]) for _ in range(steps)])
            row["wall"].append(wall / steps)
            row["cpu"].append(cpu / steps)
            if on_cuda:  # the window's growth, plus this row's own parameters and optimizer state
                row["cuda_peak"].append(measure.cuda_peak_bytes(device) - before
                                        + row["static"]["parameters"] + row["static"]["optimizer_state"])
    base = rigs[0]
    rows = []
    for row in rigs:
        peak = row["static"]["total"] + row["activation_bytes"]
        base_peak = base["static"]["total"] + base["activation_bytes"]
        rows.append({
            "row": row["name"], "micro_batch_size": row["m"], "grad_accum_steps": row["k"],
            "gradient_checkpointing": row["levers"].get("gradient_checkpointing", False),
            "precision": row["levers"].get("precision", "fp32"), "optimizer": row["levers"].get("optimizer", "adamw"),
            "static": row["static"], "activation_bytes": row["activation_bytes"],
            "activation_bytes_by_dtype": row["activation_bytes_by_dtype"], "peak_bytes": peak,
            "peak_vs_baseline": peak / base_peak,
            "activations_vs_baseline": row["activation_bytes"] / base["activation_bytes"],
            "cuda_peak_bytes": max(row["cuda_peak"]) if row["cuda_peak"] else None,
            "seconds_per_effective_batch": statistics.median(row["wall"]),
            "cpu_seconds_per_effective_batch": statistics.median(row["cpu"]),
            # Each round's time over the same round's baseline: both from the same stretch of machine time.
            "time_vs_baseline": report.spread([w / b for w, b in zip(row["wall"], base["wall"])]),
            "cpu_time_vs_baseline": report.spread([c / b for c, b in zip(row["cpu"], base["cpu"])])})
    return {"model": model, "effective_batch": effective_batch, "max_seq_length": length, "rounds": rounds,
            "steps_per_round": steps,
            "parameters": sum(p.numel() for p in base["rig"].model.parameters()), "rows": rows}


def run(quick: bool = False, threads: int = 1) -> dict:
    started = time.perf_counter()
    size = QUICK if quick else FULL
    device = pick_device()
    result = report.envelope("levers", quick, threads, {
        "models": [dict(zip(("model", "effective_batch", "max_seq_length", "rounds", "steps_per_round"), m))
                   for m in size["models"]],
        "rows": [{"row": name, "grad_accum_steps": k, **levers} for name, k, levers in ROWS],
        "light_optimizer": LIGHT_OPTIMIZER, "device": str(device),
        "memory": "static bytes (parameters, gradients, the optimizer's state tensors after its first step) + "
                  "activation bytes of one micro-batch (saved-tensor hooks), as a run's events report them",
        "timed": "steps_per_round optimizer steps (one effective batch each) per row per round, after one untimed "
                 "step; the rounds rotate the order; ratios against the baseline of the same round, median over "
                 "rounds"})
    quiet_libraries()
    result["models"] = [measure_model(*model, device) for model in size["models"]]
    result["anchor"] = ANCHOR
    goals = {}
    for measured in result["models"]:
        rows = {r["row"]: r for r in measured["rows"]}
        ratio = rows["accumulation"]["activations_vs_baseline"]
        goals[f"{measured['model']} accumulation activations"] = report.goal(
            ratio, "1/4 of the baseline's ± 0.03 (m = E/4)", abs(ratio - 0.25) <= 0.03)
        goals[f"{measured['model']} checkpointing activations"] = report.goal(
            rows["+ checkpointing"]["activations_vs_baseline"], "below accumulation's",
            rows["+ checkpointing"]["activation_bytes"] < rows["accumulation"]["activation_bytes"])
    result["goals"] = goals
    result["notes"] = [
        "On the CPU the budget of a device is not real: peak = static + activations from measured bytes; process "
        "RSS, the allocator's slack and temporary buffers are not in it." if device.type != "cuda" else
        "cuda_peak_bytes: torch.cuda.max_memory_allocated over a window, less the other rows' tensors.",
        f"Times are this machine's (threads: {threads}); the claims are the ratios to the baseline."]
    return report.finish(result, started)


def figure(result: dict):
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Peak training memory ÷ baseline (static + activations)",
                                                        "Time per effective batch ÷ baseline (median over rounds)"))
    colours = ("#1f77b4", "#ff7f0e")
    for measured, colour in zip(result["models"], colours):
        rows = measured["rows"]
        labels = [r["row"] for r in rows]
        name = f"{measured['model']} (E={measured['effective_batch']}, {measured['max_seq_length']} tokens)"
        fig.add_bar(x=labels, y=[r["peak_vs_baseline"] for r in rows], name=name, marker_color=colour,
                    legendgroup=name, text=[f"{r['peak_vs_baseline']:.2f}" for r in rows], textposition="outside",
                    row=1, col=1)
        times = [r["time_vs_baseline"] for r in rows]
        fig.add_bar(x=labels, y=[t["median"] for t in times], name=name, marker_color=colour, legendgroup=name,
                    showlegend=False, text=[f"{t['median']:.2f}" for t in times], textposition="inside",
                    error_y=dict(type="data", symmetric=False, array=[t["max"] - t["median"] for t in times],
                                 arrayminus=[t["median"] - t["min"] for t in times]), row=1, col=2)
    for col in (1, 2):
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=col)
    fig.update_yaxes(title_text="× baseline", rangemode="tozero")
    fig.update_yaxes(range=[0, 1.15], row=1, col=1)  # room for the labels above the baselines' bars
    fig.update_layout(title="Accumulation beside checkpointing, bf16 and a lighter optimizer (one run, CPU)"
                      if result["settings"]["device"] == "cpu" else
                      "Accumulation beside checkpointing, bf16 and a lighter optimizer (one run)",
                      template="plotly_white", barmode="group", legend=dict(orientation="h", y=-0.2))
    return fig


def table(result: dict):
    headers = ["model", "row", "m", "k", "static MB", "activations MB", "peak MB", "peak ×", "activations ×",
               "s / eff. batch", "time ×", "(min–max)", "CPU time ×"]
    rows = []
    for measured in result["models"]:
        for r in measured["rows"]:
            t = r["time_vs_baseline"]
            rows.append([measured["model"], r["row"], r["micro_batch_size"], r["grad_accum_steps"],
                         report.megabytes(r["static"]["total"]), report.megabytes(r["activation_bytes"]),
                         report.megabytes(r["peak_bytes"]), r["peak_vs_baseline"], r["activations_vs_baseline"],
                         r["seconds_per_effective_batch"], t["median"], f"{t['min']:.2f}–{t['max']:.2f}",
                         r["cpu_time_vs_baseline"]["median"]])
    return headers, rows
