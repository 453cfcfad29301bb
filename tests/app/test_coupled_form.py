"""The Train form and run view for the contrastive task: what goes together is said before Start; MRR@10 is shown."""

import pytest

from gradacc.app import form, runview
from gradacc.app.equivalence_view import coupled_summary
from gradacc.config import RunConfig


@pytest.mark.parametrize("config, field, words", [
    (RunConfig(model="tiny-bert", task="contrastive", dataset="builtin-pairs"), "task", "sentence-transformers model"),
    (RunConfig(model="all-MiniLM-L6-v2", task="contrastive", dataset="builtin-sentiment"), "dataset", "builtin-pairs"),
    (RunConfig(model="tiny-bert", dataset="builtin-pairs"), "dataset", "for the contrastive task"),
])
def test_what_does_not_go_together_is_said_by_the_field(config, field, words):
    errors = form.task_errors(config)
    assert list(errors) == [field] and words in errors[field]


def test_minilm_on_builtin_pairs_is_a_contrastive_run_of_known_size():
    config = RunConfig(model="all-MiniLM-L6-v2", task="contrastive", dataset="builtin-pairs", train_samples=5000)
    assert form.task_errors(config) == {}
    assert form.known_train_examples(config) == form.BUILTIN_PAIRS_TRAIN  # no more pairs than ship


class _Run:
    def __init__(self, events, config):
        self.events, self.config, self.started = events, config, {"config": config}

    def of(self, kind):
        return [e for e in self.events if e["event"] == kind]


def test_a_contrastive_run_shows_its_retrieval_scores():
    from gradacc import events

    run = _Run([events.eval_(epoch=1, step=4, eval_loss=0.5, eval_mrr_at_10=0.9123, eval_recall_at_1=0.85)],
               {"task": "contrastive", "model": "all-MiniLM-L6-v2"})
    assert runview.eval_scores(run) == [("Eval MRR@10", "0.912"), ("Eval recall@1", "0.850")]


def test_the_coupled_summary_reads_both_checks():
    contrastive = {"task": "contrastive", "effective_batch": 64, "micro_batch_size": 16, "grad_accum_steps": 4,
                   "ways": {name: {"micro_batch_size": m, "grad_accum_steps": k, "gradcache_mini_batch": mini,
                                   "rel_error": error, "activation_bytes": size}
                            for name, m, k, mini, error, size in (("batch", 64, 1, None, 0.0, 300e6),
                                                                  ("accumulation", 16, 4, None, 0.66, 70e6),
                                                                  ("gradcache", 64, 1, 16, 5e-7, 46e6))}}
    batch_norm = {"model": "bow-batchnorm", "by_micro_batch": [{"micro_batch_size": 2, "grad_accum_steps": 8,
                                                                "rel_error": 2.5}]}
    sentences, rows = coupled_summary([contrastive, batch_norm])
    assert "66% off the batch of 64" in sentences[0] and "15 in-batch negatives instead of 63" in sentences[0]
    assert any("BatchNorm: up to 250% off" in s for s in sentences)
    assert [row["what"] for row in rows] == ["the same loss, accumulated", "CachedMultipleNegativesRankingLoss (GradCache)",
                                             "bow-batchnorm"]
