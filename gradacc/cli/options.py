"""What the commands share: the parser that answers in one line, the run's flags, and the config they make."""

from __future__ import annotations

import argparse
import json
import sys

from gradacc.choices import BACKENDS, GRAD_SYNCS, LOSS_NORMALIZATIONS, OPTIMIZERS, PRECISIONS, TASKS
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.training import distributed
from gradacc.training.tasks import task_named, task_of

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (no usage dump), exit 2."""

    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def value(text: str):
    """A number as typed, or the text itself: RunConfig.check refuses it in the flag's words
    ("--micro-batch-size must be a whole number ...; got 2.5."), where argparse would say "invalid int value"."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The flags of a run that ``train`` and ``check`` share."""
    parser.add_argument("--backend", choices=BACKENDS, default=RunConfig.backend)
    parser.add_argument("--model", default=None,
                        help="tiny-bert, all-MiniLM-L6-v2, tiny-gpt, bow-batchnorm, bow-layernorm, a folder or a hub id "
                             "(default: tiny-bert; all-MiniLM-L6-v2 for --task contrastive)")
    parser.add_argument("--dataset", default=None,
                        help="builtin-sentiment, builtin-text (causal-lm), a CSV/JSONL file, a save_to_disk folder or "
                             "a hub id (default: builtin-text for a causal-lm run, else builtin-sentiment)")
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="default: the model's (a *ForCausalLM model or tiny-gpt means causal-lm); contrastive: "
                             "a sentence-transformers model on builtin-pairs with in-batch negatives")
    parser.add_argument("--gradcache-mini-batch", type=value, default=None,
                        help="contrastive only: CachedMultipleNegativesRankingLoss (GradCache) with mini-batches of "
                             "this many texts (default: MultipleNegativesRankingLoss on each micro-batch)")
    parser.add_argument("--dataset-split", default=RunConfig.dataset_split, help="split of a hub dataset id")
    parser.add_argument("--text-column", default=None)
    parser.add_argument("--label-column", default=None)
    parser.add_argument("--micro-batch-size", "-m", type=value, default=RunConfig.micro_batch_size)
    parser.add_argument("--grad-accum-steps", "-k", type=value, default=RunConfig.grad_accum_steps)
    parser.add_argument("--loss-normalization", choices=LOSS_NORMALIZATIONS, default=RunConfig.loss_normalization)
    parser.add_argument("--seed", type=value, default=RunConfig.seed)
    parser.add_argument("--max-seq-length", type=value, default=None, help="default: the model's recipe")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in backward instead of keeping them (use_reentrant=False)")
    parser.add_argument("--precision", choices=PRECISIONS, default=RunConfig.precision,
                        help="autocast precision: bf16 also on CPU; fp16 only on CUDA (with a grad scaler)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=RunConfig.optimizer,
                        help="adamw-fused where torch fuses it on the device; adamw-8bit needs bitsandbytes and CUDA")
    parser.add_argument("--fsdp", action="store_true",
                        help="several processes: shard parameters, gradients and optimizer state over them (FSDP2) "
                             "instead of replicating the model (DDP)")
    parser.add_argument("--grad-sync", choices=GRAD_SYNCS, default=RunConfig.grad_sync,
                        help="with --fsdp: reduce-scatter gradients once per window (each rank holds the whole "
                             "model's gradients meanwhile) or after every micro-batch (each rank holds its shard, "
                             "and sends k times the bytes)")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run's config; ``num_processes`` is always the launch's (accelerate launch / torchrun set it)."""
    warning = distributed.launch_warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if getattr(args, "config_file", None):
        try:
            with open(args.config_file, encoding="utf-8") as file:
                values = json.load(file)
        except (OSError, ValueError) as error:
            raise GradaccError(f"Could not read the config file {args.config_file!r}: {error}", "config") from None
    else:
        values = {k: v for k, v in vars(args).items() if v is not None or k in ("max_steps",)}
        default_model = task_named(values.get("task")).default_model  # the task is one of --task's choices
        if default_model and "model" not in values:
            values["model"] = default_model  # e.g. contrastive: a sentence-transformers model, trained this way
        if "dataset" not in values:
            values["dataset"] = default_dataset(RunConfig.from_dict(values))
    return RunConfig.from_dict(values).replace(num_processes=distributed.world_size())


def default_dataset(config: RunConfig) -> str:
    """The built-in data of the run's task (a folder's is read from its architecture: cheap, no torch): builtin-text
    for a language model, builtin-sentiment for a classifier, builtin-pairs for the contrastive task."""
    return task_of(config).default_dataset
