"""``gradacc plan``: every memory lever measured on a model, and the m and k that fit a budget."""

from __future__ import annotations

import json
import shlex

from gradacc.analysis import learning_steps, planner, sharding
from gradacc.choices import OPTIMIZERS
from gradacc.cli.options import EXIT_FAILED, EXIT_OK, value
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.labels import in_cli_words
from gradacc.units import format_bytes


def add_parser(commands) -> None:
    plan = commands.add_parser("plan", help="measure every memory lever on a model and plan m and k for a budget")
    plan.add_argument("--model", default=RunConfig.model)
    plan.add_argument("--max-seq-length", type=value, default=128)
    plan.add_argument("--memory-budget-mb", type=value, required=True)
    plan.add_argument("--target-effective-batch", type=value, required=True)
    plan.add_argument("--optimizer", choices=OPTIMIZERS, default=RunConfig.optimizer,
                      help="the optimizer the run will use: the pick keeps it (another needs its own learning rate)")
    plan.add_argument("--change-optimizer", action="store_true",
                      help="let the pick use another optimizer whose learning rate the model's recipe holds "
                           "(the pick says it: pass it as --lr)")
    plan.add_argument("--processes", type=value, default=1,
                      help="also plan the pick on this many processes, per rank: replicated (DDP) and sharded (FSDP) "
                           "with each way to sync")
    plan.add_argument("--train-samples", type=value, default=RunConfig.train_samples,
                      help="training examples the run will use (default: the built-in data's "
                           f"{RunConfig.train_samples}): the pick says how many optimizer steps they give")
    plan.add_argument("--epochs", type=value, default=None,
                      help="the run's epochs (default: the model's recipe); the pick raises them where they give "
                           "fewer optimizer steps than the model needs to learn")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(run=run)


def run(args) -> int:
    RunConfig(model=args.model, max_seq_length=args.max_seq_length, train_samples=args.train_samples,
              epochs=args.epochs).check()
    if isinstance(args.memory_budget_mb, str):
        raise GradaccError(f"--memory-budget-mb must be a number; got {args.memory_budget_mb!r}.")
    planner.check_plan_inputs(float(args.memory_budget_mb), args.target_effective_batch)  # before measuring
    if isinstance(args.processes, bool) or not isinstance(args.processes, int) or args.processes < 1:
        raise GradaccError(f"--processes must be a whole number of at least 1; got {args.processes!r}.")
    measured = planner.measure_levers(args.model, args.max_seq_length)
    result = planner.plan_levers(measured, float(args.memory_budget_mb), args.target_effective_batch)
    top = planner.pick(result, args.optimizer, args.change_optimizer, model=args.model)
    steps = None if top is None else learning_steps.advise(
        args.model, args.train_samples, top["row"]["micro_batch_size"], top["row"]["grad_accum_steps"], args.epochs)
    spread = None
    if args.processes > 1:
        shown = top["row"] if top else min(result["rows"], key=lambda row: row["static_bytes"])
        spread = sharding.plan_processes(planner.measurement_of(measured, shown), float(args.memory_budget_mb),
                                         args.target_effective_batch, args.processes)
    if args.json:
        print(json.dumps(result | {"pick": top, "steps": steps, "processes": spread}, default=str))
        return EXIT_OK
    print(f"{args.model} at {args.max_seq_length} tokens, budget {result['budget_mb']:g} MB, effective batch "
          f"{result['target_effective_batch']}; fastest first (seconds per example from a short timed run)")
    print(f"{'checkpointing':<14}{'precision':<10}{'optimizer':<11}{'m':>6}{'k':>6}{'peak':>11}{'static':>11}"
          f"{'ms/example':>12}")
    for row in result["rows"]:
        print(f"{'on' if row['gradient_checkpointing'] else 'off':<14}{row['precision']:<10}{row['optimizer']:<11}"
              f"{row['micro_batch_size'] or '—':>6}{row['grad_accum_steps'] or '—':>6}"
              f"{format_bytes(row['predicted_peak_bytes']):>11}{format_bytes(row['static_bytes']):>11}"
              f"{row['seconds_per_example'] * 1000:>12.2f}")
    for name in ("fastest", "cheapest_memory"):
        row = result[name]
        if row is not None:
            print(f"{name.replace('_', ' ')}: {planner.setting_label(row)}, m={row['micro_batch_size']}, "
                  f"k={row['grad_accum_steps']}")
    if top is not None:
        row = top["row"]
        print(f"pick: {planner.setting_label(row)}, m={row['micro_batch_size']}, k={row['grad_accum_steps']}. "
              f"{top['why']}")
        print(f"steps: {steps['text']}")
        flags = ["--model", args.model, "--max-seq-length", args.max_seq_length, "--micro-batch-size",
                 row["micro_batch_size"], "--grad-accum-steps", row["grad_accum_steps"], "--epochs", steps["epochs"],
                 "--train-samples", args.train_samples]
        flags += ["--gradient-checkpointing"] if row["gradient_checkpointing"] else []
        flags += ["--precision", row["precision"]] if row["precision"] != "fp32" else []
        flags += ["--optimizer", row["optimizer"]] if row["optimizer"] != args.optimizer else []
        flags += ["--lr", f"{top['learning_rate']:g}"] if top["learning_rate"] is not None else []  # its own rate
        print(f"train it with: python -m gradacc train {shlex.join(map(str, flags))}")
    elif result["fastest"] is not None:
        unrated = planner.unrated_optimizers(result, args.optimizer, args.model)
        if args.change_optimizer and unrated:
            print(f"pick: nothing with {args.optimizer} fits; {' and '.join(unrated)} would, but {args.model}'s "
                  "recipe has no learning rate measured for it: give --lr yourself if you run one")
        else:
            print(f"pick: nothing with {args.optimizer} fits"
                  + ("" if args.change_optimizer else "; --change-optimizer lets the pick use another one"))
    if result["reason"]:
        print(in_cli_words(result["reason"], "budget_mb"))  # the page's label, the flag here
    if spread is not None:
        print_processes(spread)
    print(f"activation line checked on a micro-batch of {planner.HELD_OUT_SIZE} it was not fitted on: largest error "
          f"{result['largest_held_out_error']:+.2%}")
    return EXIT_OK if result["fastest"] else EXIT_FAILED


def print_processes(spread: dict) -> None:
    print(f"on {spread['processes']} processes, per rank:")
    print(f"{'':<36}{'m':>6}{'k':>6}{'static':>11}{'peak':>11}{'gradients sent/window':>23}")
    for name, way in spread["ways"].items():
        label = "replicated (DDP)" if name == "ddp" else f"sharded (FSDP), {name} sync"
        print(f"{label:<36}{way['micro_batch_size'] or '—':>6}{way['grad_accum_steps'] or '—':>6}"
              f"{format_bytes(way['static_bytes']):>11}{format_bytes(way['peak_bytes']):>11}"
              f"{format_bytes(way['sent_bytes']):>23}")
    print(spread["verdict"])
