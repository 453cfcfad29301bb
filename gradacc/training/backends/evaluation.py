"""Evaluation after each epoch, as Trainer computes it: example-weighted loss, accuracy and F1; for a causal LM,
token-weighted loss, perplexity and next-token accuracy; retrieval for the contrastive task."""

from __future__ import annotations

import torch

from gradacc.conventions import IGNORE_INDEX
from gradacc.events import BASELINE_METRICS
from gradacc.training import distributed
from gradacc.training.fsdp import is_sharded
from gradacc.training.backends.device import to_device
from gradacc.training.backends.metrics import classification_metrics, language_model_metrics
from gradacc.training.contrastive import retrieval_metrics

EVAL_BATCH_SIZE = 64


def evaluate(model: torch.nn.Module, job) -> dict:
    """Example-weighted eval loss, accuracy and F1 over the eval set (as Trainer computes them); for a causal
    LM, token-weighted eval loss, perplexity and next-token accuracy.

    On several processes rank 0 evaluates the whole eval set on the unwrapped model and sends the numbers to
    the others: every example counts once (sharding would pad the last batch with repeats, which
    ``gather_for_metrics`` must drop again), token labels need no cross-rank padding, and eval sets here are
    small enough that splitting them would not pay. (Trainer shards and uses ``gather_for_metrics``.) A sharded
    model (FSDP) has no whole copy on any rank: every rank evaluates the whole set, all-gathering each layer
    together, and gets the same figures.
    """
    if is_sharded(model):
        return _evaluate(model, job)
    metrics = _evaluate(distributed.unwrap(model), job) if distributed.is_main_process() else None
    return distributed.from_main_process(metrics)


@torch.no_grad()
def _evaluate(model: torch.nn.Module, job) -> dict:
    was_training = model.training
    model.eval()
    try:
        return job.task.evaluate(model, job)  # gradacc.training.tasks: each task's figures
    finally:
        model.train(was_training)


def evaluate_labels(model: torch.nn.Module, job) -> dict:
    """A classifier's (of texts or of tokens) mean loss, accuracy, F1 and the baselines' figures."""
    total_loss, predictions, labels = 0.0, [], []
    for start in range(0, len(job.eval_examples), EVAL_BATCH_SIZE):
        chunk = job.eval_examples[start:start + EVAL_BATCH_SIZE]
        batch = to_device(job.collate(chunk), job.device)
        outputs = model(**batch)
        total_loss += float(outputs.loss) * len(chunk)
        labelled = batch["labels"] != IGNORE_INDEX  # token labels: skip padding and special tokens
        predictions.extend(outputs.logits.argmax(-1)[labelled].tolist())
        labels.extend(batch["labels"][labelled].tolist())
    scores = classification_metrics(predictions, labels, job.num_labels)
    return {"eval_loss": total_loss / len(job.eval_examples), "eval_accuracy": scores["accuracy"],
            "eval_f1": scores["f1"], **{f"eval_{name}": scores[name] for name in BASELINE_METRICS}}


def evaluate_next_token(model: torch.nn.Module, job) -> dict:
    """A causal LM's token-weighted loss, perplexity and next-token accuracy."""
    losses, predictions, targets = [], [], []
    for start in range(0, len(job.eval_examples), EVAL_BATCH_SIZE):
        batch = to_device(job.collate(job.eval_examples[start:start + EVAL_BATCH_SIZE]), job.device)
        logits = model(**{key: value for key, value in batch.items() if key != "labels"}).logits
        token_losses, predicted, target = next_token_predictions(logits, batch["labels"])
        kept = target != IGNORE_INDEX
        losses.extend(token_losses[kept].tolist())
        predictions.extend(predicted[kept].tolist())
        targets.extend(target[kept].tolist())
    return language_model_metrics(losses, predictions, targets)


def evaluate_retrieval(model: torch.nn.Module, job) -> dict:
    """Every held-out query ranks every held-out positive (``retrieval_metrics``)."""
    return retrieval_metrics(model, job.eval_examples, job.collate, job.device, EVAL_BATCH_SIZE)


def next_token_predictions(logits: torch.Tensor, labels: torch.Tensor):
    """Per position of a causal LM's output: the loss of the next token, the predicted next token, and the
    next token itself (-100 where there is none). The same shift ``*ForCausalLM`` applies to its labels."""
    target = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)
    token_losses = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), target, ignore_index=IGNORE_INDEX,
                                                     reduction="none")
    return token_losses, logits.argmax(-1), target
