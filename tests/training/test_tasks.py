"""One spec per task (gradacc/training/tasks.py): each task's is complete, and nothing else asks which task a run is.

The second rule is read from the source tree with ``ast``: a comparison of anything with a task's name (a string such
as "causal-lm", or gradacc.choices' CAUSAL_LM) outside the specs is a branch on the task that a new task would have to
find and extend.
"""

import ast
import dataclasses
from pathlib import Path

import pytest

from support import ROOT

from gradacc import choices
from gradacc.training import tasks
from gradacc.training.tasks import TASKS, Task

# Where a task's name may be compared: the specs themselves.
ALLOWED = {ROOT / "gradacc" / "training" / "tasks.py"}
SOURCES = sorted([*(ROOT / "gradacc").rglob("*.py"), *(ROOT / "pages").rglob("*.py"), ROOT / "app.py"])
TASK_CONSTANTS = {"CLASSIFICATION", "CAUSAL_LM", "CONTRASTIVE"}


def test_every_task_has_one_complete_spec_under_its_own_name():
    assert list(TASKS) == list(choices.TASKS)
    for name, spec in TASKS.items():
        assert isinstance(spec, Task) and spec.name == name
        assert spec.default_dataset == choices.TASK_DATASETS[name] and spec.default_dataset in choices.BUILTIN_DATASETS
        assert spec.in_batch_negatives == (name in choices.IN_BATCH_NEGATIVE_TASKS) == spec.gradcache
        for step in ("load_data", "tokenize", "collator", "build_model", "evaluate"):
            assert callable(getattr(spec, step)), f"{name}: {step}"
        assert spec.metric_rows and all(label and key.startswith("eval_") and "{:" in form
                                        for label, key, form in spec.metric_rows), name
        assert spec.headline_metric[0] in {key for _, key, _ in spec.metric_rows}, name
        assert spec.data_words, name
        # A task that trains only some built-in models says which, in words, and the CLI picks one of them.
        assert (spec.models is None) == (spec.models_words is None) == (spec.default_model is None), name
        assert set(spec.models or ()) <= set(choices.BUILTIN_MODELS) and spec.default_model in (spec.models or (None,))
        assert None not in (getattr(spec, f.name) for f in dataclasses.fields(spec)
                            if f.name not in ("dataset_reason", "models", "models_words", "default_model",
                                              "stock_audit_refusal")), name
    # Every built-in dataset is some task's, and a dataset only one task can use says why.
    assert {spec.default_dataset for spec in TASKS.values()} == set(choices.BUILTIN_DATASETS)
    for spec in TASKS.values():
        refused_elsewhere = [other.name for other in TASKS.values()
                             if tasks.dataset_refusal(other, spec.default_dataset)]
        assert bool(refused_elsewhere) == (spec.dataset_reason is not None), spec.name
        assert tasks.dataset_refusal(spec, spec.default_dataset) is None


def test_a_task_not_named_is_classification_and_a_folder_model_names_its_own():
    assert tasks.task_named(None) is TASKS[choices.CLASSIFICATION]
    from gradacc.config import RunConfig

    assert tasks.task_of(RunConfig(model="tiny-gpt")) is TASKS[choices.CAUSAL_LM]
    assert tasks.task_of(RunConfig(model="tiny-bert", task=choices.CONTRASTIVE)) is TASKS[choices.CONTRASTIVE]


def task_comparisons(path: Path, source: str | None = None) -> list[str]:
    """Each comparison in ``path`` (or ``source``, as if it lived there) of something with a task's name: a string
    naming a task, or one of gradacc.choices' task constants imported there; as 'line: code'."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path))
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "gradacc.choices"
                for alias in node.names if alias.name in TASK_CONSTANTS}

    def names_a_task(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in choices.TASKS
        if isinstance(node, ast.Name):
            return node.id in imported
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_task(element) for element in node.elts)
        return False

    return [f"{node.lineno}: {ast.get_source_segment(text, node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and any(names_a_task(side) for side in (node.left, *node.comparators))]


def test_no_module_but_the_specs_compares_a_task_with_a_task_name():
    assert len(SOURCES) > 100, "the source tree was not found where the layout puts it"
    found = {str(path.relative_to(ROOT)): hits for path in SOURCES if path not in ALLOWED
             for hits in [task_comparisons(path)] if hits}
    assert found == {}, "read the task's spec (gradacc.training.tasks.TASKS) instead of comparing its name"


@pytest.mark.parametrize("planted, caught", [
    ("from gradacc.choices import CAUSAL_LM\nif config.task == CAUSAL_LM:\n    pass\n",
     ["2: config.task == CAUSAL_LM"]),
    ("if run.get('task') not in (None, 'classification'):\n    pass\n",
     ["1: run.get('task') not in (None, 'classification')"]),
    ("from gradacc.choices import CONTRASTIVE as PAIRS\nok = task != PAIRS\n", ["2: task != PAIRS"]),
    # A module's own constant of that name is not a task (bench/families.py's kinds of model).
    ("CAUSAL_LM = 'causal LM'\nok = kind == CAUSAL_LM\n", []),
])
def test_a_planted_comparison_with_a_task_name_is_caught(planted, caught):
    assert task_comparisons(ROOT / "gradacc" / "probe.py", planted) == caught


def word_tokenizer():
    """A tokenizer of one token per word and no special tokens, so a one-word text is a single token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[PAD]": 0, "a": 1, "b": 2, "c": 3}, unk_token="[PAD]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[PAD]")


def test_a_causal_lm_drops_the_texts_it_predicts_nothing_from_and_says_so():
    from gradacc.config import RunConfig
    from gradacc.errors import GradaccError
    from gradacc.training.sources.data import TextData

    spec, config = TASKS[choices.CAUSAL_LM], RunConfig(max_seq_length=8)
    text = TextData(["a b", "c"], [], ["a b c", "b"], [], [])
    tokenized = spec.tokenize(word_tokenizer(), text, config, True)
    # Position 0 predicts nothing: "a b" predicts b, "a b c" predicts b then c.
    assert [e["labels"] for e in tokenized.train] == [[-100, 2]]
    assert [e["labels"] for e in tokenized.eval] == [[-100, 2, 3]]
    assert tokenized.notes == ("2 text(s) of a single token were dropped: a causal LM predicts nothing from them.",)
    with pytest.raises(GradaccError, match="a causal LM has nothing to predict"):
        spec.tokenize(word_tokenizer(), TextData(["a"], [], ["b"], [], []), config, True)
