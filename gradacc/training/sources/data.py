"""Datasets: where texts and labels come from, and how they become padded micro-batches.

Sources: the built-in generated sets, a CSV/JSONL file, a folder written by ``datasets``'
``save_to_disk``, or a hub dataset id (online only). Whatever the source, the result is a ``TextData``:
train and eval texts with integer labels and their names (classification), or texts alone (causal-lm:
every token but the first is a label).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from gradacc import paths
from gradacc.conventions import IGNORE_INDEX
from gradacc.config import RunConfig
from gradacc.errors import GradaccError, one_line
from gradacc.training.sources import builtin_data, hub
from gradacc.training.sources.tables import clean_rows, clean_texts, pick_columns, read_table

FILE_SUFFIXES = paths.DATA_FILE_SUFFIXES
EVAL_FRACTION = 0.2


@dataclass
class TextData:
    train_texts: list[str]
    train_labels: list[int]
    eval_texts: list[str]
    eval_labels: list[int]
    label_names: list[str]
    # Sentences a person should read before trusting the run (rows dropped, texts truncated, ...).
    notes: list[str] = field(default_factory=list)
    # The contrastive task's (query, positive) pairs, train and held out (the texts are their queries).
    pairs: tuple[list[dict], list[dict]] | None = None

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def load_text_data(config: RunConfig, confinement: paths.Confinement | None = None, *,
                   labelled: bool = True) -> TextData:
    """Load, label-map, split and trim the data a config names; GradaccError on anything unusable.

    ``labelled``: the run's task learns a label per text, found in a label column; a causal LM learns the texts
    alone (its task's ``gradacc.training.tasks.Task.labelled``).

    ``confinement``: where a local path may lie (``paths.TRUST_USER`` on the command line); None: the app's
    visitors' folders.
    """
    source = config.dataset.strip()
    where = paths.visitors_unless(confinement)
    if source == "builtin-pairs":
        raise GradaccError("Dataset builtin-pairs holds (query, positive) pairs: it is for the contrastive task.",
                           "dataset")
    if source == "builtin-text":
        if labelled:
            raise GradaccError("Dataset builtin-text has no labels to classify: it is for the causal-lm task (tiny-gpt).",
                               "dataset")
        data = _builtin_text(config)
    elif source == "builtin-sentiment":
        data = _builtin(config)
    elif Path(source).suffix.lower() in FILE_SUFFIXES or Path(source).expanduser().is_file():
        data = _from_table(read_table(source, where), config, labelled)
    elif paths.dataset_is_local(source):
        data = _from_saved(source, config, where, labelled)
    else:
        data = _from_hub(source, config, labelled)
    return _limit(data, config)


def _builtin(config: RunConfig) -> TextData:
    n_train = config.train_samples or 2000
    n_eval = config.eval_samples or 400
    texts, labels = builtin_data.make_sentiment(n_train + n_eval, config.seed)
    return TextData(texts[:n_train], labels[:n_train], texts[n_train:], labels[n_train:],
                    list(builtin_data.LABEL_NAMES))


def _builtin_text(config: RunConfig) -> TextData:
    n_train = config.train_samples or 2000
    n_eval = config.eval_samples or 400
    texts = builtin_data.make_text(n_train + n_eval, config.seed)
    return TextData(texts[:n_train], [], texts[n_train:], [], [])


def load_pairs(config: RunConfig) -> tuple[list[dict], list[dict]]:
    """The contrastive task's (query, positive) pairs, train and held out: builtin-pairs (shipped with gradacc,
    made by scripts/make_contrastive_pairs.py), limited to the run's training and eval samples."""
    if config.dataset.strip() != "builtin-pairs":
        raise GradaccError(f"Task contrastive trains on builtin-pairs, (query, positive) pairs; got dataset "
                           f"{config.dataset.strip()!r}.", "dataset")
    data = json.loads(builtin_data.PAIRS_FILE.read_text(encoding="utf-8"))
    train, held_out = data["train"], data["eval"]
    return train[:config.train_samples or len(train)], held_out[:config.eval_samples or len(held_out)]


