"""What differs from one task to another, in one spec per task: its data, how it is tokenised and batched, its
model's head, how it is evaluated, and the words and checks the forms, the CLI and the audit use for it.

Everything else reads ``TASKS[name]`` (or ``task_named``) instead of asking which task it is: a new task (a
regression head, a vision model) is a new ``Task`` here and the functions it names.

Importing this module does not import torch: the app's forms and ``gradacc --help`` read the specs' words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gradacc import paths
from gradacc.choices import (CAUSAL_LM, CLASSIFICATION, CONTRASTIVE, CONTRASTIVE_MODELS, IN_BATCH_NEGATIVE_TASKS,
                             TASK_DATASETS)
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.training.sources import data, models


@dataclass(frozen=True)
class Tokenized:
    """A task's examples, ready for its collator, and what tokenising them changed."""
    train: list[dict]
    eval: list[dict]
    truncated: int
    # Sentences a person should read before trusting the run (texts dropped).
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    name: str
    # The built-in data a run of this task trains on when it names none (``gradacc.choices.TASK_DATASETS``).
    default_dataset: str
    # Why another task cannot train on this task's built-in data ("Dataset <name> <reason>."); None: any task can.
    dataset_reason: str | None
    # The built-in models it trains, and the one the CLI picks when only the task is named; None: the models whose
    # own task it is (``gradacc.choices.BUILTIN_MODEL_TASKS``), and the CLI's default model.
    models: tuple[str, ...] | None
    models_words: str | None
    default_model: str | None
    # What its data is, in the words the forms use.
    data_words: str
    # The data has a label per text (a label column to find); a causal LM learns the text itself.
    labelled: bool
    # Every token but the first is a label: a token-level loss over next tokens, shifted as ``*ForCausalLM`` does.
    next_token: bool
    # The model computes its own loss (in-batch negatives): Trainer gets no ``compute_loss_func`` and Trainer's
    # prediction loop, which knows only labels and logits, does not evaluate it.
    model_computes_loss: bool
    # A micro-batch's examples are each other's negatives (``gradacc.choices.IN_BATCH_NEGATIVE_TASKS``): one
    # process, GradCache applies, and the equivalence check compares the three ways to a big batch.
    in_batch_negatives: bool
    # Why the stock-Trainer audit refuses it; None: the audit builds a stock Trainer for it.
    stock_audit_refusal: str | None
    # What the run view shows of its evaluations: (label, event key, format), and the figure a learning-rate sweep
    # ranks runs by (key, higher is better).
    metric_rows: tuple[tuple[str, str, str], ...]
    headline_metric: tuple[str, bool]
    # The steps ``gradacc.training.run.job.prepare`` takes for it.
    load_data: Callable[[RunConfig, paths.Confinement | None], data.TextData]
    tokenize: Callable[[object, data.TextData, RunConfig, bool], Tokenized]
    collator: Callable[[object, bool], Callable]
    # (name, config, num_labels, id2label, token_level, confinement) → models.LoadedModel: the model and its head.
    build_model: Callable[..., models.LoadedModel]
    # (model, job) → the eval metrics, every backend's.
    evaluate: Callable[[object, object], dict]

    @property
    def gradcache(self) -> bool:
        """Whether GradCache's mini-batch (``gradcache_mini_batch``) applies."""
        return self.in_batch_negatives


# ---- the steps each task names ----------------------------------------------------------------------------

def _labelled_texts(config: RunConfig, confinement) -> data.TextData:
    return data.load_text_data(config, confinement, labelled=True)


def _texts(config: RunConfig, confinement) -> data.TextData:
    return data.load_text_data(config, confinement, labelled=False)


def _pairs(config: RunConfig, confinement) -> data.TextData:
    train, held_out = data.load_pairs(config)  # no labels: each query's positive is its label
    return data.TextData([p["query"] for p in train], [], [p["query"] for p in held_out], [], [],
                         pairs=(train, held_out))


def _tokenize_labelled(tokenizer, text: data.TextData, config: RunConfig, token_level: bool) -> Tokenized:
    train, train_cut = data.tokenize(tokenizer, text.train_texts, text.train_labels, config.max_seq_length, token_level)
    held_out, eval_cut = data.tokenize(tokenizer, text.eval_texts, text.eval_labels, config.max_seq_length, token_level)
    return Tokenized(train, held_out, train_cut + eval_cut)


def _tokenize_next_token(tokenizer, text: data.TextData, config: RunConfig, token_level: bool) -> Tokenized:
    train, train_cut = data.tokenize_causal_lm(tokenizer, text.train_texts, config.max_seq_length)
    held_out, eval_cut = data.tokenize_causal_lm(tokenizer, text.eval_texts, config.max_seq_length)
    kept_train = [e for e in train if data.item_count(e)]
    kept_eval = [e for e in held_out if data.item_count(e)]
    if not kept_train or not kept_eval:
        raise GradaccError("Dataset: no text is longer than one token, so a causal LM has nothing to predict.",
                           "dataset")
    dropped = len(train) + len(held_out) - len(kept_train) - len(kept_eval)
    notes = (f"{dropped} text(s) of a single token were dropped: a causal LM predicts nothing from them.",)
    return Tokenized(kept_train, kept_eval, train_cut + eval_cut, notes if dropped else ())


