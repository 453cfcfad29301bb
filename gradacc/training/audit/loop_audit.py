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

from gradacc.training import distributed
from gradacc.training.audit import losses
from gradacc.training.audit.capture import micro_batches
from gradacc.training.audit.measure import Setup, measure
from gradacc.training.audit.verdict import NOT_JUDGED, Check, Verdict, scheduler_check
from gradacc.training.audit.vocabulary import Integration
from gradacc.training.audit.watch import WindowWatch


class LoopAudit(WindowWatch):
    """Watches the first window of the plain loop that trains ``model`` with ``optimizer``; ``verdict`` after the
    window's optimizer step (None before it). ``loss_fn`` and ``json_path``: see ``audit_loop``."""

    sync_fix = ("run the window's micro-batches before its last inside `with model.no_sync():` (DDP all-reduces "
                "every backward otherwise)")

    def __init__(self, model, optimizer, loss_fn=None, json_path=None):
        module = distributed.unwrap(model)
        self._withdrawn = False
        # The DDP wrapper, or found at the first forward (_find_ddp) when the loop wraps after building the optimizer.
        super().__init__(module, optimizer, loss_fn, json_path, ddp=model if model is not module else None)

    def _find_ddp(self) -> None:
        if self._ddp is None and not self.recorder.forwards and distributed.is_distributed():
            self._ddp = _ddp_around(self.module)  # wrapped after the optimizer was built (nanoGPT's order)

    def _judge(self) -> Verdict:
        rule = losses.LossRule(losses.USER_LOSS if self.loss_fn else None, loss_fn=self.loss_fn)
        no_sync = self._ddp.no_sync if self._ddp is not None else None  # the replays all-reduce nothing
        setup = Setup(who=Integration.LOOP, module=self.module, recorder=self.recorder, k=self.micro_batch_count(),
                      num_processes=_processes() if self._shares_gradients() else 1, precision="fp32", rule=rule,
                      custom_loss="loss_fn" if self.loss_fn else None, no_sync=no_sync or contextlib.nullcontext,
                      model_name=losses.model_name(self.module))
        try:
            return measure(setup, micro_batches(self.recorder.forwards), self.log)
        except Exception as error:  # attached to any loop by `gradacc audit --`: the audit never breaks the run
            return Verdict(who=Integration.LOOP, kind=None, k=setup.k, micro_batches=setup.k,
                           num_processes=setup.num_processes, precision="fp32", gradient=NOT_JUDGED,
                           meaning=f"the audit could not replay this loop ({type(error).__name__}: {error})",
                           model=setup.model_name)

    def _shares_gradients(self) -> bool:
        """DDP all-reduces the gradients; FSDP's are sharded tensors (DTensor) over the processes."""
        return self._ddp is not None or any(type(p).__name__ == "DTensor" for p in self.module.parameters())

    def _unjudged(self) -> Verdict | None:
        """A loop that never stepped is "not judged", and says so (None when the audit was withdrawn)."""
        if self._withdrawn:
            return None
        count = self.micro_batch_count()
        ran = (f"the loop ran {count} forward{'s' if count != 1 else ''} of the model with gradients on"
               if count else "the model ran no forward with gradients on")
        return Verdict(who=Integration.LOOP, kind=None, k=0, micro_batches=count, num_processes=_processes(),
                       precision="fp32", gradient=NOT_JUDGED, meaning=f"{ran} and optimizer.step() never ran",
                       model=losses.model_name(self.module))

    def _scheduler_check(self) -> Check:
        return scheduler_check(self.log.scheduler_steps,
                               "call scheduler.step() right after optimizer.step(), once per window")

    def _is_main_process(self) -> bool:
        return distributed.is_main_process()

    def cancel(self) -> None:
        """Stop watching without a verdict: the optimizer turned out to be a framework's (Accelerate prepared it)."""
        self._withdrawn, self._verdict = True, None
        self.finish()


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
