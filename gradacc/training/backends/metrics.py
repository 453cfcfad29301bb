"""Eval metrics: accuracy and F1 (binary for two classes, macro otherwise) for classification; eval loss,
perplexity and next-token accuracy for a causal LM. Scores come from scikit-learn."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import accuracy_score, f1_score

from gradacc.conventions import IGNORE_INDEX


def classification_metrics(predictions, labels, num_labels: int) -> dict:
    """Scores over labelled items; -100 marks items without a label (padding, special tokens).

    ``majority_f1`` and ``majority_accuracy``: the scores of always predicting the most frequent label, the floor a
    model that learnt something must beat (a collapsed run sits on it); ``labels_predicted``: how many different
    labels the model predicted (1: one label for every example, whatever its F1).
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    labelled = labels != IGNORE_INDEX
    predictions, labels = predictions[labelled], labels[labelled]
    majority = np.full_like(labels, np.bincount(labels).argmax() if labels.size else 0)
    return {"accuracy": float(accuracy_score(labels, predictions)), "f1": _f1(labels, predictions, num_labels),
            "majority_f1": _f1(labels, majority, num_labels),
            "majority_accuracy": float(accuracy_score(labels, majority)) if labels.size else 0.0,
            "labels_predicted": int(np.unique(predictions).size)}


def _f1(labels, predictions, num_labels: int) -> float:
    if num_labels == 2:
        return float(f1_score(labels, predictions, average="binary", pos_label=1, zero_division=0))
    return float(f1_score(labels, predictions, average="macro", zero_division=0))


def language_model_metrics(token_losses, predictions, targets) -> dict:
    """Token-weighted eval loss (mean negative log-likelihood over every predicted token, whatever the
    batching), its perplexity, and next-token accuracy. ``targets`` are the tokens predicted at each
    position (-100 where nothing is)."""
    token_losses, predictions, targets = np.asarray(token_losses), np.asarray(predictions), np.asarray(targets)
    predicted = targets != IGNORE_INDEX
    if not predicted.any():
        return {"eval_loss": float("nan"), "eval_perplexity": float("nan"), "eval_next_token_accuracy": float("nan")}
    loss = float(token_losses[predicted].astype(np.float64).mean())
    return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)),
            "eval_next_token_accuracy": float(accuracy_score(targets[predicted], predictions[predicted]))}