def _from_table(frame, config: RunConfig, labelled: bool) -> TextData:
    """A single table: pick columns, map labels, split off a deterministic eval part."""
    if len(frame) == 0:
        raise GradaccError("The data has no rows.", "dataset")
    text_col, label_col = pick_columns(frame, config, labelled)
    if label_col is None:
        texts, labels, label_names, notes, _ = clean_texts(list(frame[text_col]))
    else:
        texts, labels, label_names, notes, _ = clean_rows(list(frame[text_col]), list(frame[label_col]))
    order = list(range(len(texts)))
    random.Random(config.seed).shuffle(order)
    n_eval = max(1, round(len(order) * EVAL_FRACTION))
    if len(order) - n_eval < 1:
        raise GradaccError("The data needs at least 2 usable rows (one to train on, one to evaluate).", "dataset")
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    notes.append(f"No eval split given: {n_eval} of {len(order)} rows held out for evaluation.")
    return TextData([texts[i] for i in train_idx], [labels[i] for i in train_idx] if labels else [],
                    [texts[i] for i in eval_idx], [labels[i] for i in eval_idx] if labels else [], label_names, notes)


def _from_saved(source: str, config: RunConfig, confinement: paths.Confinement, labelled: bool) -> TextData:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    import datasets  # here: the app and `gradacc --help` import this module before datasets loads

    path = confinement.data_path(source)
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as error:
        raise GradaccError(f"{path.name!r} is not a folder written by save_to_disk "
                           f"({one_line(error, with_type=False)}).", "dataset") from None
    return _from_hf(loaded, config, labelled)


def _from_hub(source: str, config: RunConfig, labelled: bool) -> TextData:
    import datasets  # here: the app and `gradacc --help` import this module before datasets loads

    hub.require_online(source, "dataset")
    try:
        loaded = datasets.load_dataset(source, split=config.dataset_split)
    except Exception as error:  # the hub raises many types; the person needs one sentence
        raise GradaccError(f"Could not load hub dataset {source!r} split {config.dataset_split!r}: "
                           f"{one_line(error, with_type=False)}", "dataset") from None
    return _from_hf(loaded, config, labelled)


def _from_hf(loaded, config: RunConfig, labelled: bool) -> TextData:
    import datasets  # here: the app and `gradacc --help` import this module before datasets loads

    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise GradaccError(f"The saved dataset has splits {', '.join(loaded)}; gradacc needs a 'train' split.",
                               "dataset")
        eval_name = next((s for s in ("validation", "test", "eval") if s in loaded), None)
        if eval_name is None:
            return _from_table(loaded["train"].to_pandas(), config, labelled)
        train, evaluation = loaded["train"].to_pandas(), loaded[eval_name].to_pandas()
        text_col, label_col = pick_columns(train, config, labelled)
        if label_col is None:
            return _two_text_splits(train, evaluation, text_col, eval_name)
        names = loaded["train"].features[label_col].names if hasattr(loaded["train"].features[label_col], "names") \
            else None
        return _two_splits(train, evaluation, text_col, label_col, names, eval_name)
    return _from_table(loaded.to_pandas(), config, labelled)


def _two_splits(train, evaluation, text_col, label_col, class_names, eval_name) -> TextData:
    n_train = len(train)
    texts, labels, label_names, notes, kept = clean_rows(list(train[text_col]) + list(evaluation[text_col]),
                                                     list(train[label_col]) + list(evaluation[label_col]))
    if class_names and len(class_names) == len(label_names):
        label_names = list(class_names)
    n_train_kept = sum(1 for i in kept if i < n_train)
    notes.append(f"Evaluating on the {eval_name!r} split.")
    return TextData(texts[:n_train_kept], labels[:n_train_kept], texts[n_train_kept:], labels[n_train_kept:],
                    label_names, notes)


