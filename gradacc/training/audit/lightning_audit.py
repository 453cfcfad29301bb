"""The audit of a user's own Lightning run: ``Trainer(accumulate_grad_batches=k, callbacks=[AuditCallback()])``.

Lightning divides every ``training_step`` loss by the configured k (``ClosureResult``'s ``closure_loss /
normalize``): an epoch's short last window is under-scaled (Lightning #19987), an epoch shorter than k is one short
window (#21808), and a token-level mean is taken per micro-batch with nothing like ``num_items_in_batch`` (#20350).

The callback watches one window of the first epoch (the first, or with ``window="last"`` the epoch's last, which is
short when the epoch's batches are no multiple of k). Each ``training_step`` call is a micro-batch; the forwards
recorded are those of the module ``training_step`` calls first (the LightningModule itself through ``self(x)``, or a
submodule such as ``self.model``), found on the first micro-batch, or ``module=``. The gradient is judged at the end
of the LightningModule's own ``on_before_optimizer_step`` (after AMP's unscale and the user's own hook, before
Lightning clips), against the gradient of the window's mean loss over its items: computed from the recorded
module's logits and labels (a 🤗 model given ``labels``), or by ``loss_fn(model, batch) -> (summed loss, items)``
called on the LightningModule and the batch as ``training_step`` got it. All is put back at the next window's first
batch (scheduler steps counted until then) or at the end of training: the run stays bit-identical.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pytorch_lightning alone (the same Trainer, packaged apart): its hooks are called the same way
    from pytorch_lightning.callbacks import Callback

from gradacc.training.audit import losses
from gradacc.training.audit.capture import MicroBatch, Patches, Recorder, WindowLog
from gradacc.training.audit.causes import ITEMS
from gradacc.training.audit.measure import Setup, measure
from gradacc.training.audit.verdict import (CLIPPED, DIVIDED_TWICE, K_TIMES, OTHER_LOSS, SHORT_WINDOW, WEIGHTED,
                                            ZEROED, Check, Verdict, publish, scheduler_check)
from gradacc.training.audit.vocabulary import CheckName, Integration
from gradacc.training.compat import lightning as compat

IDLE, WATCHING, JUDGED, DONE = "idle", "watching", "judged", "done"

WEIGHT_BY_ITEMS = ("in training_step return the micro-batch's loss summed over its items (reduction='sum') and add "
                   "its items{items} to a counter; in the LightningModule's on_before_optimizer_step count the "
                   "window's items over all processes (self.trainer.strategy.reduce(torch.tensor(count, "
                   "device=self.device), reduce_op='sum')), multiply every gradient by "
                   "self.trainer.accumulate_grad_batches × self.trainer.world_size ÷ that count (Lightning divides "
                   "by k, DDP averages over processes), then reset the counter")

# The fix of each cause in Lightning's own terms (the catalogue's Lightning column, docs/audit.md).
FIXES = {
    WEIGHTED: ("weight by items (Lightning divides each training_step loss by accumulate_grad_batches and has no "
               "num_items_in_batch: Lightning #20350): " + WEIGHT_BY_ITEMS),
    SHORT_WINDOW: ("Lightning divided each of this window's {j} micro-batches by accumulate_grad_batches = {k} (an "
                   "epoch's last window, or an epoch shorter than k: Lightning #19987, #21808): in the "
                   "LightningModule's on_before_optimizer_step multiply the gradients by {k} ÷ the window's "
                   "micro-batches, or weight by items (" + WEIGHT_BY_ITEMS + "), or give each epoch a multiple of "
                   "{k} batches"),
    DIVIDED_TWICE: "do not divide the loss by accumulate_grad_batches in training_step: Lightning divides it by k",
    K_TIMES: ("return the micro-batch's mean loss from training_step as it is: Lightning divides it by "
              "accumulate_grad_batches"),
    CLIPPED: ("clip with Trainer(gradient_clip_val=...) (Lightning clips once per window, after "
              "on_before_optimizer_step), not in training_step or on_after_backward"),
    ZEROED: ("remove zero_grad from training_step and on_after_backward: Lightning zeroes the gradients at each "
             "window's first batch"),
    OTHER_LOSS: ("if your objective is another loss on purpose, give the audit its per-batch summed loss and items: "
                 "AuditCallback(loss_fn=lambda model, batch: (summed loss, items))"),
}
LOSS_FN = "AuditCallback(loss_fn=lambda model, batch: (<the loss summed over the batch's items>, <its items>))"
# Weighting by items rescales every gradient at the step, an MoE model's router term with them; that term is right as
# the model adds it (Lightning's ÷ k makes it the micro-batches' mean), and keeping it right under the rescale needs
# the window's items before its first backward, which training_step does not have.
ROUTER_KEPT = ("; this MoE model's router term is right as Lightning divides it (the router_loss check), and the "
               "rescale would scale it too: with a router loss, weight by items only in a loop that counts the "
               "window's items before its first backward (gradacc audit's plain-loop fix), or keep Lightning's "
               "weighting knowingly")
# A short window's router term is divided by k as its main loss is: × k ÷ the window's micro-batches puts both right.
ROUTER_SHORT = ("; with this MoE model's router loss take the first way: it puts the router term right too (weighting "
                "by items would rescale it)")
ROUTER_SHORT_CHECK = "the gradient's fix above, its first way (× k ÷ the window's micro-batches), puts it right too"


class AuditCallback(Callback):
    """Audits one accumulation window of a ``lightning.Trainer`` run: ``verdict`` (a ``gradacc.audit.Verdict``)
    after its optimizer step, also logged and, with ``json_path``, written as JSON.

    ``loss_fn(model, batch) -> (summed loss, items)``: the loss summed over the batch's items and their number, for
    a LightningModule whose loss is computed outside a 🤗-style model (``model`` is the LightningModule, ``batch``
    as ``training_step`` got it). ``module``: the submodule whose forward to record (default: the first one
    ``training_step`` calls). ``window``: ``"first"`` (default) or ``"last"``, the first epoch's last window.
    """

    def __init__(self, *, loss_fn=None, module=None, window: str = "first", json_path=None):
        if window not in ("first", "last"):
            raise ValueError(f"window must be 'first' or 'last', not {window!r}")
        self.loss_fn = loss_fn
        self.module = module
        self.window = window
        self.json_path = json_path
        self.verdict: Verdict | None = None
        self.state = IDLE
        self._epoch = None

    # -- which window
    def _start_index(self, trainer) -> int | None:
        k = trainer.accumulate_grad_batches
        if self.window == "first":
            return 0
        batches = trainer.num_training_batches
        if not isinstance(batches, int):  # an iterable of unknown length: its last window is not known ahead
            return None
        return (batches // k) * k if batches % k else max(0, batches - k)

    def on_train_start(self, trainer, pl_module):
        if self.state == DONE:  # once per fit, also when fit runs again
            self.state, self._epoch, self.verdict = IDLE, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.state == JUDGED:  # the next window's first batch: the judged one is over
            self._finish(trainer)
        if self.state == WATCHING and len(self._micro_batches) >= trainer.accumulate_grad_batches:
            self._finish(trainer)  # no optimizer step after k micro-batches (training_step returned None): unjudged
        if self.state != IDLE:
            return
        if self._epoch is None:
            self._epoch = trainer.current_epoch
        if not pl_module.automatic_optimization:  # manual optimization: no window of Lightning's to judge
            self.state = DONE
        elif trainer.current_epoch == self._epoch and batch_idx == self._start_index(trainer):
            self._watch(trainer, pl_module)

    def on_after_backward(self, trainer, pl_module):
        if self.state == WATCHING:
            self._backwards += 1

    def on_train_end(self, trainer, pl_module):
        self._finish(trainer)  # the run ended right after the judged window (max_steps), or inside it

    # -- watching
    def _watch(self, trainer, pl_module) -> None:
        self.state = WATCHING
        self.pl_module = pl_module
        self._backwards = 0
        self._micro_batches: list[MicroBatch] = []
        self._entered: list = []
        given = self.module
        candidates = [given] if given is not None else [pl_module] + [m for _, m in pl_module.named_children()]
        self._recorders = {id(m): (m, Recorder(m, on_forward=self._on_forward(m))) for m in candidates}
        self._chosen = given
        self.log = WindowLog(lambda: self._backwards, trainer.optimizers[0], pl_module)
        self.log.attach()
        self.patches = Patches()
        for optimizer in compat.lightning_optimizers(pl_module):  # zero_grad through self.optimizers() watched too
            self.patches.method(optimizer, "zero_grad", self.log._zero_grad)
        training_step, before_step = compat.INSTANCE_HOOKS
        self.patches.method(pl_module, training_step, self._training_step)
        self.patches.method(pl_module, before_step, self._before_optimizer_step(trainer))

    def _on_forward(self, module):
        def entered(grad: bool) -> None:
            if grad and self.state == WATCHING:
                self._entered.append(module)
        return entered

    def _training_step(self, original, batch, *args, **kwargs):
        if self.state != WATCHING or not torch.is_grad_enabled():
            return original(batch, *args, **kwargs)
        starts = {key: len(recorder.forwards) for key, (_, recorder) in self._recorders.items()}
        for _, recorder in self._recorders.values():
            recorder.recording = True
        self._entered.clear()
        try:
            return original(batch, *args, **kwargs)
        finally:
            for _, recorder in self._recorders.values():
                recorder.recording = False
            if self._chosen is None and self._entered:  # the first module training_step called: the one recorded
                self._chosen = self._entered[0]
                self._keep_only(self._chosen)
            chosen = self._recorders.get(id(self._chosen)) if self._chosen is not None else None
            forwards = chosen[1].forwards[starts[id(self._chosen)]:] if chosen else []
            self._micro_batches.append(MicroBatch(forwards=list(forwards), inputs=self._inputs(batch)))

    def _keep_only(self, module) -> None:
        for key, (_, recorder) in list(self._recorders.items()):
            if key != id(module):
                recorder.remove()
                del self._recorders[key]

    def _inputs(self, batch):
        if self.loss_fn is not None:
            return {"batch": batch}  # the batch as training_step got it, for loss_fn (tensors copied by the replay)
        return batch if isinstance(batch, Mapping) else None

    def _before_optimizer_step(self, trainer):
        def wrapper(original, optimizer, *args, **kwargs):
            result = original(optimizer, *args, **kwargs)  # the user's own hook first: it is part of the gradient
            if self.state == WATCHING and trainer.lightning_module.automatic_optimization:
                self._judge(trainer)
            return result
        return wrapper

    def _judge(self, trainer) -> None:
        self.state = JUDGED
        pl_module = self.pl_module
        chosen = self._recorders.get(id(self._chosen)) if self._chosen is not None else None
        if chosen is None:  # training_step called no module: nothing recorded to replay
            chosen = (pl_module, next(iter(self._recorders.values()))[1])
        module, recorder = chosen
        if self.loss_fn is not None:
            user = self.loss_fn
            rule = losses.LossRule(losses.USER_LOSS, loss_fn=lambda model, inputs: user(model, inputs["batch"]))
            module = pl_module
        else:
            rule = losses.LossRule(None)
        precision = str(trainer.precision)
        precision = "bf16" if "bf16" in precision else "fp16" if precision.startswith("16") else "fp32"
        wrapped = trainer.strategy.model
        no_sync = getattr(wrapped, "no_sync", None) if wrapped is not None and wrapped is not pl_module else None
        setup = Setup(who=Integration.LIGHTNING, module=module, recorder=recorder, k=trainer.accumulate_grad_batches,
                      num_processes=trainer.world_size, precision=precision, rule=rule,
                      custom_loss="loss_fn" if self.loss_fn else None, no_sync=no_sync or contextlib.nullcontext,
                      model_name=losses.model_name(self._chosen if self._chosen is not None else pl_module))
        verdict = measure(setup, self._micro_batches, self.log, backwards=self._backwards)
        self.verdict = in_lightning_terms(verdict, kind_items(verdict))

    def _finish(self, trainer) -> None:
        if self.state not in (WATCHING, JUDGED):
            return
        state, self.state = self.state, DONE
        self.log.detach()
        self.patches.undo()
        for _, recorder in self._recorders.values():
            recorder.remove()
        if state != JUDGED or self.verdict is None:
            return
        self.verdict = replace(self.verdict, checks=self.verdict.checks + (self._scheduler_check(),
                                                                           *self._window_check(trainer)))
        if trainer.is_global_zero:
            publish(self.verdict, self.json_path)

    def _scheduler_check(self) -> Check:
        return scheduler_check(self.log.scheduler_steps, "return it from configure_optimizers ({'scheduler': ..., "
                               "'interval': 'step'}) and let Lightning step it; do not call scheduler.step() in "
                               "training_step")

    def _window_check(self, trainer) -> tuple:
        """The first window judged while the epoch ends with a short one: say it was not judged, and how."""
        batches, k = trainer.num_training_batches, trainer.accumulate_grad_batches
        if self.window != "first" or not isinstance(batches, int) or k <= 1 or not batches % k or batches < k:
            return ()
        return (Check(CheckName.LAST_WINDOW, None,
                      f"the epoch's last window holds {batches % k} of {k} micro-batches and was "
                      "not judged: AuditCallback(window='last') judges it (Lightning #19987)"),)


def kind_items(verdict: Verdict) -> str:
    """How the fix counts a micro-batch's items, when the audit knows the model's kind."""
    return f" ({ITEMS[verdict.kind]})" if verdict.kind in ITEMS else ""


def in_lightning_terms(verdict: Verdict, items: str) -> Verdict:
    """The verdict's fix (and a clipping check's) in Lightning's terms; what to pass when the loss is not judged."""
    fix = FIXES.get(verdict.gradient)
    changes = {}
    if fix is not None:
        changes["fix"] = fix.format(items=items, j=verdict.micro_batches, k=verdict.k)
        if verdict.router is not None:
            changes["fix"] += {WEIGHTED: ROUTER_KEPT, SHORT_WINDOW: ROUTER_SHORT}.get(verdict.gradient, "")
    if verdict.gradient == K_TIMES:  # the catalogue's reason is Trainer's or Accelerate's
        changes["meaning"] = (verdict.meaning.split("): ", 1)[0] + "): training_step returned k× each micro-batch's "
                              "mean loss, and Lightning divided it by k")
    if not verdict.judged and "loss_fn" in verdict.meaning:
        changes["meaning"] = verdict.meaning.split(": pass loss_fn")[0] + f": pass {LOSS_FN}"
    router_fix = {CheckName.ROUTER_LOSS: ROUTER_SHORT_CHECK} if verdict.gradient == SHORT_WINDOW else {}
    check_fixes = {CheckName.CLIPPING: FIXES[CLIPPED], **router_fix}
    checks = tuple(replace(c, fix=check_fixes[c.name]) if c.name in check_fixes and c.ok is False else c
                   for c in verdict.checks)
    return replace(verdict, checks=checks, **changes)