def _tokenize_pairs(tokenizer, text: data.TextData, config: RunConfig, token_level: bool) -> Tokenized:
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.contrastive import tokenize_pairs

    train, train_cut = tokenize_pairs(tokenizer, text.pairs[0], config.max_seq_length)
    held_out, eval_cut = tokenize_pairs(tokenizer, text.pairs[1], config.max_seq_length)
    return Tokenized(train, held_out, train_cut + eval_cut)


def _token_collator(tokenizer, token_level: bool) -> Callable:
    return data.collator(tokenizer, token_level)


def _pair_collator(tokenizer, token_level: bool) -> Callable:
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.contrastive import pair_collator

    return pair_collator(tokenizer)


def _evaluate_labels(model, job) -> dict:
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.backends import evaluation

    return evaluation.evaluate_labels(model, job)


def _evaluate_next_token(model, job) -> dict:
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.backends import evaluation

    return evaluation.evaluate_next_token(model, job)


def _evaluate_retrieval(model, job) -> dict:
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.backends import evaluation

    return evaluation.evaluate_retrieval(model, job)


# ---- the specs ----------------------------------------------------------------------------------------------

TASKS: dict[str, Task] = {spec.name: spec for spec in (
    Task(name=CLASSIFICATION, default_dataset=TASK_DATASETS[CLASSIFICATION], dataset_reason=None,
         models=None, models_words=None, default_model=None, data_words="texts with a label each",
         labelled=True, next_token=False,
         model_computes_loss=False, in_batch_negatives=CLASSIFICATION in IN_BATCH_NEGATIVE_TASKS,
         stock_audit_refusal=None,
         metric_rows=(("Eval F1", "eval_f1", "{:.3f}"), ("Eval accuracy", "eval_accuracy", "{:.3f}")),
         headline_metric=("eval_f1", True),
         load_data=_labelled_texts, tokenize=_tokenize_labelled, collator=_token_collator,
         build_model=models.load_classifier, evaluate=_evaluate_labels),
    Task(name=CAUSAL_LM, default_dataset=TASK_DATASETS[CAUSAL_LM],
         dataset_reason="has no labels to classify: it is for the causal-lm task (tiny-gpt)",
         models=None, models_words=None, default_model=None, data_words="texts", labelled=False, next_token=True,
         model_computes_loss=False, in_batch_negatives=CAUSAL_LM in IN_BATCH_NEGATIVE_TASKS,
         stock_audit_refusal=None,
         metric_rows=(("Eval perplexity", "eval_perplexity", "{:.2f}"),
                      ("Next-token accuracy", "eval_next_token_accuracy", "{:.3f}")),
         headline_metric=("eval_perplexity", False),
         load_data=_texts, tokenize=_tokenize_next_token, collator=_token_collator,
         build_model=models.load_causal_lm, evaluate=_evaluate_next_token),
    Task(name=CONTRASTIVE, default_dataset=TASK_DATASETS[CONTRASTIVE],
         dataset_reason="holds (query, positive) pairs: it is for the contrastive task",
         models=CONTRASTIVE_MODELS, models_words=f"a sentence-transformers model ({', '.join(CONTRASTIVE_MODELS)} "
                                                 "or a folder)",
         default_model=CONTRASTIVE_MODELS[0], data_words="(query, positive) pairs", labelled=False, next_token=False,
         model_computes_loss=True, in_batch_negatives=CONTRASTIVE in IN_BATCH_NEGATIVE_TASKS,
         stock_audit_refusal="The audit is of a Trainer's accumulated loss on a classifier or a causal LM; the "
                             "contrastive task trains with sentence-transformers.",
         metric_rows=(("Eval MRR@10", "eval_mrr_at_10", "{:.3f}"), ("Eval recall@1", "eval_recall_at_1", "{:.3f}")),
         headline_metric=("eval_mrr_at_10", True),
         load_data=_pairs, tokenize=_tokenize_pairs, collator=_pair_collator,
         build_model=models.load_contrastive, evaluate=_evaluate_retrieval),
)}


def task_named(name: str | None) -> Task:
    """The spec of a task's name; None (a config or a saved run that names none, and a model that does not say):
    classification, as everywhere a task is not named."""
    return TASKS[name or CLASSIFICATION]


def task_of(config: RunConfig) -> Task:
    """The spec of the task a config runs: the one it names, else its model's (``models.infer_task``)."""
    return TASKS[models.infer_task(config)]


def dataset_refusal(task: Task, dataset: str) -> str | None:
    """Why ``task`` cannot train on ``dataset`` when it is another task's own built-in data; None when it can."""
    for owner in TASKS.values():
        if owner is not task and owner.dataset_reason and dataset.strip() == owner.default_dataset:
            return f"Dataset {owner.default_dataset} {owner.dataset_reason}."
    return None


def load_model(config: RunConfig, num_labels: int, label_names: list[str], token_level: bool = False,
               confinement: paths.Confinement | None = None) -> models.LoadedModel:
    """The model a config names, with the head its task needs (``models.load``; a classifier's head is fresh, for
    ``num_labels`` classes)."""
    return models.load(config, task_named(config.task).build_model, num_labels, label_names, token_level, confinement)
