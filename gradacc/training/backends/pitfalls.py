"""What the plain loop's deliberate mistakes (``--pitfall``) did, measured in the same run against the right loop.

Each pitfall is one wrong line in gradacc/training/backends/pytorch_loop.py (``if job.pitfall(NAME): ...  # WRONG``)
beside the right one. A run with pitfalls attaches a ``Probe``, which works out from what the run itself did what
the right loop would have done at the same optimizer step:

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

import torch

from gradacc.training.windows import loss_weight
from gradacc.training.backends.optimizer import make_scheduler


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
