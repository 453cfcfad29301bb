"""A prepared run: config, data tokenised and ordered, model on its device, and where events go.

Backends receive a ``Job`` and only train: everything they must agree on (data order, window weights,
step counts, the model's initial weights) is decided here, once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from gradacc import data as data_module
from gradacc import models, windows
from gradacc.config import RunConfig, optimizer_steps_per_epoch, total_optimizer_steps
from gradacc.errors import GradaccError, RunStopped
from gradacc.events import EventSink


@dataclass
class Job:
    config: RunConfig
    model: object
    tokenizer: object
    train_examples: list[dict]
    eval_examples: list[dict]
    label_names: list[str]
    collate: Callable
    emit: EventSink
    stop: threading.Event
    device: object
    steps_per_epoch: int
    total_steps: int
    # For each training micro-batch of an epoch: the items of its accumulation window (exact weights).
    window_items: list[int]
    batch_items: list[int]
    token_level: bool = False
    notes: list[str] = field(default_factory=list)
    # Called with the model right before each optimizer step (the equivalence check reads gradients here).
    before_optimizer_step: Callable | None = None
    # Trainer only: leave Trainer's own loss scaling untouched (shows the library default, pitfall included).
    trainer_library_default: bool = False

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise RunStopped()

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def pick_device():
    """CUDA when present (and not disabled by GRADACC_DEVICE=cpu), else the CPU."""
    import torch

    wanted = os.environ.get("GRADACC_DEVICE", "").strip().lower()
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(wanted or "cuda")


def prepare(config: RunConfig, emit: EventSink, stop: threading.Event, token_level: bool = False,
            whole_micro_batch: bool = True) -> Job:
    """Validate, load data and model, tokenise and order the data; GradaccError on bad input.

    ``whole_micro_batch``: refuse a micro-batch larger than the training set (a run's config is surely
    wrong then; the equivalence check builds such windows on purpose).
    """
    config.validate()
    text_data = data_module.load_text_data(config)
    if whole_micro_batch and config.micro_batch_size > len(text_data.train_texts):
        raise GradaccError(f"micro batch size {config.micro_batch_size} is larger than the "
                           f"{len(text_data.train_texts)} training examples.", "micro_batch_size")
    loaded = models.load(config, text_data.num_labels, text_data.label_names, token_level)
    train_examples, train_cut = data_module.tokenize(loaded.tokenizer, text_data.train_texts, text_data.train_labels,
                                                     config.max_seq_length, token_level)
    eval_examples, eval_cut = data_module.tokenize(loaded.tokenizer, text_data.eval_texts, text_data.eval_labels,
                                                   config.max_seq_length, token_level)
    notes = list(text_data.notes)
    if train_cut or eval_cut:
        notes.append(f"{train_cut + eval_cut} text(s) longer than {config.max_seq_length} tokens were truncated.")
    train_examples = data_module.shuffled(train_examples, config.seed)
    batch_items = windows.batch_item_counts(train_examples, config.micro_batch_size)
    device = pick_device()
    return Job(config=config, model=loaded.model.to(device), tokenizer=loaded.tokenizer,
               train_examples=train_examples, eval_examples=eval_examples, label_names=text_data.label_names,
               collate=data_module.collator(loaded.tokenizer, token_level), emit=emit, stop=stop, device=device,
               steps_per_epoch=optimizer_steps_per_epoch(len(train_examples), config.micro_batch_size,
                                                         config.grad_accum_steps, config.num_processes),
               total_steps=total_optimizer_steps(config, len(train_examples)),
               window_items=windows.window_totals(batch_items, config.grad_accum_steps),
               batch_items=batch_items, token_level=token_level, notes=notes)
