"""The audit of a user's own Accelerate loop, one line before it:

    audit = audit_accelerate(accelerator, model, optimizer)
    for batch in train_dataloader:          # the loop, unchanged
        with accelerator.accumulate(model):
            ...

It observes the first window as the loop runs it: no batch is fetched ahead (a prepared dataloader fetching ahead
ends the epoch early and makes Accelerate sync every micro-batch), nothing is restructured. Each forward of the
model with gradients on is a micro-batch; the window's gradient is judged inside the first ``optimizer.step()`` that
runs with ``accelerator.sync_gradients``, before the step. Scheduler steps are counted until the next window's first
forward (or until ``audit.verdict`` is read, or the process exits under ``gradacc audit --``). The run stays
bit-identical to one without the audit.
"""

from __future__ import annotations

import contextlib

from torch.nn.parallel import DistributedDataParallel

from gradacc.training.audit import losses
from gradacc.training.audit.capture import micro_batches
from gradacc.training.audit.measure import Setup, measure
from gradacc.training.audit.verdict import Check, Verdict, scheduler_check
from gradacc.training.audit.vocabulary import Integration
from gradacc.training.audit.watch import WATCHING, WindowWatch
from gradacc.training.compat import accelerate as compat


class AccelerateAudit(WindowWatch):
    """Watches the first window of the loop that trains ``model`` with ``optimizer`` (both as
    ``accelerator.prepare`` returned them). ``verdict`` after the window's optimizer step.

    ``loss_fn(model, batch)``: the mean loss over a batch's items, for a model whose loss the audit cannot compute
    from its logits and labels. ``json_path``: the verdict also goes there as JSON.
    """

    sync_fix = "run the forward and backward inside accelerator.accumulate(model)"

    def __init__(self, accelerator, model, optimizer, loss_fn=None, json_path=None):
        self.accelerator = accelerator
        self._wrapped = model
        super().__init__(accelerator.unwrap_model(model), optimizer, loss_fn, json_path,
                         ddp=model if isinstance(model, DistributedDataParallel) else None)
        self.backwards = 0
        self.patches.method(accelerator, "backward", self._backward)

    def _backward(self, original, loss, **kwargs):
        result = original(loss, **kwargs)
        if self.state == WATCHING:
            self.backwards += 1
        return result

    def _closes_window(self) -> bool:
        return self.accelerator.sync_gradients

    def _judge(self) -> Verdict:
        accelerator = self.accelerator
        if accelerator.scaler is not None:  # fp16: unscaled now, as the step would (it then skips its own)
            with contextlib.suppress(RuntimeError):  # already unscaled by the loop's clipping
                accelerator.unscale_gradients()
        rule = losses.LossRule(losses.USER_LOSS if self.loss_fn else None, loss_fn=self.loss_fn)
        precision = {"bf16": "bf16", "fp16": "fp16"}.get(str(accelerator.mixed_precision), "fp32")
        no_sync = getattr(self._wrapped, "no_sync", None) if self._wrapped is not self.module else None
        setup = Setup(who=Integration.ACCELERATE, module=self.module, recorder=self.recorder,
                      k=accelerator.gradient_accumulation_steps, num_processes=accelerator.num_processes,
                      precision=precision, rule=rule, custom_loss="loss_fn" if self.loss_fn else None,
                      no_sync=no_sync or contextlib.nullcontext, model_name=losses.model_name(self.module))
        return measure(setup, micro_batches(self.recorder.forwards), self.log, backwards=self.backwards,
                       counted_items=_counted(self.recorder.forwards))

    def _scheduler_check(self) -> Check:
        return scheduler_check(self.log.scheduler_steps, "step it after optimizer.step() only when "
                               "accelerator.sync_gradients, or prepare it with accelerator.prepare (it then skips "
                               "while accumulating)", self._expected_scheduler_steps())

    def _expected_scheduler_steps(self) -> int:
        """A prepared scheduler steps the torch one once per process per optimizer step unless batches are split
        (Accelerate's design: schedules sized in per-process steps); an unprepared one, once."""
        return compat.scheduler_steps_per_optimizer_step(self.accelerator, self.log.stepped_schedulers) or 1

    def _is_main_process(self) -> bool:
        return self.accelerator.is_main_process


def _counted(forwards: list) -> float | None:
    """A ``num_items_in_batch`` the loop passed to the model itself (the window's count, by its own reckoning)."""
    counted = next((f.kwargs.get("num_items_in_batch") for f in forwards if f.grad
                    and f.kwargs.get("num_items_in_batch") is not None), None)
    return None if counted is None else float(counted)


def audit_accelerate(accelerator, model, optimizer, *, loss_fn=None, json_path=None) -> AccelerateAudit:
    """``audit = audit_accelerate(accelerator, model, optimizer)`` one line before your loop; ``audit.verdict``
    after its first optimizer step."""
    return AccelerateAudit(accelerator, model, optimizer, loss_fn, json_path)
