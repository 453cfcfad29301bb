"""Break it on purpose: five real upstream mistakes, each a hook on the plain loop's objects, and what they did,
measured in the same run against the right loop.

The plain loop (gradacc/training/backends/pytorch_loop.py) is the right one and stays so. A run that names a pitfall
(``--pitfall NAME``, the Train page's "Break it on purpose") gets that pitfall's hook below on the loop's model,
optimizer, scheduler, window rule or window tally: it does the one wrong thing where the wrong line would have done
it, so the run trains exactly as a loop with that line would. ``@pitfall(NAME, breaks=CALL)`` names the call whose
line in the loop the hook gets wrong: the Code page reads both from this file's syntax tree and shows the hook beside
that line.

A run with pitfalls also attaches a ``Probe``, which works out from what the run itself did what the right loop would
have done at the same optimizer step:

- the planned learning rate: a second schedule made by the same ``make_scheduler`` and stepped exactly once per
  optimizer step, read beside the learning rate the run logged;
- the right gradient: each micro-batch's gradient as backward() computes it (a hook on every parameter sees it
  before it is added to ``.grad``), summed since the last step and clipped once, against the gradient the
  optimizer really stepped with (a step pre-hook reads ``.grad``): the ratio of their norms and the cosine of
  the angle between them;
- the examples behind each step: counted since ``.grad`` was last empty, against those seen since the last step;
- the right window loss: each micro-batch's mean loss (a forward hook) weighted as ``loss_weight`` weights it,
  against the loss the run logged.

Every step event of such a run carries these figures as ``pitfall``; gradacc.training.run.health turns them into
``run_ended`` warnings. Runs without pitfalls attach nothing and pay nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from gradacc.training.backends.optimizer import clip_gradients, make_scheduler
from gradacc.training.compat.torch import at_end_of_backward
from gradacc.training.windows import WindowRule, loss_weight

HOOKS: dict[str, Callable] = {}  # pitfall name: the function that installs its hook


@dataclass
class Loop:
    """The plain loop's objects a pitfall hooks, and the window rule's answer for the micro-batch now running."""

    job: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: object
    windows: WindowRule
    window: object  # the loop's WindowTally
    closing: bool = False


def install(job, report, model, optimizer, lr_scheduler, windows, window) -> None:
    """Hook each pitfall the run names onto the loop's objects, and attach the probe that measures them."""
    if not job.config.pitfalls:
        return
    loop = Loop(job, model, optimizer, lr_scheduler, windows, window)
    for name in job.config.pitfalls:
        HOOKS[name](loop)
    windows.closes = _noting(loop, windows.closes)  # after the hooks: the rule the loop follows, a pitfall's or not
    report.pitfall_probe = Probe(job, model, optimizer)


def _noting(loop: Loop, closes: Callable[[int, int], bool]) -> Callable[[int, int], bool]:
    """The window rule ``closes``, its answer for the micro-batch the loop asks about kept in ``loop.closing``."""
    def closes_and_notes(index: int, num_micro_batches: int) -> bool:
        loop.closing = closes(index, num_micro_batches)
        return loop.closing
    return closes_and_notes


def pitfall(name: str, breaks: str):
    """Registers a pitfall's hook; ``breaks``: the call in the plain loop whose line it gets wrong."""
    def register(install_hook):
        HOOKS[name] = install_hook
        return install_hook
    return register


def after_backward(model: torch.nn.Module, callback: Callable[[], None]) -> None:
    """Call ``callback`` after every training micro-batch's backward, once its gradients are all in ``.grad``."""
    def on_forward(module, args, output):
        loss = getattr(output, "loss", None)
        if module.training and loss is not None and loss.requires_grad:
            loss.register_hook(lambda grad: at_end_of_backward(callback))
    model.register_forward_hook(on_forward)


@pitfall("scheduler-per-micro-batch", breaks="lr_scheduler.step")
def scheduler_per_micro_batch(loop: Loop) -> None:
    """The scheduler steps after every micro-batch: k schedule steps per optimizer step, the schedule k× too fast."""
    def step_the_schedule():
        if not loop.closing:  # after the window's last micro-batch the loop steps it itself
            loop.lr_scheduler.step()  # WRONG: once per micro-batch
    after_backward(loop.model, step_the_schedule)


@pitfall("clip-per-micro-batch", breaks="clip_gradients")
def clip_per_micro_batch(loop: Loop) -> None:
    """The gradients are clipped after every micro-batch's backward: k clips of partial sums turn the gradient."""
    def clip():
        clip_gradients(loop.model, loop.job.config.max_grad_norm)  # WRONG: k clips of partial sums, not one
    after_backward(loop.model, clip)


