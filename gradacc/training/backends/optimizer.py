"""The optimizer step the plain and Accelerate loops share: the optimizer, its schedule, clipping.

They mirror ``Trainer``'s defaults (AdamW, no weight decay on biases and norms, linear decay after warm-up), so the
three backends run the same math.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from transformers import get_linear_schedule_with_warmup
from transformers.optimization import Adafactor

from gradacc.errors import GradaccError, one_line

# SGD with momentum: one state tensor per parameter (AdamW keeps two, Adafactor factored rows and columns).
SGD_MOMENTUM = 0.9


def make_optimizer(model: torch.nn.Module, config, device=None) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over ``model``'s trainable parameters."""
    return optimizer_for(list(model.named_parameters()), config, device)


def optimizer_for(named_parameters, config, device=None) -> torch.optim.Optimizer:
    """Two groups like Trainer's (no weight decay on biases and norms); ``device`` decides what is supported.

    adamw-fused on a device where torch has no fused kernel and adamw-8bit without bitsandbytes and CUDA are
    refused with a sentence (GradaccError naming the field), not a traceback.
    """
    no_decay = [p for n, p in named_parameters if p.requires_grad and _skips_decay(n)]
    decay = [p for n, p in named_parameters if p.requires_grad and not _skips_decay(n)]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    name, lr = config.optimizer, config.learning_rate
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=SGD_MOMENTUM)
    if name == "adafactor":
        # A fixed learning rate (the schedule is gradacc's), as Trainer's optim="adafactor" sets it up.
        return Adafactor(groups, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    if name == "adamw-8bit":
        device_type = torch.device(device).type if device is not None else "cpu"
        if importlib.util.find_spec("bitsandbytes") is None or device_type != "cuda":
            raise GradaccError("Optimizer adamw-8bit needs bitsandbytes and a CUDA GPU; this run has "
                               f"{'no bitsandbytes' if importlib.util.find_spec('bitsandbytes') is None else 'no GPU'}.",
                               "optimizer")
        import bitsandbytes  # optional: not in requirements.txt (CUDA only), checked for just above

        return bitsandbytes.optim.AdamW8bit(groups, lr=lr)
    if name == "adamw-fused":
        try:
            return torch.optim.AdamW(groups, lr=lr, fused=True)
        except RuntimeError as error:  # torch checks the parameters' device against its fused kernels
            raise GradaccError(f"Optimizer adamw-fused is not supported here: {one_line(error, with_type=False)}",
                               "optimizer") from None
    return torch.optim.AdamW(groups, lr=lr)


def _skips_decay(name: str) -> bool:
    lowered = name.lower()
    return "bias" in lowered or "layernorm" in lowered or "layer_norm" in lowered or "rmsnorm" in lowered


def warmup_steps(config, total_steps: int) -> int:
    return math.ceil(config.warmup_ratio * total_steps)


def make_scheduler(optimizer, config, total_steps: int, calls_per_step: int = 1):
    """Linear warmup and decay over ``total_steps`` optimizer steps, for a scheduler whose ``step()`` is called
    ``calls_per_step`` times per optimizer step (Accelerate's prepared scheduler: once per process)."""
    return get_linear_schedule_with_warmup(optimizer, warmup_steps(config, total_steps) * calls_per_step,
                                           total_steps * calls_per_step)


def clip_gradients(model: torch.nn.Module, max_grad_norm: float, accelerator=None) -> float:
    """The total gradient norm before clipping; clips to ``max_grad_norm`` when it is positive (0: only measure).

    With an ``accelerator`` it clips through ``accelerator.clip_grad_norm_`` (which unscales mixed-precision
    gradients first), as Accelerate's docs ask; Trainer clips the same way inside its own loop.
    """
    limit = max_grad_norm if max_grad_norm > 0 else float("inf")
    if accelerator is not None:
        return float(accelerator.clip_grad_norm_(model.parameters(), limit))
    return float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], limit))
