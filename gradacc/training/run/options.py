"""What a run asks of the engine beyond its config: ``RunOptions``, one typed object threaded from
``engine.train`` through ``job.prepare`` to the backends (through the ``Job``).

A run's config says what to train; these say how this caller wants it run: the equivalence check reads
gradients before each step, the benchmarks replace the collator, the CLI writes trackers, the app caps memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gradacc import paths


@dataclass(frozen=True)
class RunOptions:
    # ---- preparing the job (``gradacc.training.run.job.prepare``) ----
    # One label per token (token classification); a causal LM is token-level whatever this says.
    token_level: bool = False
    # Refuse a micro-batch larger than the training set (a run's config is surely wrong then; the equivalence
    # check builds such windows on purpose).
    whole_micro_batch: bool = True
    # Replaces the default collator (the memory benchmark pads every micro-batch to one length).
    collate: Callable | None = None
    # Where a local model or data path may lie: ``paths.TRUST_USER`` from the command line; None means the
    # app's visitors' folders (GRADACC_DATA_DIRS, GRADACC_MODEL_DIRS).
    confinement: paths.Confinement | None = None
    # The deployment's cap on a run's memory (``Limits.max_run_memory_mb``); a run that needs more, like one past
    # its own ``memory_budget_mb``, fails as out of memory before step 1.
    max_run_memory_mb: float | None = None
    # Told each slow phase of preparing as it begins ("tokenising 32,000 examples"): the app shows it while a run
    # has no step to show yet. Not an event: the stream says what a run did, not how it got ready.
    on_phase: Callable[[str], None] | None = None
    # ---- what the backends do (kept on the ``Job``) ----
    # Called with the model right before each optimizer step (the equivalence check reads gradients here).
    before_optimizer_step: Callable | None = None
    # Trainer only: leave Trainer's own loss scaling untouched (the library default, pitfall included); the
    # equivalence check sets it per case, a run's config may ask for it too.
    trainer_library_default: bool = False
    # Several processes: all-reduce gradients after every micro-batch instead of once per window (no no_sync),
    # to measure what no_sync saves.
    sync_each_micro_batch: bool = False
    # ---- trackers (``gradacc.export.trackers``): written from the run's events ----
    # "tensorboard", "trackio", both (comma-separated or a list) or None.
    report_to: str | Iterable[str] | None = None
    log_dir: str | os.PathLike | None = None
    run_id: str | None = None  # a new id if None