def _two_text_splits(train, evaluation, text_col, eval_name) -> TextData:
    train_texts, _, _, notes, _ = clean_texts(list(train[text_col]))
    eval_texts, _, _, eval_notes, _ = clean_texts(list(evaluation[text_col]))
    return TextData(train_texts, [], eval_texts, [], [], notes + [f"Evaluating on the {eval_name!r} split."])


def _limit(data: TextData, config: RunConfig) -> TextData:
    """Apply train/eval sample limits (the built-in source already has the exact sizes)."""
    if config.train_samples and len(data.train_texts) > config.train_samples:
        data.notes.append(f"Using the first {config.train_samples} of {len(data.train_texts)} training rows.")
        data.train_texts, data.train_labels = data.train_texts[:config.train_samples], \
            data.train_labels[:config.train_samples]
    if config.eval_samples and len(data.eval_texts) > config.eval_samples:
        data.eval_texts, data.eval_labels = data.eval_texts[:config.eval_samples], data.eval_labels[:config.eval_samples]
    if not data.train_texts or not data.eval_texts:
        raise GradaccError("The data needs at least one training row and one eval row.", "dataset")
    return data


# ---- tokenisation and micro-batches -------------------------------------------------------------

def tokenize(tokenizer, texts: list[str], labels: list[int], max_length: int, token_labels: bool = False):
    """Encode texts (truncated to max_length) as examples for a collator; returns (examples, n_truncated).

    With ``token_labels`` every real token carries its sentence's label and special tokens carry -100:
    a token-level loss whose item count differs from example to example.
    """
    full = tokenizer(texts, truncation=False, add_special_tokens=True)["input_ids"]
    truncated = sum(len(ids) > max_length for ids in full)
    encoded = tokenizer(texts, truncation=True, max_length=max_length, return_special_tokens_mask=token_labels)
    examples = []
    for i, label in enumerate(labels):
        example = {key: encoded[key][i] for key in encoded.keys() if key != "special_tokens_mask"}
        if token_labels:
            example["labels"] = [-100 if special else label for special in encoded["special_tokens_mask"][i]]
        else:
            example["labels"] = label
        examples.append(example)
    return examples, truncated


def tokenize_causal_lm(tokenizer, texts: list[str], max_length: int):
    """Examples whose labels are their own tokens, for a model that shifts labels by one (``*ForCausalLM``).

    Position 0 predicts nothing (no token comes before it), so its label is -100 here already: counting
    labels ≠ -100 then counts exactly the tokens the loss predicts, which is what exact weighting needs
    (and what Trainer counts as ``num_items_in_batch``, over ``labels[..., 1:]``). The loss is unchanged.
    """
    full = tokenizer(texts, truncation=False)["input_ids"]
    truncated = sum(len(ids) > max_length for ids in full)
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    examples = []
    for i in range(len(texts)):
        ids = encoded["input_ids"][i]
        examples.append({"input_ids": ids, "attention_mask": encoded["attention_mask"][i],
                         "labels": [IGNORE_INDEX] + list(ids[1:])})
    return examples, truncated


def item_count(example: dict) -> int:
    """Items an example adds to the loss: 1 for a sequence label (or a contrastive pair), its labelled tokens
    for token labels (for a causal LM: the tokens it predicts)."""
    labels = example.get("labels")
    return sum(1 for l in labels if l != IGNORE_INDEX) if isinstance(labels, list) else 1


def shuffled(examples: list, seed: int) -> list:
    """The training order, fixed by the seed, so all three backends see the same micro-batches."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in order]


def collator(tokenizer, token_labels: bool = False):
    """Dynamic padding per micro-batch (the collator Trainer itself would use)."""
    # here: the app and `gradacc --help` import this module before transformers loads
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

    if token_labels:
        return DataCollatorForTokenClassification(tokenizer, return_tensors="pt")
    return DataCollatorWithPadding(tokenizer, return_tensors="pt")
