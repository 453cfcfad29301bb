"""``gradacc plan``: every memory lever measured on a model, and the m and k that fit a budget."""

from __future__ import annotations

import json
import shlex

from pathlib import Path

from gradacc import paths
from gradacc.analysis import config_plan, learning_steps, planner, sharding
from gradacc.choices import BUILTIN_MODELS, OPTIMIZERS, PER_MICRO_BATCH
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
    plan.add_argument("--from-config", action="store_true",
                      help="plan from the model's config alone (built on the meta device, activations fitted on "
                           "scaled-down copies of its family): the default for a config.json, a folder without "
                           "weights and a hub id")
    plan.add_argument("--lora-rank", type=value, default=config_plan.DEFAULT_LORA_RANK,
                      help="from a config: the LoRA rank planned beside the full fine-tune")
    plan.add_argument("--attention", choices=config_plan.ATTENTIONS, default="sdpa",
                      help="from a config: the attention implementation the run will use")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(run=run)


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def from_config(args) -> bool:
    """Plan from the config alone: asked for, a config.json, a folder with no weights, or a hub id; a built-in
    model and a folder with weights are measured here (the twelve lever settings)."""
    model = str(args.model)
    if args.from_config or model.endswith(".json"):
        return True
    if model in BUILTIN_MODELS:
        return False
    path = Path(model).expanduser()
    if path.is_dir():
        return not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES)
    return True


def run(args) -> int:
    if from_config(args):
        return run_from_config(args)
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


def run_from_config(args) -> int:
    """``gradacc plan`` for a model this machine cannot train: every setting from the config alone."""
    if isinstance(args.memory_budget_mb, str):
        raise GradaccError(f"--memory-budget-mb must be a number; got {args.memory_budget_mb!r}.")
    result = config_plan.plan(str(args.model), budget_mb=float(args.memory_budget_mb),
                              sequence_length=args.max_seq_length, target_effective_batch=args.target_effective_batch,
                              processes=args.processes, lora_rank=args.lora_rank, attention=args.attention,
                              confinement=paths.TRUST_USER)  # the command line reads any config its user can
    if result["reason"]:
        raise GradaccError(result["reason"], "budget_mb")
    if args.json:
        print(json.dumps(result, default=str))
        return EXIT_OK
    ranks = (f" on {result['processes']} GPUs, replicated (DDP) or sharded (FSDP), per rank" if result["processes"] > 1
             else " on 1 GPU")
    print(f"{args.model}: {result['config_class']}, {result['parameters']:,} parameters (built on the meta device, no "
          f"weights) at {result['sequence_length']} tokens, budget {result['budget_mb']:,.0f} MB{ranks}, effective "
          f"batch {result['target_effective_batch']}")
    print(f"activations: measured on scaled-down {result['config_class']} copies on this CPU ({result['attention']} "
          f"attention) and scaled to the config; fitted within {max(row['fit_error'] for row in result['rows']):.1%} "
          "on the copies")
    names = ("weights", "gradients", "optimizer_state", "activations", "logits", "step_temporaries",
             "framework_overhead", "sharding_buffers")
    heads = ["weights", "grads", "optimizer", "activations", "logits+loss", "opt step", "overhead", "sharding"]
    sharded = result["processes"] > 1
    print(f"{'tuning':<9}{'precision':<15}{'optimizer':<11}{'ckpt':<6}" + (f"{'ranks':<22}" if sharded else "")
          + f"{'m':>5}{'k':>5}{'peak':>11}" + "".join(f"{head:>12}" for head in heads))
    for row in result["rows"]:
        tuning = f"LoRA r{row['lora_rank']}" if row["lora_rank"] else "full"
        terms = row["terms"]
        print(f"{tuning:<9}{config_plan.PRECISION_LABELS[row['precision']]:<15}{row['optimizer']:<11}"
              f"{'on' if row['gradient_checkpointing'] else 'off':<6}"
              + (f"{config_plan.ways_label(row['sync']):<22}" if sharded else "")
              + f"{row['micro_batch_size'] or '—':>5}"
              f"{row['grad_accum_steps'] or '—':>5}{format_bytes(terms['peak']) if row['fits'] else 'no fit':>11}"
              + "".join(f"{format_bytes(terms[name]):>12}" for name in names))
    best = result["rows"][0]
    print(f"pick: {config_plan.setting_label(best)}, m={best['micro_batch_size']}, k={best['grad_accum_steps']} "
          "(fewest levers that fit, then the largest m)")
    weighing = result["normalisation"]
    print(f"accumulate by items ({weighing['kind']}: {weighing['items']}); Trainer: {weighing['trainer']}; a plain "
          f"loop: {weighing['loop']}; gradacc train: --loss-normalization {weighing['loss_normalization']}")
    view = result["accelerate"]
    full = next(row for row in result["rows"] if not row["lora_rank"] and row["precision"] == "fp32"
                and row["optimizer"] == "adamw" and not row["gradient_checkpointing"]
                and row["sync"] in (None, PER_MICRO_BATCH))  # fully sharded: the least a rank holds
    print(f"accelerate estimate-memory (weights + gradients + Adam states, batch 1, no activations): "
          f"{format_bytes(view['adam_fp32_bytes'])} in fp32, {format_bytes(view['adam_bf16_bytes'])} in mixed bf16; "
          f"gradacc, full fp32 AdamW at m=1"
          + (f" per rank on {result['processes']} GPUs, FSDP {full['sync']} sync" if result["processes"] > 1 else "")
          + f": {format_bytes(full['least_bytes'])} (with activations, logits, the optimizer step and the overhead)")
    print(f"framework overhead: {result['framework_overhead']['source']}")
    return EXIT_OK
