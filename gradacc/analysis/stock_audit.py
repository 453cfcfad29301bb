"""What a stock 🤗 Trainer gets wrong on a model: ``gradacc audit --model`` and the app's Audit page.

The model (a built-in one, a folder written by save_pretrained, a hub id) trains one optimizer step with
``gradacc.audit.audit_trainer`` attached, the way a user's stock Trainer would train it: no ``compute_loss_func``,
Trainer's defaults, and the standard 🤗 collator for the model's task (``DataCollatorWithPadding`` for a classifier,
``DataCollatorForLanguageModeling(mlm=False)`` for a causal LM: labels are the input ids, padding -100, position 0
kept, so Trainer's own count of ``num_items_in_batch`` is what a user's run sees). The data is gradacc's (the built-in
sets, a CSV/JSONL file, a hub id), each text tokenised plainly (truncated to the recipe's sequence length).
"""

from __future__ import annotations

import logging
import tempfile

from gradacc import audit as public_audit  # light: each name loads its module when first used
from gradacc import paths
from gradacc.config import RunConfig
from gradacc.errors import GradaccError
from gradacc.labels import field_label
from gradacc.training import process_state, tasks
from gradacc.training.run.engine import quiet_libraries
from gradacc.training.sources import data, models
from gradacc.training.tasks import TASKS

# torch, transformers and the training modules that import them at their top are imported inside the functions that
# train or measure: the app's audit queue (gradacc.serving.audits), and `gradacc --help`, imports this module before
# torch loads (tests/core/test_layout.py).


def stock_examples(tokenizer, texts: list[str], labels: list[int] | None, max_length: int) -> list[dict]:
    """Each text tokenised as a user's ``dataset.map(tokenizer)`` would (truncated), with its label if it has one."""
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    examples = [{key: encoded[key][i] for key in ("input_ids", "attention_mask") if key in encoded}
                for i in range(len(texts))]
    if labels is not None:
        for example, label in zip(examples, labels):
            example["labels"] = label
    return examples


def stock_collator(tokenizer, task: str):
    """The collator a stock Trainer uses for the task named ``task`` (transformers' own)."""
    # here: the app and `gradacc --help` import this module before transformers loads
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if TASKS[task].next_token:
        if tokenizer.pad_token is None:  # GPT-2's tokenizer has none: the docs' way
            tokenizer.pad_token = tokenizer.eos_token
        return DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
    return DataCollatorWithPadding(tokenizer=tokenizer)


def audit_stock_trainer(config: RunConfig, steps: int = 1, callbacks=(), confinement: paths.Confinement | None = None,
                        audited: bool = True):
    """The verdict (``gradacc.audit.Verdict``) on a stock Trainer's first optimizer step on ``config``'s model and
    data: ``steps`` steps of micro-batch m and k, the first audited (k = 1 too). ``callbacks``: TrainerCallbacks added
    beside the audit (the benchmark's clock). ``confinement``: where local paths may lie (None: the app's visitors'
    folders). ``audited=False``: the same run without the audit (the benchmark's baseline): returns None."""
    config = config.check()
    config = config.replace(task=models.infer_task(config))
    task = TASKS[config.task]
    if task.stock_audit_refusal:
        raise GradaccError(task.stock_audit_refusal, "task")
    m, k = config.micro_batch_size, config.grad_accum_steps
    # Full windows on every rank (under accelerate launch / torchrun each takes its share of the examples).
    config = config.replace(train_samples=m * k * steps * config.num_processes, eval_samples=8)
    quiet_libraries()
    text = data.load_text_data(config, confinement, labelled=task.labelled)
    if len(text.train_texts) < m:
        raise GradaccError(f"{field_label('micro_batch_size')} is {m}, but the data has only "
                           f"{len(text.train_texts)} training rows.", "micro_batch_size")
    # A model's seeded build, a Trainer (it writes Accelerate's state and reseeds torch's generator) and the audit's
    # replays (they put the generator back, and a run's dropout drawing meanwhile spoils them): on the app's audit
    # thread, beside visitors' runs, the audit waits its turn for all three, so it waits for a run's training to
    # end. It leaves the generators as it found them: a run between its build and its training draws its dropout
    # from where its build left them.
    with process_state.guard(accelerate=True, training=process_state.ALONE, generator=True), \
            process_state.generators_kept():
        audit = _audited_steps(config, text, steps, callbacks, confinement, audited)
    if audit is not None and audit.verdict is None:
        raise GradaccError("The audit saw no optimizer step: the data has fewer examples than one micro-batch.",
                           "micro_batch_size")
    return audit.verdict if audit else None


def _audited_steps(config: RunConfig, text, steps: int, callbacks, confinement, audited: bool):
    """The model built and trained by a stock Trainer, audited unless ``audited`` is False (then None)."""
    import torch  # here: the app and `gradacc --help` import this module before torch loads
    from transformers import PrinterCallback, Trainer, TrainingArguments

    m, k = config.micro_batch_size, config.grad_accum_steps
    loaded = tasks.load_model(config, text.num_labels, text.label_names, confinement=confinement)
    labelled = TASKS[config.task].labelled
    examples = stock_examples(loaded.tokenizer, text.train_texts, text.train_labels if labelled else None,
                              config.max_seq_length)
    with tempfile.TemporaryDirectory(prefix="gradacc-audit-") as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=m, gradient_accumulation_steps=k,
                                 max_steps=steps, learning_rate=config.learning_rate, seed=config.seed,
                                 report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                                 use_cpu=not torch.cuda.is_available())
        trainer = Trainer(model=loaded.model, args=args, train_dataset=examples,
                          data_collator=stock_collator(loaded.tokenizer, config.task), callbacks=list(callbacks))
        trainer.remove_callback(PrinterCallback)
        audit = public_audit.audit_trainer(trainer) if audited else None
        quiet = logging.getLogger("gradacc.audit")
        quiet.disabled = True  # the caller says the verdict itself
        try:
            trainer.train()
        finally:
            quiet.disabled = False
    return audit
