"""The audit of a user's own ``accelerator.accumulate`` loop: a context manager around its first window."""

from __future__ import annotations

import contextlib
import time

from gradacc.training.audit.reference import (RandomState, batch_items, dropout_active, live_gradients,
                                              reference_gradient, shifts_labels, sum_over_ranks, window_items)
from gradacc.training.audit.verdict import EXACT, EXACT_MIXED_PRECISION, judge, publish, verdict
from gradacc.training.audit.watch import Tally, counting_clips, patch, unclipped


class AccelerateAudit:
    """A context manager around the first window of a user's ``accelerator.accumulate`` loop.

    ``batches``: that window's micro-batches on this rank, the ones the loop inside will run (build them
    before entering: with dropout on, the audit replays them from the random state at entry).
    ``loss_fn(model, batch)``: the mean loss over a batch's items (default: the model's own ``.loss``).
    The loop inside runs as written; the block should end after the window's optimizer and scheduler steps.
    ``report`` holds the verdict after the block (on every rank).
    """

    def __init__(self, accelerator, model, optimizer, batches, loss_fn=None, lr_scheduler=None, json_path=None):
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.batches = list(batches)
        self.loss_fn = loss_fn or (lambda model, batch: model(**batch).loss)
        self.lr_scheduler = lr_scheduler
        self.json_path = json_path
        self.tally = Tally()
        self.report: dict | None = None
        self._gradient = None
        self._reference = None
        self._seconds = 0.0
        self._restore = []
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        from gradacc.training.distributed import SyncProbe

        accelerator, tally = self.accelerator, self.tally
        self._rng = RandomState.take()
        backward = accelerator.backward
        step = self.optimizer.step
        probe = None
        with contextlib.suppress(RuntimeError):  # a comm hook of the user's own: syncs not counted
            probe = SyncProbe.attach(self.model)
        if probe is not None:
            tally.synced_micro_batches = 0

        def audited_backward(loss, **kwargs):
            result = backward(loss, **kwargs)
            tally.backwards += 1
            if probe is not None and probe.take():
                tally.synced_micro_batches += 1
            return result

        def audited_step(*args, **kwargs):
            if accelerator.sync_gradients and self._reference is None:
                self._measure()  # right before the step: the gradient it is about to apply
            return step(*args, **kwargs)

        self._restore = [patch(accelerator, "backward", audited_backward),
                         patch(self.optimizer, "step", audited_step)]
        if self.lr_scheduler is not None:
            inner = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)  # the torch scheduler itself
            inner_step = inner.step

            def counted(*args, **kwargs):
                tally.scheduler_steps += 1
                return inner_step(*args, **kwargs)

            self._restore.append(patch(inner, "step", counted))
        self._stack.enter_context(counting_clips(tally))
        return self

    def _measure(self):
        started = time.perf_counter()
        model = self.accelerator.unwrap_model(self.model)  # no DDP collectives in the reference
        device = next(model.parameters()).device
        batches = [{key: value.to(device) if hasattr(value, "to") else value for key, value in b.items()}
                   for b in self.batches]
        shifts = shifts_labels(model)
        items = [batch_items(b, shifts) for b in batches]
        window = window_items(items, device)
        replay = self._rng if dropout_active(model) else None
        reference = reference_gradient(model, batches, self.loss_fn, items, window, replay=replay,
                                       autocast=self.accelerator.autocast)
        reference["seconds"] = time.perf_counter() - started
        reference["gradient"], reference["loss"] = sum_over_ranks(reference["gradient"], reference["loss"])
        self._reference = reference
        accelerator = self.accelerator
        if accelerator.scaler is not None:  # fp16: unscale now, as the step would (it then skips its own)
            with contextlib.suppress(RuntimeError):  # already unscaled by the loop's clipping
                accelerator.unscale_gradients()
        tolerance = EXACT if accelerator.mixed_precision == "no" else EXACT_MIXED_PRECISION
        micro_batches = self.tally.backwards or len(self.batches)  # no accelerator.backward: the batches given
        self._gradient = judge(live_gradients(self.model), reference["gradient"],
                               k=accelerator.gradient_accumulation_steps, micro_batches=micro_batches,
                               tolerance=tolerance, who="accelerate", applied_scale=unclipped(self.tally))
        reference["gradient"] = None
        self._seconds += time.perf_counter() - started

    def __exit__(self, *exc):
        for restore in self._restore:
            restore()
        self._restore = []
        self._stack.close()
        if exc[0] is not None or self._gradient is None:
            return False
        accelerator = self.accelerator
        k = accelerator.gradient_accumulation_steps
        micro_batches = self.tally.backwards or len(self.batches)
        gradient = self._gradient
        expected = _expected_scheduler_steps(self.lr_scheduler, accelerator.num_processes)
        self.report = verdict(gradient, self.tally, k=k, micro_batches=micro_batches,
                              expected_scheduler_steps=expected, clipping=False, who="accelerate",
                              mode=self._reference["mode"], reference_seconds=self._reference["seconds"],
                              seconds=self._seconds)
        self.report["num_processes"] = accelerator.num_processes
        if accelerator.is_main_process:
            publish(self.report, self.json_path)
        return False


def _expected_scheduler_steps(lr_scheduler, num_processes: int) -> int:
    """A prepared scheduler steps the torch one once per process per optimizer step unless batches are split
    (Accelerate's design: schedules sized in per-process steps); an unprepared one, once."""
    from accelerate.scheduler import AcceleratedScheduler

    if isinstance(lr_scheduler, AcceleratedScheduler) and lr_scheduler.step_with_optimizer \
            and not lr_scheduler.split_batches:
        return num_processes
    return 1


def audit_accelerate(accelerator, model, optimizer, batches, loss_fn=None, lr_scheduler=None,
                     json_path=None) -> AccelerateAudit:
    """``with audit_accelerate(accelerator, model, optimizer, batches, loss_fn, lr_scheduler) as audit:`` around
    the first window of your ``accelerator.accumulate`` loop; ``audit.report`` after it."""
    return AccelerateAudit(accelerator, model, optimizer, batches, loss_fn, lr_scheduler, json_path)
