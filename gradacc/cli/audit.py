"""``gradacc audit``: gradacc.audit's verdict on accumulation, from the command line, two ways:

    gradacc audit [--strict] -- python train.py ARGS…   your own script, unchanged: every Trainer it builds and every
                                                       Accelerate loop it runs is audited; one line per verdict
    gradacc audit --model DIR_OR_HUB_ID [-m 4 -k 4]     what a stock 🤗 Trainer gets wrong on a model (its defaults,
                                                       the standard collator for its task, gradacc's data)

Exit status: the script's own, unless ``--strict`` (a CI gate, which never passes what it did not check): 3 when a
verdict found something wrong, 4 when nothing was judged (nothing audited, a loop that never stepped, a verdict "not
judged"); 2 for bad input.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gradacc import paths
from gradacc.analysis.stock_audit import audit_stock_trainer
from gradacc.choices import TASKS
from gradacc.cli.options import EXIT_BAD_INPUT, EXIT_OK, config_from_args, value
from gradacc.config import RunConfig
from gradacc.training import distributed

EXIT_WRONG = 3
EXIT_NOT_JUDGED = 4
# The folder Python imports sitecustomize.py from in an audited script (gradacc.training.audit.autoattach).
SITE = Path(__file__).resolve().parents[1] / "training" / "audit" / "site"
ENV = "GRADACC_AUDIT_DIR"  # gradacc.training.audit.autoattach.ENV (not imported here: it is torch-free, but light)


def add_parser(commands) -> None:
    audit = commands.add_parser(
        "audit", help="audit your own training script (-- python train.py ...) or a stock 🤗 Trainer on a model",
        description="gradacc audit -- python train.py ARGS...: run your script unchanged and audit every Trainer "
                    "and Accelerate loop it runs. gradacc audit --model M: what a stock Trainer gets wrong on M.")
    audit.add_argument("--strict", action="store_true",
                       help=f"a CI gate: exit {EXIT_WRONG} when a verdict finds something wrong, {EXIT_NOT_JUDGED} "
                            "when nothing was judged (nothing audited, a loop that never stepped, 'not judged')")
    audit.add_argument("--model", default=None, help="a folder written by save_pretrained, a hub id, or tiny-bert")
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
    audit.add_argument("--json", action="store_true", help="each verdict as one JSON object per line")
    audit.add_argument("script", nargs=argparse.REMAINDER,
                       help="after --: the command that trains (python train.py ..., accelerate launch ...)")
    audit.set_defaults(run=run)


def run(args) -> int:
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if script and args.model:
        print("error: give --model or a script after --, not both", file=sys.stderr)
        return EXIT_BAD_INPUT
    if script:
        return run_script(script, strict=args.strict, as_json=args.json)
    if args.model is None:
        print("error: give the command that trains after --, e.g. gradacc audit -- python train.py, or --model",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_model(args)


def run_model(args) -> int:
    verdict = audit_stock_trainer(config_from_args(args), confinement=paths.TRUST_USER)  # the user's own folders
    if not distributed.is_main_process():  # under accelerate launch / torchrun every rank audits; rank 0 says it
        return EXIT_OK
    print(json.dumps(verdict.as_dict(), default=str) if args.json else verdict.line)
    return strict_status([verdict.as_dict()]) if args.strict else EXIT_OK


def strict_status(verdicts: list[dict]) -> int:
    """A CI gate's exit status: something wrong (3) before something unchecked (4); 0 only when every verdict was
    judged and found nothing wrong, and there was one."""
    if any(v["judged"] and not v["ok"] for v in verdicts):
        return EXIT_WRONG
    if not verdicts or not all(v["judged"] for v in verdicts):
        return EXIT_NOT_JUDGED
    return EXIT_OK


def run_script(command: list[str], strict: bool = False, as_json: bool = False) -> int:
    """Run ``command`` with the audit attached; print each verdict; the exit status (see the module)."""
    with tempfile.TemporaryDirectory(prefix="gradacc-audit-") as folder:
        python_path = [str(SITE), str(SITE.parents[3])]  # sitecustomize, then gradacc itself (a checkout too)
        if os.environ.get("PYTHONPATH"):
            python_path.append(os.environ["PYTHONPATH"])
        env = dict(os.environ, **{ENV: folder, "PYTHONPATH": os.pathsep.join(python_path)})
        try:
            status = subprocess.call(command, env=env)
        except OSError as error:  # no such program, not executable
            print(f"gradacc audit: could not start {command[0]!r}: {error.strerror or error}", file=sys.stderr)
            return 127
        verdicts = []
        for path in sorted(glob.glob(os.path.join(folder, "verdict-*.json")), key=os.path.getmtime):
            with open(path, encoding="utf-8") as file:
                verdicts.append(json.load(file))
    lines = [json.dumps(verdict) for verdict in verdicts] if as_json else \
        list(dict.fromkeys(v["line"] for v in verdicts))  # separate copies of one script say the same line once
    for line in lines:
        print(line)
    if status != 0:
        print(f"gradacc audit: {' '.join(command)} exited with status {status}"
              + ("" if verdicts else ", before any optimizer step was audited"), file=sys.stderr)
        return status
    if not verdicts:
        print("gradacc audit: nothing audited: the script stepped no Trainer, no Accelerate loop and no optimizer of "
              "a module's parameters" + (f" (exit {EXIT_NOT_JUDGED}: --strict)" if strict else ""), file=sys.stderr)
    elif strict and not all(v["judged"] for v in verdicts):
        print(f"gradacc audit: not every verdict was judged (exit {EXIT_NOT_JUDGED}: --strict)", file=sys.stderr)
    return strict_status(verdicts) if strict else status
