"""The reference: the gradient the audited step should apply, recomputed on the window's own micro-batches.

One pass over the whole window when no dropout is active (falling back to one pass per micro-batch when that runs
out of memory), else one pass per micro-batch replayed from the window's random state, so the dropout masks are the
run's own and the comparison stays exact. Gradients, buffers and every random state are put back afterwards: the
user's run goes on bit-identical to a run without the audit.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

from gradacc.training.windows import loss_weight


def batch_items(batch: dict, shifts_labels: bool = False) -> int:
    """Items a micro-batch adds to the loss: its labels other than -100 (a causal LM's from the second token)."""
    labels = batch["labels"]
    if labels.dim() > 1 and shifts_labels:
        labels = labels[..., 1:]
    return int((labels != -100).sum())


def shifts_labels(model) -> bool:
    """Whether the model's own loss predicts label t+1 at position t (a causal LM): its items are its labels from
    the second token. Read from the loss function the model uses, not from its class name (GPT2LMHeadModel's
    name says nothing of it)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    try:
        return model.loss_function is ForCausalLMLoss
    except AttributeError:  # not a transformers model
        return model.__class__.__name__.endswith("ForCausalLM")


def dropout_active(model) -> bool:
    import torch

    return any(isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0 and module.training
               for module in model.modules())


@dataclass
class RandomState:
    """Every random state a training loop draws from, taken and put back whole."""

    states: dict = field(default_factory=dict)

    @classmethod
    def take(cls) -> "RandomState":
        import numpy as np
        import torch

        states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        return cls(states)

    def put_back(self) -> None:
        import numpy as np
        import torch

        random.setstate(self.states["python"])
        np.random.set_state(self.states["numpy"])
        torch.set_rng_state(self.states["torch"])
        if "cuda" in self.states:
            torch.cuda.set_rng_state_all(self.states["cuda"])


@contextlib.contextmanager
def set_aside(model):
    """Gradients and buffers (BatchNorm statistics) put aside and back, and random states restored: what
    runs inside leaves the user's run as it found it."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    rng = RandomState.take()
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, grad in zip(params, grads):
            p.grad = grad
        for b, saved in buffers:
            b.data.copy_(saved)
        rng.put_back()


def concatenate(batches: list[dict]) -> dict:
    """One batch of all the micro-batches, right-padded to the longest (labels with -100, the rest with 0; the
    attention mask keeps the padding out). ValueError, with the reason, for micro-batches it cannot join."""
    import torch
    import torch.nn.functional as F

    joined = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        if not all(torch.is_tensor(v) for v in values):
            raise ValueError(f"{key!r} is not a tensor")
        width = max(v.shape[-1] for v in values) if values[0].dim() > 1 else None
        if width is not None and any(v.shape[-1] != width for v in values):
            if "attention_mask" not in batches[0]:
                raise ValueError("micro-batches of different lengths without an attention mask")
            values = [F.pad(v, (0, width - v.shape[-1]), value=-100 if key == "labels" else 0) for v in values]
        joined[key] = torch.cat(values)
    return joined


def reference_gradient(model, batches: list[dict], loss_fn, items: list[int], window_items: int,
                       replay: RandomState | None = None, autocast=contextlib.nullcontext) -> dict:
    """The gradient of the mean loss over the window's items (``window_items``, on all ranks) from this
    rank's ``batches``, at the model's current weights, with the run's own gradients set aside.

    ``loss_fn(model, batch)`` is the mean loss over a batch's items. ``replay``: the random state the window
    started from; the micro-batches are then replayed one by one from it (the run's dropout masks). Else one
    pass over the concatenated window, or one per micro-batch when that runs out of memory. Returns
    ``gradient`` (name → flat tensor, not yet summed over ranks), ``loss`` (this rank's share of the window's
    mean loss) and ``mode``.
    """
    import torch

    def per_micro_batch():
        total = 0.0
        for batch, n in zip(batches, items):
            with autocast():
                # gradacc's exact weight: the micro-batch's share of the window's items (summed over ranks after).
                loss = loss_fn(model, batch) * loss_weight("exact", n, window_items, len(batches))
            loss.backward()
            total += float(loss.detach())
        return total

    with set_aside(model):
        if replay is not None:
            replay.put_back()
            loss, mode = per_micro_batch(), "replayed per micro-batch (dropout on: the run's own masks)"
        else:
            try:
                joined = concatenate(batches) if len(batches) > 1 else batches[0]
            except ValueError as reason:
                joined, why = None, str(reason)
            if joined is not None:
                try:
                    with autocast():
                        loss = loss_fn(model, joined) * (sum(items) / window_items)
                    loss.backward()
                    loss, mode = float(loss.detach()), "one pass over the window"
                except torch.OutOfMemoryError:
                    model.zero_grad(set_to_none=True)
                    joined, why = None, "the whole window did not fit in memory"
            if joined is None:
                loss, mode = per_micro_batch(), f"per micro-batch ({why})"
        # No copy: these gradients are the reference's own, and set_aside puts the run's back in their place.
        gradient = live_gradients(model)
    return {"gradient": gradient, "loss": loss, "mode": mode}


def sum_over_ranks(gradient: dict, loss: float) -> tuple[dict, float]:
    """The ranks' shares of the reference added up (one all-reduce), on one process as they are."""
    from gradacc.training import distributed

    if not distributed.is_distributed():
        return gradient, loss
    import torch
    import torch.distributed as dist

    names = sorted(gradient)
    flat = torch.cat([gradient[n] for n in names] + [torch.tensor([loss], device=gradient[names[0]].device)])
    dist.all_reduce(flat)
    out, start = {}, 0
    for n in names:
        out[n] = flat[start:start + gradient[n].numel()]
        start += gradient[n].numel()
    return out, float(flat[-1])


def live_gradients(model) -> dict:
    """The gradients as they are now, flat, without a copy (a copy of a 20M-parameter gradient costs a good
    part of a window): read at once, before the optimizer steps."""
    return {name.removeprefix("module."): p.grad.detach().float().flatten()
            for name, p in model.named_parameters() if p.grad is not None}


def window_items(items: list[int], device) -> float:
    """The window's items on all ranks (one all-reduce; this rank's own on one process)."""
    from gradacc.training import distributed

    return distributed.sum_over_ranks([float(sum(items))], device)[0]
