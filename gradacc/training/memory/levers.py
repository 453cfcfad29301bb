"""One model under one lever setting (gradient checkpointing, precision, optimizer), measured on padded batches.

What the lever planner (``gradacc plan``, the Memory planner page) and ``gradacc bench levers`` measure, in one
place, with the engine's own pieces: ``measure.ActivationMeter`` for the bytes autograd saves in a training-mode
forward pass (under autocast and checkpointing), the run's optimizer and autocast from ``backends.optimizer`` and ``backends.device``, the
static need from ``budget.static_need``. Every example is padded to ``max_seq_length``: the worst case of a batch,
and the same shape for every size, so activations are a function of m alone.
"""

from __future__ import annotations

import time

import torch

from gradacc.config import RunConfig
from gradacc.training.memory import budget, measure
from gradacc.training.backends.device import Precision, enable_gradient_checkpointing, to_device
from gradacc.training.backends.optimizer import make_optimizer
from gradacc.training import tasks
from gradacc.training.sources import builtin_data

class LeverRig:
    """``model`` loaded once, set up with ``levers`` (any of gradient_checkpointing, precision, optimizer; the
    optimizer can be swapped later); ``examples`` built-in examples to draw batches from."""

    def __init__(self, model: str, max_seq_length: int, levers: dict, *, examples: int = 64, seed: int = 42,
                 dropout: float | None = None, device="cpu"):
        self.device = torch.device(device)
        extra = {} if dropout is None else {"dropout": dropout}  # None: the model's recipe, as a run takes it
        self.config = RunConfig(model=model, max_seq_length=max_seq_length, seed=seed, **extra, **levers).check()
        loaded = tasks.load_model(self.config, len(builtin_data.LABEL_NAMES), list(builtin_data.LABEL_NAMES))
        self.model, self.tokenizer = loaded.model.to(self.device), loaded.tokenizer
        if self.config.gradient_checkpointing:
            enable_gradient_checkpointing(self.model, model)
        self.model.train()  # dropout masks are activations too
        self.precision = Precision(self.config, self.device)
        self.optimizer = None
        self.texts, self.labels = builtin_data.make_sentiment(examples, seed)
        self._batches: dict[int, dict] = {}
        self._meter = measure.ActivationMeter(self.model)
        self.last_activation_bytes_by_dtype: dict[str, int] = {}

    def batch(self, size: int, start: int = 0) -> dict:
        """Examples ``start`` to ``start + size`` of the built-in data, padded to max_seq_length, on the device."""
        if (size, start) not in self._batches:
            texts, labels = self.texts[start:start + size], self.labels[start:start + size]
            encoded = self.tokenizer(texts, padding="max_length", truncation=True,
                                     max_length=self.config.max_seq_length, return_tensors="pt")
            encoded["labels"] = torch.tensor(labels)
            self._batches[(size, start)] = to_device(dict(encoded), self.device)
        return self._batches[(size, start)]

    def activation_bytes(self, size: int) -> int:
        """What autograd saves in one training-mode forward pass of ``size`` examples (nothing is kept)."""
        with self.precision.autocast(), self._meter.measure():
            outputs = self.model(**self.batch(size))
        del outputs  # frees the graph before the next pass
        self.last_activation_bytes_by_dtype = dict(self._meter.bytes_by_dtype)
        return self._meter.bytes

    def forward_backward(self, size: int, weight: float = 1.0, start: int = 0) -> None:
        """One micro-batch of ``size``: its loss × ``weight`` (1/k in a window of k) backward, gradients summed."""
        with self.precision.autocast():
            loss = self.model(**self.batch(size, start)).loss
        self.precision.scale(loss * weight).backward()

    def use_optimizer(self, name: str | None = None) -> None:
        """A fresh optimizer (``name``, else the setting's) over the model's parameters; no state until a step."""
        if name is not None:
            self.config = self.config.replace(optimizer=name)
        self.optimizer = make_optimizer(self.model, self.config, self.device)

    def step(self, zero_grad: bool = True) -> None:
        self.precision.step(self.optimizer)
        if zero_grad:
            self.optimizer.zero_grad(set_to_none=True)

    def window(self, micro_batch_size: int, grad_accum_steps: int) -> None:
        """One optimizer step of an effective batch: k micro-batches of m (the first m × k examples) forward and
        backward, step, zero."""
        for index in range(grad_accum_steps):
            self.forward_backward(micro_batch_size, 1.0 / grad_accum_steps, start=index * micro_batch_size)
        self.step()

    def static_need(self) -> dict:
        """Parameters + gradients + the optimizer's state, as a run's memory budget counts them before step 1."""
        return budget.static_need(self.model, self.config, self.device)

    def static_bytes(self) -> dict:
        """Parameters + gradients + the state tensors the optimizer really holds (after at least one step)."""
        return measure.static_bytes(self.model, self.optimizer)


def timed(action) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``action()``; on CUDA the queued kernels are waited for."""
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu
