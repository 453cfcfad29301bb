"""What the audited window did, recorded as the run does it: each forward of the model (its inputs, the random
state and autocast it ran under, a fingerprint of its output), each micro-batch, each clipping call (the norm
before and after), each effective ``zero_grad`` and each scheduler step.

Nothing here changes what the run computes: hooks read, patches call through. Each patch is put back as it was.
The clipping and scheduler patches are process-wide (module and class attributes), so they count only calls
from the thread that runs the audited loop (the app trains other visitors' runs in other threads).
"""

from __future__ import annotations

import math
import random
import threading
import types
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.utils
from torch.optim.lr_scheduler import LRScheduler

from gradacc.training.compat.torch import keep_scheduler_mark

# How many values of a forward's output the fingerprint keeps (beside its shape, dtype and exact sum): a replay
# that reproduces the output bit for bit reproduces all of them; a full copy of an LM's logits would cost memory.
FINGERPRINT_VALUES = 4096
AUTOCAST_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class RandomState:
    """Every random state a training loop draws from, taken and put back whole."""

    python: object
    numpy: object
    torch_cpu: torch.Tensor
    cuda: tuple | None

    @classmethod
    def take(cls) -> "RandomState":
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)

    def put_back(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        self.put_back_torch()

    def put_back_torch(self) -> None:
        """Torch's generators only: what dropout draws from (``nn.Dropout``, functional dropout, SDPA's)."""
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(list(self.cuda))


def autocast_state() -> tuple:
    """(device, enabled, dtype) for each device type autocast may be on for."""
    return tuple((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                 for device in AUTOCAST_DEVICES if device == "cpu" or torch.cuda.is_available())


def main_tensor(output):
    """The output a replay must reproduce: ``logits``, or TRL's fused ``log_probs``; else the first tensor."""
    for name in ("logits", "log_probs"):
        value = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if torch.is_tensor(value):
            return value
    if torch.is_tensor(output):
        return output
    if isinstance(output, (tuple, list)):
        tensors = [t for t in output if torch.is_tensor(t) and t.dim() > 0]
        return tensors[0] if tensors else None
    return None


@dataclass(frozen=True)
class Fingerprint:
    shape: tuple
    dtype: torch.dtype
    total: float
    values: torch.Tensor

    @classmethod
    def of(cls, tensor) -> "Fingerprint | None":
        if tensor is None:
            return None
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // FINGERPRINT_VALUES)
        return cls(tuple(tensor.shape), tensor.dtype, float(torch.sum(flat, dtype=torch.float64)),
                   flat[::step].clone())

    def matches(self, other: "Fingerprint | None") -> bool:
        return (other is not None and self.shape == other.shape and self.dtype == other.dtype
                and (self.total == other.total or (math.isnan(self.total) and math.isnan(other.total)))
                and torch.equal(self.values, other.values))


def detached(value):
    """A copy of a forward's inputs that later steps of the run cannot change (tensors cloned, containers rebuilt)."""
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, dict):
        return type(value)((k, detached(v)) for k, v in value.items()) if type(value) is dict else \
            {k: detached(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(detached(v) for v in value)
    return value


@dataclass
class Forward:
    """One call of the watched model."""

    args: tuple
    kwargs: dict
    rng: RandomState
    autocast: tuple
    grad: bool
    output: Fingerprint | None = None


@dataclass
class MicroBatch:
    """One micro-batch of the window: its forwards, and (Trainer) what its compute_loss was given."""

    forwards: list = field(default_factory=list)
    inputs: dict | None = None          # Trainer: compute_loss's inputs, labels included
    rng: RandomState | None = None      # Trainer: the random state compute_loss started from
    counted_items: float | None = None  # Trainer: num_items_in_batch (what it divides the window's loss by)
    returned: float | None = None       # Trainer: what compute_loss returned (the loss it back-propagates, before ÷k)

    @property
    def trained(self) -> Forward | None:
        """The forward whose loss is back-propagated: the first with gradients on."""
        return next((f for f in self.forwards if f.grad), None)


def micro_batches(forwards: list) -> list[MicroBatch]:
    """The recorded forwards split into micro-batches: each forward with gradients on opens one."""
    out = []
    for forward in forwards:
        if forward.grad:
            out.append(MicroBatch(forwards=[forward]))
        elif out:
            out[-1].forwards.append(forward)
    return out


class Recorder:
    """Forward hooks on the watched model: records each forward while recording, fingerprints each forward while
    replaying (to compare with the recorded ones), and sees nothing otherwise."""

    def __init__(self, module, on_forward=None):
        """``on_forward(grad)``: called before each of the run's forwards (not a replay's), recording or not."""
        self.module = module
        self.recording = False
        self.replayed: list[Fingerprint | None] | None = None  # a list while replaying
        self.forwards: list[Forward] = []
        self._on_forward = on_forward
        self._depth = 0
        self._handles = [module.register_forward_pre_hook(self._before, with_kwargs=True),
                         module.register_forward_hook(self._after, with_kwargs=True, always_call=True)]

    def _before(self, module, args, kwargs):
        self._depth += 1
        if self._depth != 1 or self.replayed is not None:
            return
        grad = torch.is_grad_enabled() and module.training
        if self._on_forward is not None:
            self._on_forward(grad)
        if self.recording:
            self.forwards.append(Forward(detached(args), detached(kwargs), RandomState.take(), autocast_state(), grad))

    def _after(self, module, args, kwargs, output):
        self._depth -= 1
        if self._depth:
            return
        if self.replayed is not None:
            self.replayed.append(Fingerprint.of(main_tensor(output)))
        elif self.recording and self.forwards and self.forwards[-1].output is None:
            self.forwards[-1].output = Fingerprint.of(main_tensor(output))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass(frozen=True)
class Clip:
    """One clipping call in the window: after how many micro-batches, and what it did to the gradient's norm."""

    after_micro_batch: int
    max_norm: float
    norm_before: float
    norm_after: float

    @property
    def factor(self) -> float:
        return self.norm_after / self.norm_before if self.norm_before else 1.0


class Patches:
    """Attribute patches, each put back as it was (an instance attribute the user had set, or none)."""

    def __init__(self):
        self._undo = []

    def set(self, owner, name: str, value) -> None:
        missing = object()
        before = vars(owner).get(name, missing) if hasattr(owner, "__dict__") else missing
        setattr(owner, name, value)

        def undo():
            if before is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, before)

        self._undo.append(undo)

    def method(self, owner, name: str, wrapper) -> None:
        """``owner.name`` replaced by a bound method calling ``wrapper(original, *args, **kwargs)``: bound, as torch's
        LR schedulers expect of ``optimizer.step`` (they re-wrap ``step.__func__``)."""
        original = getattr(owner, name)

        def call(_self, *args, **kwargs):
            return wrapper(original, *args, **kwargs)

        keep_scheduler_mark(call, original)  # a scheduler built before would warn the user
        self.set(owner, name, types.MethodType(call, owner))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


class WindowLog:
    """Clipping calls, effective zero_grads (the torch optimizer's, which Accelerate's skips while accumulating, and the
    model's) and scheduler steps of the audited loop, counted by micro-batch."""

    def __init__(self, micro_batches, optimizer, module):
        self._micro_batches = micro_batches  # () -> how many micro-batches the window has run so far
        self._thread = threading.get_ident()
        self._optimizer = optimizer
        self._inner_optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wraps the torch one
        self._module = module
        self.clips: list[Clip] = []
        self.zero_grads: list[int] = []
        self.scheduler_steps = 0
        self.stepped_schedulers: list = []
        self.counting = True
        self.patches = Patches()

    def _ours(self) -> bool:
        return self.counting and threading.get_ident() == self._thread

    def attach(self) -> None:
        for name in ("clip_grad_norm_", "clip_grads_with_norm_"):
            self.patches.set(torch.nn.utils, name, self._clip(name, getattr(torch.nn.utils, name)))
        step = LRScheduler.step
        log = self

        def counted_step(scheduler, *args, **kwargs):
            if log._ours() and getattr(scheduler, "optimizer", None) in (log._optimizer, log._inner_optimizer):
                log.scheduler_steps += 1
                if scheduler not in log.stepped_schedulers:
                    log.stepped_schedulers.append(scheduler)
            return step(scheduler, *args, **kwargs)

        self.patches.set(LRScheduler, "step", counted_step)
        self.patches.method(self._inner_optimizer, "zero_grad", self._zero_grad)
        self.patches.method(self._module, "zero_grad", self._zero_grad)

    def _clip(self, name, original):
        def clip(parameters, max_norm, *args, **kwargs):
            if not (self._ours() and math.isfinite(float(max_norm))):  # an infinite max_norm only measures
                return original(parameters, max_norm, *args, **kwargs)
            result = original(parameters, max_norm, *args, **kwargs)
            # clip_grad_norm_ returns the norm; clip_grads_with_norm_(parameters, max_norm, total_norm) is given it.
            total = float(result if name == "clip_grad_norm_" else (args[0] if args else kwargs["total_norm"]))
            after = self._micro_batches()
            if self.clips and self.clips[-1].after_micro_batch == after and self.clips[-1].norm_before == total:
                return result  # one clipping split over device meshes: one call per mesh, the same norm
            factor = min(1.0, float(max_norm) / (total + 1e-6))  # torch's own
            self.clips.append(Clip(after, float(max_norm), total, total * factor))
            return result

        return clip

    def _zero_grad(self, original, *args, **kwargs):
        if self._ours() and self._micro_batches():
            self.zero_grads.append(self._micro_batches())
        return original(*args, **kwargs)

    def detach(self) -> None:
        self.counting = False
        self.patches.undo()
