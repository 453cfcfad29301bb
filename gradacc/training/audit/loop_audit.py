"""The audit of a plain PyTorch loop (the seed's first approach, nanoGPT's), one line before it:

    audit = audit_loop(model, optimizer)
    for step, batch in enumerate(loader):         # the loop, unchanged
        loss = model(**batch).loss / k
        loss.backward()
        if (step + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(audit.verdict.line)

A plain loop names no k: the window is what the loop ran before its first ``optimizer.step()``. Each forward of the
model with gradients on is a micro-batch; the gradient is judged inside that step (after a ``GradScaler`` unscaled it,
as ``scaler.step`` does first; the loop's clipping is read and its factor undone), before the step. Scheduler steps
are counted until the next window's first forward (or until ``audit.verdict`` is read). On several processes
(DistributedDataParallel), ``model`` is the DDP wrapper: the window's items are counted on every rank and the
all-reduces per micro-batch are counted. The run stays bit-identical to one without the audit.

The loss: a 🤗 model with labels in the batch is judged against its kind's loss, computed here from its logits; any
other model (nanoGPT's ``model(x, y) -> (logits, loss)``, a loss computed outside the model) needs
``loss_fn(model, batch) -> (summed loss, items)``, where ``batch`` is what the forward was given: its keyword
arguments for ``model(**batch)``, else its positional ones (``(x, y)``). Without it the verdict is "not judged", with
what it needs.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import replace

from gradacc.training import distributed
from gradacc.training.audit import losses
from gradacc.training.audit.capture import Patches, Recorder, WindowLog, micro_batches
from gradacc.training.audit.measure import Setup, measure
from gradacc.training.audit.verdict import NOT_JUDGED, Check, Verdict, publish, scheduler_check
from gradacc.training.audit.vocabulary import CheckName, Integration
from gradacc.training.compat.torch import ddp_syncs_next_backward

WATCHING, JUDGED, DONE = "watching", "judged", "done"


class LoopAudit:
    """Watches the first window of the plain loop that trains ``model`` with ``optimizer``; ``verdict`` after the
    window's optimizer step (None before it). ``loss_fn`` and ``json_path``: see ``audit_loop``."""

    def __init__(self, model, optimizer, loss_fn=None, json_path=None):
        self.module = distributed.unwrap(model)
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.json_path = json_path
        self.state = WATCHING
        self._verdict: Verdict | None = None
        self._withdrawn = False
        self._ddp = model if model is not self.module else None  # the DDP wrapper, found at the first forward if not
        self.synced: list[bool] = []  # per micro-batch: did its backward all-reduce? (DDP's own flag, read)
        self.recorder = Recorder(self.module, on_forward=self._on_forward)
        self.recorder.recording = True
        self.log = WindowLog(self._micro_batch_count, optimizer, self.module)
        self.log.attach()
        self.patches = Patches()
        self.patches.method(optimizer, "step", self._step)

    def _micro_batch_count(self) -> int:
        return sum(1 for f in self.recorder.forwards if f.grad)

    def _on_forward(self, grad: bool) -> None:
        if not grad:
            return
        if self.state == JUDGED:  # the next window's first forward: the judged window is over
            self.finish()
        elif self.state == WATCHING:
            if self._ddp is None and not self.recorder.forwards and distributed.is_distributed():
                self._ddp = _ddp_around(self.module)  # wrapped after the optimizer was built (nanoGPT's order)
            if self._ddp is not None:  # DDP's forward reads it: False inside no_sync(), or set by the loop itself
                self.synced.append(ddp_syncs_next_backward(self._ddp))

    def _step(self, original, *args, **kwargs):
        if self.state == WATCHING and self._micro_batch_count():
            self._judge()
        return original(*args, **kwargs)

    def _judge(self) -> None:
        self.recorder.recording = False
        self.state = JUDGED
        forwards = self.recorder.forwards
        rule = losses.LossRule(losses.USER_LOSS if self.loss_fn else None, loss_fn=self.loss_fn)
        no_sync = self._ddp.no_sync if self._ddp is not None else None  # the replays all-reduce nothing
        setup = Setup(who=Integration.LOOP, module=self.module, recorder=self.recorder, k=self._micro_batch_count(),
                      num_processes=_processes() if self._shares_gradients() else 1, precision="fp32", rule=rule,
                      custom_loss="loss_fn" if self.loss_fn else None, no_sync=no_sync or contextlib.nullcontext,
                      model_name=losses.model_name(self.module))
        try:
            self._verdict = measure(setup, micro_batches(forwards), self.log)
        except Exception as error:  # attached to any loop by `gradacc audit --`: the audit never breaks the run
            self._verdict = Verdict(who=Integration.LOOP, kind=None, k=setup.k, micro_batches=setup.k,
                                    num_processes=setup.num_processes, precision="fp32", gradient=NOT_JUDGED,
                                    meaning=f"the audit could not replay this loop ({type(error).__name__}: {error})",
                                    model=setup.model_name)

    def _shares_gradients(self) -> bool:
        """DDP all-reduces the gradients; FSDP's are sharded tensors (DTensor) over the processes."""
        return self._ddp is not None or any(type(p).__name__ == "DTensor" for p in self.module.parameters())

    def finish(self) -> Verdict | None:
        """Stop watching; the verdict with its scheduler and sync checks, or "not judged" for a loop that never
        stepped (None when the audit was withdrawn)."""
        if self.state == DONE:
            return self._verdict
        state, self.state = self.state, DONE
        self.log.detach()
        self.patches.undo()
        self.recorder.remove()
        if self._withdrawn:
            return None
        if state == WATCHING:
            self._verdict = self._never_stepped()
            if distributed.is_main_process():
                publish(self._verdict, self.json_path)
            return self._verdict
        checks = [scheduler_check(self.log.scheduler_steps,
                                  "call scheduler.step() right after optimizer.step(), once per window")]
        if self.synced:
            count = sum(self.synced)
            ok = count <= 1
            checks.append(Check(CheckName.SYNC, ok,
                                f"gradients all-reduced in {count} of {len(self.synced)} micro-batches",
                                None if ok else "run the window's micro-batches before its last inside "
                                "`with model.no_sync():` (DDP all-reduces every backward otherwise)"))
        self._verdict = replace(self._verdict, checks=self._verdict.checks + tuple(checks))
        if distributed.is_main_process():
            publish(self._verdict, self.json_path)
        return self._verdict

    def cancel(self) -> None:
        """Stop watching without a verdict: the optimizer turned out to be a framework's (Accelerate prepared it)."""
        self._withdrawn, self._verdict = True, None
        self.finish()

    def _never_stepped(self) -> Verdict:
        count = self._micro_batch_count()
        ran = (f"the loop ran {count} forward{'s' if count != 1 else ''} of the model with gradients on"
               if count else "the model ran no forward with gradients on")
        return Verdict(who=Integration.LOOP, kind=None, k=0, micro_batches=count, num_processes=_processes(),
                       precision="fp32", gradient=NOT_JUDGED, meaning=f"{ran} and optimizer.step() never ran",
                       model=losses.model_name(self.module))

    @property
    def verdict(self) -> Verdict | None:
        """The verdict (None until the first window's optimizer step); reading it ends the watch."""
        return self.finish() if self.state == JUDGED else self._verdict