@pitfall("zero-grad-per-micro-batch", breaks="optimizer.zero_grad")
def zero_grad_per_micro_batch(loop: Loop) -> None:
    """The gradients are zeroed before every micro-batch: a step keeps only its window's last micro-batch."""
    def before_forward(module, args):
        if module.training:  # not evaluation's forward passes
            loop.optimizer.zero_grad()  # WRONG: inside the window
    loop.model.register_forward_pre_hook(before_forward)


@pitfall("log-undivided-loss", breaks="window.add")
def log_undivided_loss(loop: Loop) -> None:
    """The log gets each micro-batch's loss as the model returned it, not the scaled one: k× the window's loss."""
    returned = {}

    def keep_loss(module, args, output):
        if module.training:
            returned["loss"] = output.loss
    loop.model.register_forward_hook(keep_loss)
    add = loop.window.add
    loop.window.add = lambda loss, activation_bytes: add(returned["loss"].item(), activation_bytes)  # WRONG: not ÷ k


@pitfall("drop-last-window", breaks="windows.closes")
def drop_last_window(loop: Loop) -> None:
    """Only every k-th micro-batch closes a window: the epoch's short last window never steps."""
    k = loop.job.config.grad_accum_steps
    loop.windows.closes = lambda index, num_micro_batches: (index + 1) % k == 0  # WRONG: forgets the epoch's end


class Probe:
    """Hooks on one model and its optimizer (one process); ``take()`` gives the figures of the last optimizer step."""

    def __init__(self, job, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.job = job
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.right = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.micro_batch_index = -1  # in the epoch, as the loop's dataloader index
        self.pending = 0  # examples of the micro-batch whose backward comes next
        self.counted = True  # whether that backward has been counted yet
        self.examples_in_grad = 0  # examples whose gradient is in .grad now
        self.examples_seen = 0  # since the last optimizer step
        self.examples_trained = 0  # in all steps so far
        self.right_loss = 0.0
        self.figures: dict | None = None
        self._planned_optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=job.config.learning_rate)
        self.planned = make_scheduler(self._planned_optimizer, job.config, job.total_steps)
        self.handles = [p.register_hook(self._gradient_hook(p, right)) for p, right in zip(self.params, self.right)]
        self.handles.append(model.register_forward_hook(self._forward_hook))
        self.handles.append(optimizer.register_step_pre_hook(self._before_step))

    @classmethod
    def attach(cls, job, model, optimizer) -> "Probe | None":
        """A probe when the run asks for pitfalls; None otherwise."""
        return cls(job, model, optimizer) if job.config.pitfalls else None

    def micro_batch(self, examples: int) -> None:
        """Called before each micro-batch's forward pass."""
        self.micro_batch_index = (self.micro_batch_index + 1) % len(self.job.micro_batches)
        self.pending, self.counted = examples, False
        self.examples_seen += examples

    def _forward_hook(self, module, args, output) -> None:
        loss = getattr(output, "loss", None)
        if not module.training or loss is None:
            return  # evaluation, or a forward without labels
        config, index = self.job.config, self.micro_batch_index
        weight = loss_weight(config.loss_normalization, self.job.batch_items[index], self.job.window_items[index],
                             config.grad_accum_steps)
        self.right_loss += float(loss.detach()) * weight

    def _gradient_hook(self, param, right):
        def hook(grad):
            if not self.counted:  # the first parameter this backward reaches: were the gradients emptied?
                self.counted = True
                self.examples_in_grad = self.pending + (0 if param.grad is None else self.examples_in_grad)
            right.add_(grad.detach().float())
        return hook

    def _before_step(self, optimizer, args, kwargs) -> None:
        limit = self.job.config.max_grad_norm
        right_norm = _norm(self.right)
        stepped = [(p.grad, right) for p, right in zip(self.params, self.right) if p.grad is not None]
        stepped_norm = _norm([grad for grad, _ in stepped])
        dot = sum(float((grad.detach().float() * right).sum()) for grad, right in stepped)
        self.examples_trained += self.examples_in_grad
        self.figures = {
            "planned_lr": self.planned.get_last_lr()[0],
            "grad_norm_stepped": stepped_norm,
            "grad_norm_right": min(right_norm, limit) if limit > 0 else right_norm,  # clipped once, as it should be
            # Clipping scales, so the angle is the same before and after the right clip.
            "grad_cosine": dot / (stepped_norm * right_norm) if stepped_norm and right_norm else None,
            "examples_stepped": self.examples_in_grad, "examples_seen": self.examples_seen,
            "examples_trained": self.examples_trained, "loss_right": self.right_loss}
        self._planned_optimizer.step()  # a no-op (no gradient); keeps torch from warning about the order
        self.planned.step()
        for right in self.right:
            right.zero_()
        self.examples_seen, self.right_loss = 0, 0.0

    def take(self) -> dict | None:
        figures, self.figures = self.figures, None
        return figures


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.detach().float().pow(2).sum()) for t in tensors))
