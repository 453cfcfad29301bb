"""A prepared run: config, data tokenised and ordered, model on its device, and where events go.

Backends receive a ``Job`` and only train: everything they must agree on (data order, window weights,
step counts, the model's initial weights) is decided here, once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from gradacc.training.sources import data as data_module
from gradacc.training import distributed, windows
from gradacc.training.memory import budget
from gradacc.training.sources import dropout as dropouts
from gradacc.training.sources import models
from gradacc.training import tasks
from gradacc.training.tasks import TASKS, Task
from gradacc.choices import PITFALLS
from gradacc.config import ValidConfig, too_few_examples
from gradacc.steps import optimizer_steps_per_epoch, total_optimizer_steps
from gradacc.errors import GradaccError, RunStopped
from gradacc.events import EventSink
from gradacc.training.run.options import RunOptions

if TYPE_CHECKING:  # names for the annotations only: the app and `gradacc --help` import this module before torch loads
    import torch
    from transformers import PreTrainedTokenizerBase

    from gradacc.training.backends.device import Precision


@dataclass(frozen=True)  # built whole by ``prepare``: nothing is set on a Job after it is made
class Job:
    config: ValidConfig
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    train_examples: list[dict]
    eval_examples: list[dict]
    label_names: list[str]
    collate: Callable
    emit: EventSink
    stop: threading.Event
    device: torch.device
    steps_per_epoch: int
    total_steps: int
    # This rank's micro-batches of an epoch (example indices; all of them on one process).
    micro_batches: list[list[int]]
    # For each of them: the items of its accumulation window on all ranks (exact weights), and its own items.
    window_items: list[int]
    batch_items: list[int]
    token_level: bool = False
    notes: list[str] = field(default_factory=list)
    # The backends' options, from ``RunOptions`` (see there); trainer_library_default also from the config.
    before_optimizer_step: Callable | None = None
    trainer_library_default: bool = False
    sync_each_micro_batch: bool = False
    # The memory levers: autocast (and fp16's grad scaler) for the forward pass, set by ``prepare``.
    precision: Precision | None = None
    # When the run has a memory budget or the deployment a limit.
    memory_guard: budget.Guard | None = None
    # How far two training-mode passes of the first two examples differ at the run's dropout; the equivalence
    # check refuses a model that varies at dropout 0.
    variation: dropouts.Variation | None = None

    @property
    def task(self) -> Task:
        """What the run's task does differently (its evaluation, its loss's shape): ``gradacc.training.tasks``."""
        return TASKS[self.config.task]

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise RunStopped()

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def pick_device():
    """CUDA when present (and not disabled by GRADACC_DEVICE=cpu), else the CPU.

    A launched rank takes the GPU of its LOCAL_RANK; with fewer GPUs than processes on this machine every
    rank trains on the CPU (all ranks must agree: gloo on CPU, nccl on GPUs).
    """
    import torch  # here: the app and `gradacc --help` import this module before torch loads

    wanted = os.environ.get("GRADACC_DEVICE", "").strip().lower()
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if distributed.world_size() > 1:
        if distributed.local_world_size() > torch.cuda.device_count():
            return torch.device("cpu")
        return torch.device("cuda", distributed.local_rank())
    return torch.device(wanted or "cuda")


def _stop_requested(stop: threading.Event) -> None:
    """Checked between the slow phases of preparing (loading data, loading a model, tokenising): a run stopped
    or out of time while preparing ends at the next phase, not after all of them."""
    if stop.is_set():
        raise RunStopped()


def prepare(config: ValidConfig, emit: EventSink, stop: threading.Event, options: RunOptions = RunOptions()) -> Job:
    """Load the data and the model of a checked config (``RunConfig.check()``), tokenise and order the data,
    measure the run's memory when something caps it (refusing it, ``budget.OutOfMemory``, past the cap);
    GradaccError on bad input (a data file, a model folder). ``options``: see ``RunOptions``.

    Each step reads what the run's task does differently from its spec (``gradacc.training.tasks``).
    """
    config = _for_this_launch(config)
    task = TASKS[config.task]
    phase = options.on_phase or (lambda text: None)
    _stop_requested(stop)  # e.g. the run's time ran out while torch was still importing
    text_data = _load_data(config, task, options, phase)
    _stop_requested(stop)
    token_level = options.token_level or task.next_token  # a causal LM's label is per token
    loaded = _build_model(config, text_data, token_level, options, phase)
    _stop_requested(stop)
    phase(f"tokenising {len(text_data.train_texts) + len(text_data.eval_texts):,} texts")
    tokenized = task.tokenize(loaded.tokenizer, text_data, config, token_level)
    _stop_requested(stop)
    notes = [*text_data.notes, *tokenized.notes]
    if tokenized.truncated:
        notes.append(f"{tokenized.truncated} text(s) longer than {config.max_seq_length} tokens were truncated.")
    train_examples = data_module.shuffled(tokenized.train, config.seed)
    plan, rank_items = _micro_batches(config, train_examples, notes)
    rank = distributed.rank()
    collate = options.collate or task.collator(loaded.tokenizer, token_level)
    device, precision, model, variation, guard = _place_model(config, loaded, collate,
                                                              [train_examples[i] for i in plan[rank][0][:2]],
                                                              train_examples, options, phase, notes)
    return Job(config=config, model=model, precision=precision, tokenizer=loaded.tokenizer,
               train_examples=train_examples, eval_examples=tokenized.eval, label_names=text_data.label_names,
               collate=collate, emit=emit, stop=stop, variation=variation,
               device=device,
               steps_per_epoch=optimizer_steps_per_epoch(len(train_examples), config.micro_batch_size,
                                                         config.grad_accum_steps, config.num_processes),
               total_steps=total_optimizer_steps(config, len(train_examples)),
               micro_batches=plan[rank], window_items=windows.window_totals(rank_items, config.grad_accum_steps),
               batch_items=rank_items[rank], token_level=token_level, notes=notes,
               before_optimizer_step=options.before_optimizer_step,
               trainer_library_default=options.trainer_library_default or config.trainer_library_default,
               sync_each_micro_batch=options.sync_each_micro_batch, memory_guard=guard)


def _for_this_launch(config: ValidConfig) -> ValidConfig:
    """The config with its task named (the model's when it names none), refused when this launch has another
    number of processes than it asks for."""
    if not isinstance(config, ValidConfig):  # a caller's slip, not bad input: check() it where it enters
        raise TypeError(f"prepare takes a ValidConfig (RunConfig.check()); got {type(config).__name__}")
    if config.task is None:  # the model's task, shown in run_started's config (a new ValidConfig: it is checked)
        config = config.replace(task=models.infer_task(config))
    if config.num_processes != distributed.world_size():
        raise GradaccError(f"Processes is {config.num_processes}, but this is a {distributed.world_size()}-process "
                           f"launch; start a {config.num_processes}-process run with accelerate launch or torchrun "
                           "(the app does it through gradacc.training.run.launch).", "num_processes")
    return config


def _load_data(config: ValidConfig, task: Task, options: RunOptions, phase) -> data_module.TextData:
    phase(f"loading the data ({Path(str(config.dataset)).name})")
    text_data = task.load_data(config, options.confinement)
    if options.whole_micro_batch and config.micro_batch_size > len(text_data.train_texts):
        raise GradaccError(too_few_examples(config.micro_batch_size, len(text_data.train_texts)), "micro_batch_size")
    return text_data


def _build_model(config: ValidConfig, text_data: data_module.TextData, token_level: bool, options: RunOptions,
                 phase) -> models.LoadedModel:
    phase(f"loading the model ({Path(str(config.model)).name})")
    return tasks.load_model(config, text_data.num_labels, text_data.label_names, token_level, options.confinement)


def _micro_batches(config: ValidConfig, train_examples: list[dict], notes: list[str]):
    """Every rank's micro-batches of an epoch (example indices) and each one's items; ``notes`` gains what a person
    should know of them."""
    # Every rank knows every rank's micro-batches, so window totals over all ranks need no communication.
    plan = windows.shard(len(train_examples), config.micro_batch_size, config.num_processes)
    rank_items = [windows.batch_item_counts(train_examples, batches) for batches in plan]
    repeated = sum(len(batch) for batches in plan for batch in batches) - len(train_examples)
    if repeated:
        notes.append(f"{repeated} example(s) from the start of the data are repeated at the end of each epoch so "
                     f"that all {config.num_processes} processes get full micro-batches (as Accelerate does).")
    if config.pitfalls:
        notes.append("Broken on purpose: " + ", ".join(f"{name} ({PITFALLS[name]})" for name in config.pitfalls)
                     + "; the run measures what it breaks against the right loop and says it when it ends.")
    return plan, rank_items


def _place_model(config: ValidConfig, loaded: models.LoadedModel, collate: Callable, first_two: list[dict],
                 train_examples: list[dict], options: RunOptions, phase, notes: list[str]):
    """The model on this rank's device with the run's levers, its dropout measured (``first_two`` examples) and
    its memory guarded: (device, precision, model, variation, guard); ``notes`` gains the dropout's."""
    device = pick_device()
    # Every backend's ranks join here (Accelerate and Trainer use a group that exists): one timeout for all of them.
    distributed.init_process_group(device)
    # torch loads with the backends' helpers, here and not when this module is imported: a cold server's run
    # thread does that import (see tests/attack/test_attack_resources.py).
    from gradacc.training.backends.device import Precision, enable_gradient_checkpointing

    precision = Precision(config, device)  # refuses fp16 off CUDA before anything is moved to the device
    phase("measuring memory" if config.memory_budget_mb or options.max_run_memory_mb else "checking dropout")
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(loaded.model, config.model)
    model = loaded.model.to(device)
    # Two examples show randomness as well as a whole micro-batch, and cost no more than the budget's own probes
    # (a run too large for its memory is refused after this, before its first micro-batch).
    variation = _dropout_variation(model, collate, first_two, device, precision)
    dropout_note = dropouts.note(config.model, config.dropout, variation)
    if dropout_note:
        notes.append(dropout_note)
    guard = budget.guard_for(config, options.max_run_memory_mb, model, train_examples, collate, device, precision)
    return device, precision, model, variation, guard


def _dropout_variation(model, collate, examples: list[dict], device, precision):
    """Whether the run's dropout took: ``examples`` through the model twice in training mode (see
    ``gradacc.training.sources.dropout``); nothing the run draws or trains on changes."""
    # here: it imports torch; the app and `gradacc --help` import this module before torch loads
    from gradacc.training.backends.device import to_device

    return dropouts.variation(model, to_device(collate(examples), device), device, precision.autocast)
