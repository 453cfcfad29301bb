"""``gradacc check``: the accumulated gradient against the full-batch gradient, naive ÷k and exact."""

from __future__ import annotations

import json

from gradacc import paths
from gradacc.analysis import equivalence
from gradacc.analysis.contrastive import WAY_NAMES, explanation
from gradacc.choices import GRAD_SYNCS
from gradacc.cli.options import EXIT_OK, add_run_options, config_from_args
from gradacc.training import distributed
from gradacc.training.tasks import task_named
from gradacc.units import format_bytes


def add_parser(commands) -> None:
    check = commands.add_parser("check", help="gradient equivalence: naive vs exact normalisation")
    add_run_options(check)
    check.add_argument("--samples", type=int, default=None, help="examples in the window (default m×k×processes)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(run=run)


def run(args) -> int:
    config = config_from_args(args)  # under accelerate launch / torchrun: the check runs on every rank
    # The command line trusts its user: a model folder anywhere they can read (the app confines its visitors).
    report = equivalence.check(config, samples=args.samples, confinement=paths.TRUST_USER)
    if not distributed.is_main_process():
        return EXIT_OK
    if args.json:
        print(json.dumps(report))
        return EXIT_OK
    if task_named(report.get("task")).in_batch_negatives:
        return print_contrastive_check(report)
    processes = report["num_processes"]
    print(f"{report['backend']}: micro-batch {report['micro_batch_size']}, k={report['grad_accum_steps']}"
          + (f", {processes} processes" if processes > 1 else "")
          + "; relative error of the accumulated gradient against the full-batch gradient")
    print(f"{'case':<20}{'items per micro-batch':<26}{'naive':>11}{'exact':>11}")
    for case, result in report["cases"].items():
        items = ",".join(str(i) for i in result["micro_batch_items"])
        print(f"{case:<20}{items:<26}{result['naive_rel_error']:>11.2e}{result['exact_rel_error']:>11.2e}"
              + (f"   library default {result['library_default_rel_error']:.2e}"
                 if "library_default_rel_error" in result else ""))
    if "grad_sync" in report:
        print_grad_sync(report["grad_sync"], report["grad_accum_steps"])
    elif processes > 1:
        rounds = report["sync_rounds"]
        print(f"gradient all-reduces per optimizer step (steps 1, 2; k={report['grad_accum_steps']}): "
              f"{', '.join(map(str, rounds['no_sync']))} with no_sync, "
              f"{', '.join(map(str, rounds['without_no_sync']))} without; exact error "
              f"{rounds['no_sync_rel_error']:.2e} and {rounds['without_no_sync_rel_error']:.2e}")
        print("(DDP all-reduces every gradient in one bucket until its first sync, then rebuilds its buckets)")
    if "by_micro_batch" in report:
        print(f"{report['model']}, exact normalisation, the same effective batch "
              f"{report['micro_batch_size'] * report['grad_accum_steps']} split into micro-batches of m:")
        for row in report["by_micro_batch"]:
            print(f"  m={row['micro_batch_size']:<4} k={row['grad_accum_steps']:<4} relative error {row['rel_error']:.2e}")
        if report["model"] == "bow-batchnorm":
            print("BatchNorm normalises with each micro-batch's own statistics: accumulation is not the big batch "
                  "(k=1 is the big batch itself).")
    return EXIT_OK


def print_grad_sync(comparison: dict, grad_accum_steps: int) -> None:
    """A sharded run's two sync choices: the same gradient, per rank the gradient bytes held and sent."""
    print(f"sharded (FSDP), k={grad_accum_steps}: both ways to sync give the full-batch gradient; what each rank held "
          "and handed to reduce-scatter per window:")
    print(f"{'gradient sync':<18}{'exact error':>12}{'gradient bytes held per rank':>34}{'bytes sent per rank':>30}")
    for choice in GRAD_SYNCS:
        row = comparison[choice]
        held = ", ".join(format_bytes(b) for b in row["grad_bytes"])
        sent = ", ".join(format_bytes(b) for b in row["grad_comm_bytes"])
        print(f"{choice:<18}{row['rel_error']:>12.2e}{held:>34}{sent:>30}")
    held = ", ".join(f"{r:.3f}" for r in comparison["grad_bytes_ratio"])
    sent = ", ".join(f"{r:.3f}" for r in comparison["grad_comm_ratio"])
    print(f"gradient bytes held, per-window ÷ per-micro-batch: {held} (the processes: sharding undone); bytes sent, "
          f"per-micro-batch ÷ per-window: {sent} (k)")


def print_contrastive_check(report: dict) -> int:
    print(f"{report['backend']}, {report['model']}: in-batch negatives at effective batch {report['effective_batch']}; "
          "relative error of each way's gradient against the batch's, and its activations")
    print(f"{'way':<50}{'m':>5}{'k':>5}{'mini':>6}{'rel. error':>12}{'activations':>14}")
    for name, way in report["ways"].items():
        mini = way["gradcache_mini_batch"] or "-"
        shown = format_bytes(way["activation_bytes"]) if way["activation_bytes"] is not None else "-"
        print(f"{WAY_NAMES[name]:<50}{way['micro_batch_size']:>5}{way['grad_accum_steps']:>5}{mini!s:>6}"
              f"{way['rel_error']:>12.2e}{shown:>14}")
    for sentence in explanation(report):
        print(sentence)
    return EXIT_OK
