"""Classification metrics beside their floor: what always predicting the most frequent label scores, and how many
labels a model predicted, counted by hand."""

import pytest

from gradacc.training.backends.metrics import classification_metrics

LABELS = [0, 0, 0, 1, 1, -100]  # -100: no label (padding), never counted


def test_one_label_for_every_example_is_counted_whatever_its_f1():
    scores = classification_metrics([1, 1, 1, 1, 1, 0], LABELS, num_labels=2)
    # All positive, the minority label: F1 2·(2/5)/(1 + 2/5) = 4/7, above the majority's 0, accuracy 2/5 below its 3/5.
    assert scores == pytest.approx({"accuracy": 2 / 5, "f1": 4 / 7, "majority_f1": 0.0, "majority_accuracy": 3 / 5,
                                    "labels_predicted": 1})


def test_a_model_that_tells_the_labels_apart_predicts_both():
    scores = classification_metrics([0, 0, 1, 1, 1, 1], LABELS, num_labels=2)
    assert scores["labels_predicted"] == 2 and scores["accuracy"] == pytest.approx(4 / 5)
    assert scores["majority_accuracy"] == pytest.approx(3 / 5)