def _ddp_around(module):
    """The DistributedDataParallel wrapping ``module`` (None: none), looked up once among the live objects."""
    from torch.nn.parallel import DistributedDataParallel  # here: only a loop on several processes looks

    return next((o for o in gc.get_objects() if issubclass(type(o), DistributedDataParallel) and o.module is module),
                None)


def _processes() -> int:
    import torch.distributed as dist  # here: only a loop on several processes has a process group to ask

    return dist.get_world_size() if distributed.is_distributed() else 1


def audit_loop(model, optimizer, *, loss_fn=None, json_path=None) -> LoopAudit:
    """``audit = audit_loop(model, optimizer)`` one line before your loop; ``audit.verdict`` after its first
    ``optimizer.step()``.

    ``model``: the module your loop calls (the DDP wrapper on several processes); ``optimizer``: the one it steps.
    ``loss_fn(model, batch) -> (summed loss, items)``: for a model whose loss is not a 🤗 head's from labels
    (nanoGPT's ``model(x, y)``; a loss computed outside the model); ``batch`` is the forward's keyword arguments, or
    its positional ones. A ``loss_fn`` returning one tensor is taken as the mean over the batch's rows.
    ``json_path``: the verdict also goes there as JSON."""
    attached = vars(optimizer).get("_gradacc_loop_audit")
    if attached is not None:  # under `gradacc audit --`: the script's own call replaces the one attached for it
        attached.cancel()
        json_path = json_path or attached.json_path
    audit = LoopAudit(model, optimizer, loss_fn, json_path)
    optimizer._gradacc_loop_audit = audit
    return audit
