"""``python -m gradacc bench SUITE [--quick] [--json] [--out DIR]``: measured figures, one suite at a time.

    overhead  optimizer steps/s with gradacc's events and memory probes on vs off, vs a bare PyTorch loop
    memory    activation bytes per micro-batch across m at a fixed effective batch, and across k at fixed m
    sweep     time per effective batch and final eval F1 for (m, k) pairs with the same effective batch
    latency   seconds to the first step event (cold subprocess, warm in-process) and in the browser
    ga-bug    naive ÷k vs exact on a causal LM: distance of the final weights from the full batch, k = 1..16
    levers    peak memory and time of accumulation beside checkpointing, bf16 and a lighter optimizer
    pitfalls  each deliberately wrong line of the plain loop against the right loop: loss, F1, lr, examples
    families  Trainer's library default (#47688) and gradacc check on tiny models of 14 transformers families
    coupled   in-batch negatives (batch, accumulation, GradCache) and BatchNorm vs LayerNorm: where accumulation is
              not the big batch
    learning-rates  SGD's and Adafactor's learning rates for each built-in model's recipe (a short sweep)
    learning-steps  the fewest optimizer steps from which each built-in classifier learns at its recipe's rate
    audit     what gradacc.audit costs a Trainer run and a plain loop: its seconds against one window's
              forward+backward, once
    fsdp      sharded (FSDP) on 2 processes: gradient bytes per rank and bytes sent per window, per-window vs
              per-micro-batch sync, and the formula that takes them to 1B-70B models
    grpo      TRL's GRPOTrainer by loss_type, k and steps_per_generation: each step's gradient against its window's
              documented objective's, computed by hand
    config-plan  the config planner's predicted peak against the measured one, on GPT-2, Llama and Qwen2 at sizes
              this machine trains

Each suite module has ``run(quick, threads) -> dict``, ``figure(result)`` and ``table(result)``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from gradacc.bench import report
from gradacc.errors import RunFailed

SUITES = ("overhead", "memory", "sweep", "latency", "ga-bug", "levers", "pitfalls", "families", "coupled",
          "learning-rates", "learning-steps", "audit", "fsdp", "grpo", "config-plan")
DEFAULT_OUT = "bench-out"
# One intra-op thread by default: on a small shared machine two OpenMP threads wait on each other
# whenever another process takes a core (we measured 3-30x slower steps under load), which drowns
# every ratio in noise. --threads 0 leaves torch's own default.
DEFAULT_THREADS = 1


def add_parser(subcommands) -> None:
    parser = subcommands.add_parser("bench", help="benchmark suites: " + ", ".join(SUITES),
                                    description=__doc__.split("\n\n")[1],
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds, not minutes (tests use it)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"folder for SUITE.json/.html/.png (default {DEFAULT_OUT})")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help="torch intra-op threads while measuring (0: torch's default)")
    parser.add_argument("--browser-times", metavar="FILE",
                        help="latency only: a JSON of click → first loss seconds measured in a browser "
                             "(scripts/page_latency.py's output)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import torch  # here: `gradacc --help` imports this module, and answers before torch loads

    suite = importlib.import_module(f"gradacc.bench.{args.suite.replace('-', '_')}")
    threads_before = torch.get_num_threads()
    threads = args.threads or threads_before
    torch.set_num_threads(threads)
    try:
        options = {"browser_times": args.browser_times} if args.suite == "latency" else {}
        result = suite.run(quick=args.quick, threads=threads, **options)
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        torch.set_num_threads(threads_before)  # in-process callers (tests) get their setting back
    files = report.write(result, suite.figure(result), Path(args.out))
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    headers, rows = suite.table(result)
    report.print_table(headers, rows)
    report.print_goals(result)
    report.print_files(files)
    return 0
