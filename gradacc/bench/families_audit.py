"""``bench families``' audit column: gradacc.audit on each family with its dropout on, where the accumulation is
right, so any verdict but "exact" is a false alarm.

Two ways for each family's saved tiny model (``families.build``), every dropout the family has set to 0.1 (in its
config and in modules with a fixed ``p``: Llama's and Qwen2's own default is 0):

- **Trainer with the fix**: a stock ``Trainer`` with the standard collator for the task, plus the fix gradacc names
  for the kind (a classifier: ``compute_loss_func=gradacc.audit.token_mean_loss``; a causal LM:
  ``model.loss_type = "ForCausalLM"``, which Trainer's count of ``num_items_in_batch`` reads);
- **the Accelerate recipe**: accelerate's ``examples/by_feature/gradient_accumulation.py`` loop with
  ``audit_accelerate`` one line before it, on micro-batches of equal items (a causal LM's texts cut to the same
  number of tokens: with unequal ones the recipe's mean ÷ k is really wrong, and the audit says so).

One optimizer step each, m = 2, k = 4 (the table's settings).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, PrinterCallback, Trainer, TrainingArguments

from gradacc.analysis.stock_audit import stock_collator, stock_examples
from gradacc.audit import audit_accelerate, audit_trainer, token_mean_loss
from gradacc.choices import CAUSAL_LM, CLASSIFICATION
from gradacc.errors import one_line
from gradacc.training import process_state
from gradacc.training.tasks import TASKS
from gradacc.training.sources import builtin_data
from gradacc.training.sources import dropout as dropouts

DROPOUT = 0.1
LENGTH = 32


@dataclass(frozen=True)
class SavedFamily:
    """A family's tiny model as ``families.build`` saved it, and what loading it takes."""
    folder: Path
    config_class: str  # in transformers' words: "BertConfig"
    model_class: str  # "BertForSequenceClassification"
    causal: bool  # a causal LM (learns builtin-text), else a classifier (builtin-sentiment)


def _model(saved: SavedFamily):
    config = getattr(transformers, saved.config_class).from_pretrained(saved.folder)
    dropouts.set_in_config(config, DROPOUT)
    model = getattr(transformers, saved.model_class).from_pretrained(saved.folder, config=config)
    dropouts.set_in_modules(model, DROPOUT)
    return model


def _examples(saved: SavedFamily, tokenizer, count: int) -> tuple[list[dict], str]:
    if saved.causal:
        texts = builtin_data.make_text(count * 4, seed=0)
        examples = [e for e in stock_examples(tokenizer, texts, None, LENGTH) if len(e["input_ids"]) == LENGTH]
        return examples[:count], CAUSAL_LM
    texts, labels = builtin_data.make_sentiment(count, seed=0)
    return stock_examples(tokenizer, texts, labels, LENGTH), CLASSIFICATION


def trainer_with_the_fix(saved: SavedFamily, settings: dict):
    # A Trainer's build and step write Accelerate's state and reseed torch's generator, shared with any thread.
    with process_state.guard(accelerate=True, generator=True):
        return _trainer_with_the_fix(saved, settings)


def _trainer_with_the_fix(saved: SavedFamily, settings: dict):
    m, k = settings["micro_batch_size"], settings["grad_accum_steps"]
    tokenizer = AutoTokenizer.from_pretrained(saved.folder)
    examples, task = _examples(saved, tokenizer, m * k)
    model = _model(saved)
    next_token = TASKS[task].next_token
    if next_token:
        model.loss_type = "ForCausalLM"
    with tempfile.TemporaryDirectory(prefix="gradacc-families-audit-") as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=m, gradient_accumulation_steps=k,
                                 max_steps=1, seed=settings["seed"], report_to="none", save_strategy="no",
                                 disable_tqdm=True, use_cpu=True)
        trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=stock_collator(tokenizer, task),
                          compute_loss_func=None if next_token else token_mean_loss)
        trainer.remove_callback(PrinterCallback)
        audit = audit_trainer(trainer)
        trainer.train()
    return audit.verdict


def accelerate_recipe(saved: SavedFamily, settings: dict):
    # An Accelerator writes Accelerate's state; the recipe seeds torch's generator: both the process's.
    with process_state.guard(accelerate=True, generator=True):
        return _accelerate_recipe(saved, settings)


def _accelerate_recipe(saved: SavedFamily, settings: dict):
    m, k = settings["micro_batch_size"], settings["grad_accum_steps"]
    tokenizer = AutoTokenizer.from_pretrained(saved.folder)
    examples, task = _examples(saved, tokenizer, m * k)
    torch.manual_seed(settings["seed"])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=k)
    model = _model(saved)
    loader = DataLoader(examples, batch_size=m, collate_fn=stock_collator(tokenizer, task))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    audit = audit_accelerate(accelerator, model, optimizer)
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    return audit.verdict


def audit_family(saved: SavedFamily, settings: dict) -> dict:
    """The audit's verdicts on the family's saved model, with its dropout on: {way: verdict's gradient, ...}."""
    out = {}
    for way, run in (("audit_trainer_fixed", trainer_with_the_fix), ("audit_accelerate_recipe", accelerate_recipe)):
        try:
            verdict = run(saved, settings)
            out[way] = verdict.gradient if verdict is not None else "no verdict"
            if verdict is not None and not verdict.ok:
                out[f"{way}_line"] = verdict.line
        except Exception as error:  # noqa: BLE001 - the row says why this family could not be audited
            out[way] = f"failed: {one_line(error)}"
    return out
