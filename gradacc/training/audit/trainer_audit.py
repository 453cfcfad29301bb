"""The audit of a user's own ``Trainer``: ``AccumulationAudit``, a callback that watches the first window and judges
the gradient right before the optimizer step; the fix gradacc ships for #47688 heads (``token_mean_loss``); and the
audit of a stock Trainer on a model, for the command line."""

from __future__ import annotations

import logging
import sys
import time

from gradacc.training.audit.reference import (RandomState, batch_items, dropout_active, live_gradients,
                                              reference_gradient, shifts_labels, sum_over_ranks, window_items)
from gradacc.training.audit.verdict import EXACT, EXACT_MIXED_PRECISION, judge, logger, publish, verdict
from gradacc.training.audit.watch import Tally, counting_clips, patch, unclipped


def token_mean_loss(outputs, labels, num_items_in_batch=None):
    """A Trainer ``compute_loss_func``: cross-entropy summed over the labelled items ÷ ``num_items_in_batch``.

    Trainer counts ``num_items_in_batch`` over the whole accumulation window (on all ranks), so each
    micro-batch's share comes out weighted by its items and the window's gradient is that of its mean loss,
    whatever k or the window's length. For heads whose logits line up with their labels (sequence and token
    classification); a ``*ForCausalLM`` head already uses ``num_items_in_batch`` itself.
    """
    import torch.nn.functional as F

    logits = outputs["logits"]
    summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100,
                             reduction="sum")
    if num_items_in_batch is None:  # evaluation without a count: the batch's own mean
        num_items_in_batch = (labels != -100).sum()
    return summed / num_items_in_batch


