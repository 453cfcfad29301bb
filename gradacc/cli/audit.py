"""``gradacc audit``: what a stock 🤗 Trainer's accumulation gets wrong on a model (gradacc.audit's verdict)."""

from __future__ import annotations

import json

from gradacc import paths
from gradacc.choices import TASKS
from gradacc.cli.options import EXIT_OK, config_from_args, value
from gradacc.config import RunConfig
from gradacc.training import distributed


def add_parser(commands) -> None:
    audit = commands.add_parser("audit", help="audit a stock 🤗 Trainer's first accumulated step on a model")
    audit.add_argument("--model", required=True, help="a folder written by save_pretrained, a hub id, or tiny-bert")
    audit.add_argument("--dataset", default=None,
                       help="builtin-sentiment, builtin-text (causal-lm), a CSV/JSONL file, a save_to_disk folder or "
                            "a hub id (default: builtin-text for a causal-lm model, else builtin-sentiment)")
    audit.add_argument("--task", choices=TASKS, default=None)
    audit.add_argument("--dataset-split", default=RunConfig.dataset_split, help="split of a hub dataset id")
    audit.add_argument("--text-column", default=None)
    audit.add_argument("--label-column", default=None)
    audit.add_argument("--micro-batch-size", "-m", type=value, default=RunConfig.micro_batch_size)
    audit.add_argument("--grad-accum-steps", "-k", type=value, default=RunConfig.grad_accum_steps)
    audit.add_argument("--max-seq-length", type=value, default=None, help="default: the model's recipe")
    audit.add_argument("--seed", type=value, default=RunConfig.seed)
    audit.add_argument("--json", action="store_true", help="the report as one JSON object")
    audit.set_defaults(run=run)


def run(args) -> int:
    # The audit trains (torch): imported here, so that `gradacc --help` answers before torch loads.
    from gradacc.training.audit import audit_stock_trainer

    report = audit_stock_trainer(config_from_args(args), confinement=paths.TRUST_USER)  # the user's own folders
    if not distributed.is_main_process():  # under accelerate launch / torchrun every rank audits; rank 0 says it
        return EXIT_OK
    print(json.dumps(report, default=str) if args.json else report["line"])
    return EXIT_OK
