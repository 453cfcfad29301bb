"""The words a person sees for each setting: its label on the page and its flag on the command line.

On the ground floor, beside errors and paths, because every layer words its messages with them (paths,
config, the data sources, the limits, the CLI); it imports nothing of gradacc.
"""

from __future__ import annotations

# The words a person sees for each RunConfig field: its label on the page, and its flag on the command
# line. Every message about a field starts with its label (the CLI swaps in the flag), so adding a field
# means adding one line to each table (tests/core/test_config.py checks that every RunConfig field has both).
FIELD_LABELS = {
    "backend": "Backend",
    "model": "Model",
    "dataset": "Dataset",
    "task": "Task",
    "text_column": "Text column",
    "label_column": "Label column",
    "dataset_split": "Dataset split",
    "micro_batch_size": "Micro-batch size (m)",
    "grad_accum_steps": "Accumulation steps (k)",
    "epochs": "Epochs",
    "max_steps": "Max optimizer steps",
    "learning_rate": "Learning rate",
    "warmup_ratio": "Warm-up ratio",
    "weight_decay": "Weight decay",
    "max_grad_norm": "Max gradient norm",
    "seed": "Seed",
    "max_seq_length": "Max sequence length (tokens)",
    "train_samples": "Training samples",
    "eval_samples": "Eval samples",
    "loss_normalization": "Loss normalisation",
    "dropout": "Dropout",
    "num_processes": "Processes",
    "instrument": "Instrumentation",
    "memory_budget_mb": "Memory budget (MB)",
    "gradient_checkpointing": "Gradient checkpointing",
    "precision": "Precision",
    "optimizer": "Optimizer",
    "trainer_library_default": "Trainer library default",
    "pitfalls": "Pitfalls",
    "gradcache_mini_batch": "GradCache mini-batch",
    "fsdp": "Shard the model (FSDP)",
    "grad_sync": "Gradient sync",
    # Where a run is logged besides gradacc's own store (engine and CLI options, not RunConfig fields).
    "report_to": "Report to",
    "log_dir": "Log dir",
    "run_id": "Run id",
    # Inputs of the Memory planner page, not of a run.
    "budget_mb": "Memory budget (MB)",
    "target_effective_batch": "Target effective batch",
    # Of `gradacc plan --model CONFIG` (the planner page's "from its config" mode): a model this machine cannot run.
    "processes": "GPUs (DDP or FSDP)",
    "lora_rank": "LoRA rank",
    "attention": "Attention",
    # Of `gradacc check` alone: the examples in the checked window.
    "samples": "Examples in the window",
}
CLI_FLAGS = {
    "backend": "--backend",
    "model": "--model",
    "dataset": "--dataset",
    "task": "--task",
    "text_column": "--text-column",
    "label_column": "--label-column",
    "dataset_split": "--dataset-split",
    "micro_batch_size": "--micro-batch-size",
    "grad_accum_steps": "--grad-accum-steps",
    "epochs": "--epochs",
    "max_steps": "--max-steps",
    "learning_rate": "--lr",
    "warmup_ratio": "--warmup-ratio",
    "weight_decay": "--weight-decay",
    "max_grad_norm": "--max-grad-norm",
    "seed": "--seed",
    "max_seq_length": "--max-seq-length",
    "train_samples": "--train-samples",
    "eval_samples": "--eval-samples",
    "loss_normalization": "--loss-normalization",
    "dropout": "--dropout",
    "num_processes": None,  # set by the launch (accelerate launch / torchrun), not by a flag
    "instrument": "--no-instrument",
    "memory_budget_mb": "--memory-budget-mb",
    "gradient_checkpointing": "--gradient-checkpointing",
    "precision": "--precision",
    "optimizer": "--optimizer",
    "trainer_library_default": "--trainer-library-default",
    "pitfalls": "--pitfall",
    "gradcache_mini_batch": "--gradcache-mini-batch",
    "fsdp": "--fsdp",
    "grad_sync": "--grad-sync",
    "report_to": "--report-to",
    "log_dir": "--log-dir",
    "run_id": None,  # the CLI makes its own
    # Inputs of `gradacc plan` (the Memory planner page's), not of a run.
    "budget_mb": "--memory-budget-mb",
    "target_effective_batch": "--target-effective-batch",
    "processes": "--processes",
    "lora_rank": "--lora-rank",
    "attention": "--attention",
    "samples": "--samples",
}


def field_label(name: str) -> str:
    """The field's label on the page (a readable fallback for a field not in FIELD_LABELS yet)."""
    return FIELD_LABELS.get(name) or name.replace("_", " ").capitalize()


def in_cli_words(message: str, field: str | None) -> str:
    """A message in the words of the command line: the field's page label becomes its flag."""
    flag = CLI_FLAGS.get(field or "")
    if not flag:
        return message
    label = field_label(field)
    if label in message:
        return message.replace(label, flag, 1)
    return f"{flag}: {message}"
