"""What the device decides for a loop: autocast precision (and fp16's grad scaler), gradient checkpointing, where
a batch goes."""

from __future__ import annotations

import contextlib

import torch

from gradacc.errors import GradaccError


def enable_gradient_checkpointing(model, name: str) -> None:
    """Recompute each layer's activations in backward instead of keeping them; non-reentrant, as torch advises
    (works with inputs that need no grad, and with the saved-tensor hooks that measure memory)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise GradaccError(f"Gradient checkpointing is not supported by {name}.", "gradient_checkpointing")
    # transformers 5's name for gradient_checkpointing_enable (the old one warns that it goes in v6).
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


class Precision:
    """Autocast for the forward pass and, for fp16 on CUDA, a grad scaler around backward and step.

    bf16 needs no scaler (it has fp32's range). The plain loop calls ``scale(loss).backward()``, ``unscale`` (before clipping)
    and ``step``; Accelerate and Trainer get the same choice as their own ``mixed_precision`` / ``bf16``/``fp16``.
    """

    def __init__(self, config, device):
        self.device = torch.device(device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        if config.precision == "fp16" and self.device.type != "cuda":
            raise GradaccError("Precision fp16 needs a CUDA GPU (with a grad scaler); on the CPU use bf16.",
                               "precision")
        self.scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward()`` on: scaled up for fp16 (small gradients survive), else unchanged."""
        return self.scaler.scale(loss) if self.scaler else loss

    def unscale(self, optimizer) -> None:
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)  # skips the step when the scaled gradients overflowed
            self.scaler.update()
        else:
            optimizer.step()


def to_device(batch: dict, device) -> dict:
    return {key: value.to(device) for key, value in batch.items()}
