"""Eval metrics from scikit-learn: accuracy and F1 (binary for two classes, macro otherwise)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, f1_score


def classification_metrics(predictions, labels, num_labels: int) -> dict:
    """Scores over labelled items; -100 marks items without a label (padding, special tokens)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    labelled = labels != -100
    predictions, labels = predictions[labelled], labels[labelled]
    if num_labels == 2:
        f1 = f1_score(labels, predictions, average="binary", pos_label=1, zero_division=0)
    else:
        f1 = f1_score(labels, predictions, average="macro", zero_division=0)
    return {"accuracy": float(accuracy_score(labels, predictions)), "f1": float(f1)}