def _trainer_from_stack():
    """The Trainer that calls this callback: Trainer hands callbacks no handle on itself, so the audit finds it
    in the calling frames (``self`` of ``Trainer.train``'s inner loop)."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class _TrainerAudit:
    """The state of one audit of one Trainer run (see ``AccumulationAudit``)."""

    def __init__(self, trainer, loss_fn, json_path):
        self.trainer = trainer
        self.loss_fn = loss_fn or (lambda model, batch: model(**batch).loss)
        self.json_path = json_path
        self.tally = Tally()
        self.batches: list[dict] = []
        self.gradient: dict | None = None  # the gradient's finding
        self.counted_items: float | None = None
        self.rng_at_start: RandomState | None = None
        self.reference: dict | None = None
        self.seconds = 0.0
        self._restore = []
        self._clips = None

    def start(self):
        """The first window begins (its micro-batches already fetched): watch it."""
        trainer, tally = self.trainer, self.tally
        self.rng_at_start = RandomState.take()
        step = trainer.training_step
        scheduler_step = trainer.lr_scheduler.step

        def training_step(model, inputs, num_items_in_batch=None):
            self.batches.append(dict(inputs))
            if num_items_in_batch is not None:  # what Trainer divides the window's summed loss by (all ranks)
                self.counted_items = float(num_items_in_batch)
            loss = step(model, inputs, num_items_in_batch)
            tally.backwards += 1
            tally.logged_loss += float(loss)
            return loss

        def count_scheduler_step(*args, **kwargs):
            tally.scheduler_steps += 1
            return scheduler_step(*args, **kwargs)

        self._restore = [patch(trainer, "training_step", training_step),
                         patch(trainer.lr_scheduler, "step", count_scheduler_step)]
        self._clips = counting_clips(tally)
        self._clips.__enter__()

    def measure(self):
        """Before the optimizer step: the reference gradient on the same micro-batches and weights."""
        started = time.perf_counter()
        trainer = self.trainer
        model = trainer.model
        shifts = shifts_labels(model)
        device = next(model.parameters()).device
        batches = [trainer._prepare_inputs(b) for b in self.batches]
        items = [batch_items(b, shifts) for b in batches]
        window = window_items(items, device)
        replay = self.rng_at_start if dropout_active(model) else None
        self.reference = reference_gradient(model, batches, self.loss_fn, items, window, replay=replay,
                                            autocast=trainer.compute_loss_context_manager)
        self.reference["seconds"] = time.perf_counter() - started
        self.reference["gradient"], self.reference["loss"] = sum_over_ranks(self.reference["gradient"],
                                                                           self.reference["loss"])
        # Trainer logs the mean over ranks of what each rank added up.
        from gradacc.training import distributed

        args = trainer.args
        ranks = max(1, args.world_size)
        self.tally.logged_loss = distributed.sum_over_ranks([self.tally.logged_loss], device)[0] / ranks
        # The gradient Trainer is about to apply (after its clipping, undone by its factor), read in place.
        tolerance = EXACT_MIXED_PRECISION if (args.bf16 or args.fp16) else EXACT
        self.gradient = judge(live_gradients(model), self.reference["gradient"], k=args.gradient_accumulation_steps,
                              micro_batches=len(self.batches), tolerance=tolerance, who="trainer",
                              num_processes=args.world_size, applied_scale=unclipped(self.tally),
                              items=(window, self.counted_items))
        self.reference["gradient"] = None  # freed now, not at the step's end
        self.seconds += time.perf_counter() - started

    def finish(self, state):
        for restore in self._restore:
            restore()
        self._restore = []
        if self._clips is not None:
            self._clips.__exit__(None, None, None)
        if self.gradient is None:
            return None
        args = self.trainer.args
        report = verdict(self.gradient, self.tally, k=args.gradient_accumulation_steps, micro_batches=len(self.batches),
                         expected_scheduler_steps=1, clipping=args.max_grad_norm > 0, who="trainer",
                         reference_loss=self.reference["loss"], mode=self.reference["mode"],
                         reference_seconds=self.reference["seconds"], seconds=self.seconds)
        state.log_history.append({"gradacc_audit": report, "step": state.global_step})
        if state.is_world_process_zero:  # one line for the run, not one per rank
            publish(report, self.json_path)
        return report


def accumulation_audit_class():
    """``AccumulationAudit``, built on first use (transformers is imported then, not with gradacc.audit)."""
    base = _callback_base()

    class AccumulationAudit(base):
        """A ``TrainerCallback`` that audits the run's first optimizer step (with gradient_accumulation_steps > 1):
        ``trainer.add_callback(AccumulationAudit())``. The verdict goes to the log, to ``state.log_history``
        (an entry ``{"gradacc_audit": report}``), to ``self.report`` and, with ``json_path``, to a JSON file.

        ``loss_fn(model, batch)``: the mean loss over a batch's items (default: the model's own ``.loss``).
        """

        def __init__(self, json_path=None, loss_fn=None):
            self.json_path = json_path
            self.loss_fn = loss_fn
            self.report: dict | None = None
            self._audit: _TrainerAudit | None = None
            self._done = False

        def on_train_begin(self, args, state, control, **kwargs):
            self._audit, self._done, self.report = None, False, None  # once per run, also when train() runs again

        def on_step_begin(self, args, state, control, **kwargs):
            if self._done or self._audit is not None or args.gradient_accumulation_steps <= 1:
                return
            trainer = _trainer_from_stack()
            if trainer is None:
                logger.warning("gradacc audit: no Trainer found calling the callback; nothing audited")
                self._done = True
                return
            self._audit = _TrainerAudit(trainer, self.loss_fn, self.json_path)
            self._audit.start()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if self._audit is not None and self._audit.reference is None:
                self._audit.measure()

        def on_step_end(self, args, state, control, **kwargs):
            if self._audit is not None:
                self.report = self._audit.finish(state)
                self._audit, self._done = None, True

        def on_train_end(self, args, state, control, **kwargs):
            if self._audit is not None:  # stopped inside the first window
                self._audit.finish(state)
                self._audit, self._done = None, True

    return AccumulationAudit


def audit_stock_trainer(config, steps: int = 1, window_timer=None, confinement=None, audited: bool = True) -> dict:
    """The audit of a stock ``transformers.Trainer`` (its defaults, no ``compute_loss_func``) on ``config``'s
    model and data: ``steps`` optimizer steps of micro-batch m and k, the first audited. ``window_timer``: a
    TrainerCallback added beside the audit (the benchmark's clock). ``confinement``: where local paths may lie
    (``job.prepare``'s). ``audited=False``: the same run without the audit (the benchmark's baseline); returns
    ``{}`` then."""
    import tempfile
    import threading

    from transformers import PrinterCallback, Trainer, TrainingArguments

    from gradacc.labels import field_label
    from gradacc.errors import GradaccError
    from gradacc.training.backends.trainer_loop import _Samples
    from gradacc.training.run.engine import quiet_libraries
    from gradacc.training.run.job import prepare
    from gradacc.training.run.options import RunOptions

    m, k = config.micro_batch_size, config.grad_accum_steps
    if not isinstance(k, bool) and isinstance(k, int) and k < 2:
        raise GradaccError(f"{field_label('grad_accum_steps')} must be at least 2 for an audit of accumulation "
                           f"(k micro-batches per optimizer step); got {k}.", "grad_accum_steps")
    # Full windows on every rank (under accelerate launch / torchrun each takes its share of the examples).
    config = config.replace(backend="trainer", train_samples=m * k * steps * config.num_processes, epochs=1, max_steps=steps,
                            eval_samples=8, instrument=False).check()
    quiet_libraries()
    job = prepare(config, lambda event: None, threading.Event(), RunOptions(confinement=confinement))
    audit = accumulation_audit_class()()
    with tempfile.TemporaryDirectory(prefix="gradacc-audit-") as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=m, gradient_accumulation_steps=k,
                                 max_steps=steps, learning_rate=config.learning_rate, seed=config.seed,
                                 report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                                 use_cpu=job.device.type == "cpu")
        callbacks = ([audit] if audited else []) + ([window_timer] if window_timer else [])
        trainer = Trainer(model=job.model, args=args, train_dataset=_Samples(job.train_examples),
                          data_collator=job.collate, callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)
        quiet = logging.getLogger("gradacc.audit")
        quiet.disabled = True  # the command prints the verdict itself
        try:
            trainer.train()
        finally:
            quiet.disabled = False
    if not audited:
        return {}
    if audit.report is None:
        raise GradaccError("The audit saw no optimizer step: the data has fewer examples than one micro-batch.",
                           "micro_batch_size")
    return {**audit.report, "model": config.model, "dataset": config.dataset, "micro_batch_size": m}
