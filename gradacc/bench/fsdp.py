"""``python -m gradacc bench fsdp``: what each way to sync a sharded (FSDP2) window costs on 2 processes, measured,
then the same quantities for real model sizes from a formula those measurements check.

For each built-in model and k ∈ {2, 4, 8}, the plain loop trains sharded over 2 ranks (torchrun, gloo on the CPU),
per-window and per-micro-batch sync taking turns run by run (the order alternating, so drift in the machine's load
hits both). Every figure comes from the runs' step events, as each rank measured it (gradacc.training.fsdp): the
gradient bytes held, the bytes handed to reduce-scatter per window, the window's seconds (the slower rank's, from
the second window on: the first carries FSDP's lazy set-up). Then ``gradacc.analysis.sharding``'s formula is
checked on every measured point and evaluated for Llama-3 1B, 8B and 70B in bf16 on 8 and 64 ranks.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots
import torch

from gradacc.analysis import sharding
from gradacc.bench import report
from gradacc.choices import GRAD_SYNCS, PER_MICRO_BATCH, PER_WINDOW
from gradacc.config import RunConfig
from gradacc.errors import RunFailed
from gradacc.events import Recorder
from gradacc.training import distributed, fsdp
from gradacc.training.run.engine import train
from gradacc.training.run.launch import free_port

PROCESSES = 2
FULL = {"models": ["tiny-bert", "tiny-gpt", "all-MiniLM-L6-v2"], "ks": [2, 4, 8], "rounds": 3, "windows": 5,
        "micro_batch_size": 4, "max_seq_length": 64}
QUICK = {"models": ["tiny-bert"], "ks": [2], "rounds": 1, "windows": 3, "micro_batch_size": 4, "max_seq_length": 32}
LAUNCH_TIMEOUT_S = 3600
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds gradacc/


def run(quick: bool = False, threads: int = 1) -> dict:
    size = QUICK if quick else FULL
    started = time.perf_counter()
    result = report.envelope("fsdp", quick, threads, {**size, "processes": PROCESSES, "backend": "pytorch",
                                                      "launcher": "torchrun, gloo"})
    report.progress(f"2 ranks through torchrun: {len(size['models'])} model(s) × k {size['ks']} × "
                    f"{size['rounds']} round(s) of both sync choices")
    measured = _launch(size, threads)
    result["points"] = [_point(model, k, measured[model]) for model in size["models"] for k in size["ks"]]
    result["formula"] = formula_check(result["points"], measured)
    result["real_sizes"] = sharding.real_sizes(grad_accum_steps=max(size["ks"]))
    worst_held = max(abs(p["grad_bytes_ratio"] - PROCESSES) / PROCESSES for p in result["points"])
    result["goals"] = {
        "gradient bytes per rank, per-window ÷ per-micro-batch ≈ P = 2": report.goal(
            max(p["grad_bytes_ratio"] for p in result["points"]), "within 1% of 2", worst_held <= 0.01),
        "bytes sent per window, per-micro-batch ÷ per-window = k": report.goal(
            max(abs(p["grad_comm_ratio"] - p["grad_accum_steps"]) for p in result["points"]), "0 off k",
            all(p["grad_comm_ratio"] == p["grad_accum_steps"] for p in result["points"])),
        "formula's largest error on the measured points": report.goal(
            result["formula"]["worst_rel_error"], "under 1%", result["formula"]["worst_rel_error"] < 0.01)}
    result["notes"] = ["bytes sent are what a rank hands to reduce-scatter; a ring puts (P−1)/P of it on the wire",
                       "time ratio: median window seconds (slower rank) per-micro-batch ÷ per-window, runs alternating "
                       "in order; its spread is the ratio of each round"]
    return report.finish(result, started)


def _launch(size: dict, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="gradacc-bench-fsdp-") as folder:
        out = Path(folder) / "ranks.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(PROCESSES),
                   "--master_port", str(free_port()), "-m", "gradacc.bench.fsdp", str(out), json.dumps(size),
                   str(threads)]
        finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=LAUNCH_TIMEOUT_S)
        if not out.exists():
            errors = [line for line in finished.stderr.splitlines() if "Error" in line or line.startswith("error")]
            raise RunFailed(f"the 2-rank launch failed (exit {finished.returncode}): "
                            f"{(errors or finished.stderr.splitlines() or ['no output'])[-1]}")
        return json.loads(out.read_text())


def _point(model: str, k: int, measured: dict) -> dict:
    runs = measured["runs"][str(k)]
    figures = {choice: runs[choice][0]["figures"] for choice in GRAD_SYNCS}  # the same every window and round
    seconds = {choice: [s for run in runs[choice] for s in run["window_s"]] for choice in GRAD_SYNCS}
    rounds = [statistics.median(each["window_s"]) / statistics.median(window["window_s"])
              for window, each in zip(runs[PER_WINDOW], runs[PER_MICRO_BATCH])]
    window, each = figures[PER_WINDOW], figures[PER_MICRO_BATCH]
    return {"model": model, "grad_accum_steps": k, "parameters": measured["shape"]["parameters"],
            "figures": figures,
            "grad_bytes_ratio": window["grad_bytes"][0] / each["grad_bytes"][0],
            "grad_peak_ratio": window["grad_peak_bytes"][0] / each["grad_peak_bytes"][0],
            "grad_comm_ratio": each["grad_comm_bytes"][0] / window["grad_comm_bytes"][0],
            "window_s": {choice: report.spread(seconds[choice]) for choice in GRAD_SYNCS},
            "time_ratio": statistics.median(seconds[PER_MICRO_BATCH]) / statistics.median(seconds[PER_WINDOW]),
            "time_ratio_rounds": rounds}


def formula_check(points: list[dict], measured: dict) -> dict:
    """The formula against every measured quantity of every rank: its relative errors, and the worst."""
    rows = []
    for point in points:
        shape = sharding.Shape(**measured[point["model"]]["shape"])
        predicted = sharding.per_rank(shape, PROCESSES, point["grad_accum_steps"])
        for choice, figures in point["figures"].items():
            for quantity in sharding.QUANTITIES:
                for rank, value in enumerate(figures[quantity]):
                    rows.append({"model": point["model"], "grad_accum_steps": point["grad_accum_steps"],
                                 "grad_sync": choice, "quantity": quantity, "rank": rank, "measured": value,
                                 "predicted": predicted[choice][quantity],
                                 "rel_error": (predicted[choice][quantity] - value) / value})
    return {"rows": rows, "points": len(rows), "worst_rel_error": max(abs(row["rel_error"]) for row in rows)}


def figure(result: dict):
    titles = ("Gradient bytes per rank<br>per-window ÷ per-micro-batch", "Bytes sent per window<br>per-micro-batch ÷ "
              "per-window", "Time per window (noisy here)<br>per-micro-batch ÷ per-window")
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.08)
    for index, model in enumerate(dict.fromkeys(p["model"] for p in result["points"])):
        points = [p for p in result["points"] if p["model"] == model]
        ks = [f"k={p['grad_accum_steps']}" for p in points]
        color = plotly.colors.qualitative.Plotly[index]
        for column, key in enumerate(("grad_bytes_ratio", "grad_comm_ratio", "time_ratio"), start=1):
            fig.add_trace(go.Bar(x=ks, y=[p[key] for p in points], name=model, legendgroup=model, marker_color=color,
                                 showlegend=column == 1), row=1, col=column)
    fig.update_layout(title="FSDP on 2 processes: per-window sync holds P× the gradients, per-micro-batch sends k× "
                            "the bytes", barmode="group", legend=dict(orientation="h", y=-0.12),
                      margin=dict(t=110))
    fig.update_annotations(font_size=13)
    return fig


def table(result: dict) -> tuple[list[str], list[list]]:
    headers = ["model", "k", "grad bytes/rank pw", "pmb", "pw÷pmb", "sent/window pw", "pmb", "pmb÷pw",
               "ms/window pw", "pmb", "pmb÷pw (rounds)"]
    rows = []
    for p in result["points"]:
        window, each = p["figures"][PER_WINDOW], p["figures"][PER_MICRO_BATCH]
        rounds = "–".join(f"{r:.2f}" for r in (min(p["time_ratio_rounds"]), max(p["time_ratio_rounds"])))
        rows.append([p["model"], p["grad_accum_steps"], window["grad_bytes"][0], each["grad_bytes"][0],
                     p["grad_bytes_ratio"], window["grad_comm_bytes"][0], each["grad_comm_bytes"][0],
                     p["grad_comm_ratio"], p["window_s"][PER_WINDOW]["median"] * 1000,
                     p["window_s"][PER_MICRO_BATCH]["median"] * 1000, f"{p['time_ratio']:.2f} ({rounds})"])
    gib = 2 ** 30
    for row in result["real_sizes"]:
        rows.append([f"Llama-3 {row['model']} bf16 (formula), P={row['processes']}", row["grad_accum_steps"],
                     f"{row['grad_bytes'][PER_WINDOW] / gib:.2f} GiB", f"{row['grad_bytes'][PER_MICRO_BATCH] / gib:.2f} GiB",
                     row["grad_bytes"][PER_WINDOW] / row["grad_bytes"][PER_MICRO_BATCH],
                     f"{row['sent_bytes'][PER_WINDOW] / gib:.2f} GiB", f"{row['sent_bytes'][PER_MICRO_BATCH] / gib:.2f} GiB",
                     row["sent_bytes"][PER_MICRO_BATCH] / row["sent_bytes"][PER_WINDOW], None, None, None])
    return headers, rows


# ---- each rank, under torchrun ------------------------------------------------------------------------

def _rank_main(out: str, size: dict, threads: int) -> None:
    torch.set_num_threads(threads)
    measured = {}
    for model in size["models"]:
        shape = {}
        measured[model] = {"runs": {}}
        for k in size["ks"]:
            runs = {choice: [] for choice in GRAD_SYNCS}
            windows = size["windows"]
            for round_ in range(size["rounds"]):
                for choice in (GRAD_SYNCS if round_ % 2 == 0 else GRAD_SYNCS[::-1]):
                    config = RunConfig(model=model, fsdp=True, grad_sync=choice, num_processes=PROCESSES,
                                       micro_batch_size=size["micro_batch_size"], grad_accum_steps=k,
                                       max_seq_length=size["max_seq_length"], dropout=0.0, epochs=1,
                                       max_steps=windows, eval_samples=8,
                                       train_samples=windows * size["micro_batch_size"] * k * PROCESSES)
                    recorder = Recorder()
                    ended = train(config, recorder, before_optimizer_step=lambda sharded: shape.update(
                        fsdp.group_sizes(sharded)) if not shape else None)
                    if ended["status"] != "completed":
                        raise RuntimeError(f"{model} k={k} {choice}: {ended['reason']}")
                    steps = [s["sharding"] for s in recorder.of("step")][1:]  # the first carries lazy set-up
                    runs[choice].append({"figures": {q: steps[0][q] for q in sharding.QUANTITIES},
                                         "window_s": [max(s["window_s"]) for s in steps]})
            measured[model]["runs"][str(k)] = runs
        measured[model]["shape"] = {name: shape[name] for name in ("parameters", "largest_group", "first_reduced",
                                                                           "root")}
    if distributed.is_main_process():
        Path(out).write_text(json.dumps(measured), encoding="utf-8")
    distributed.exit_rank(0)


if __name__ == "__main__":
    _rank_main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
