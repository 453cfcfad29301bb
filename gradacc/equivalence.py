"""Proof that accumulation is the full-batch gradient — and where the textbook recipe is not.

For one accumulation window of W examples (split into micro-batches of m, accumulated over up to k), train
one optimizer step with a backend, read the accumulated gradient just before ``optimizer.step()``, and
compare it with the gradient of the mean loss over all W items in one batch, at the same weights:

    relative error = ‖g_accumulated − g_full‖ / ‖g_full‖      (dropout off, no clipping)

Cases: ``equal_windows`` (W = m·k), ``short_last_window`` (W < m·k, its last micro-batch partial, like the
end of an epoch) and ``token_level`` (a per-token loss: micro-batches hold different numbers of tokens).
"""

from __future__ import annotations

import math
import threading

from gradacc.config import RunConfig
from gradacc.errors import GradaccError

CASES = ("equal_windows", "short_last_window", "token_level")
NORMALIZATIONS = ("naive", "exact")


def window_size(case: str, micro_batch_size: int, grad_accum_steps: int) -> int:
    full = micro_batch_size * grad_accum_steps
    if case == "short_last_window":
        # About half the micro-batches, the last one half full: both ways a window comes up short.
        return max(1, micro_batch_size * max(0, math.ceil(grad_accum_steps / 2) - 1) + math.ceil(micro_batch_size / 2))
    return full


def check(config: RunConfig, samples: int | None = None, cases=CASES) -> dict:
    """Relative errors for the main window (``samples`` examples, default m·k) and each case."""
    config = config.replace(dropout=0.0, max_grad_norm=0.0, epochs=1, max_steps=1, eval_samples=8,
                            instrument=False).validate()
    full = config.micro_batch_size * config.grad_accum_steps
    samples = full if samples is None else samples
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= full:
        raise GradaccError(f"samples must be a whole number from 1 to m×k = {full} (one accumulation window); "
                           f"got {samples!r}.", "samples")
    results = {case: _case(config, window_size(case, config.micro_batch_size, config.grad_accum_steps),
                           token_level=case == "token_level") for case in cases}
    main = results["equal_windows"] if samples == full and "equal_windows" in results else _case(config, samples)
    return {"backend": config.backend, "model": config.model, "micro_batch_size": config.micro_batch_size,
            "grad_accum_steps": config.grad_accum_steps, "samples": samples,
            **main, "cases": results}


def rows(report: dict) -> list[dict]:
    """Flat (case, normalization, rel_error) rows for a chart or a table."""
    out = []
    for case, result in report["cases"].items():
        for normalization in (*NORMALIZATIONS, "library_default"):
            if f"{normalization}_rel_error" in result:
                out.append({"case": case, "normalization": normalization,
                            "rel_error": result[f"{normalization}_rel_error"]})
    return out


def _case(config: RunConfig, window: int, token_level: bool = False) -> dict:
    """One window: full-batch reference, then each normalisation through the backend."""
    config = config.replace(train_samples=window)
    reference = full_batch_gradient(config, token_level)
    result = {"window_examples": window, "items": reference["items"], "micro_batch_items": reference["batch_items"]}
    variants = {n: {"loss_normalization": n} for n in NORMALIZATIONS}
    if config.backend == "trainer":
        variants["library_default"] = {"trainer_library_default": True}
    for name, options in variants.items():
        gradient = accumulated_gradient(config.replace(loss_normalization=options.get("loss_normalization", "naive")),
                                        token_level, options.get("trainer_library_default", False))
        result[f"{name}_rel_error"] = relative_error(gradient, reference["gradient"])
    return result


def full_batch_gradient(config: RunConfig, token_level: bool) -> dict:
    """The gradient of the mean loss over the whole window in one forward/backward pass."""
    from gradacc.backends.common import to_device
    from gradacc.engine import quiet_libraries
    from gradacc.job import prepare

    quiet_libraries()
    job = prepare(config, lambda event: None, threading.Event(), token_level=token_level, whole_micro_batch=False)
    job.model.train()
    batch = to_device(job.collate(job.train_examples), job.device)
    job.model(**batch).loss.backward()
    return {"gradient": _gradients(job.model), "items": sum(job.batch_items), "batch_items": job.batch_items}


def accumulated_gradient(config: RunConfig, token_level: bool, trainer_library_default: bool = False) -> dict:
    from gradacc.engine import train

    captured = {}

    def capture(model):
        if not captured:  # the first (and only) optimizer step
            captured.update(_gradients(model))

    ended = train(config, before_optimizer_step=capture, token_level=token_level, whole_micro_batch=False,
                  trainer_library_default=trainer_library_default)
    if ended["status"] != "completed" or not captured:
        raise GradaccError(f"The equivalence run did not complete: {ended['reason']}", "backend")
    return captured


def _gradients(model) -> dict:
    # Wrappers (DDP) prefix names with "module."; strip it so every backend's names line up.
    return {name.removeprefix("module."): p.grad.detach().float().flatten().clone()
            for name, p in model.named_parameters() if p.grad is not None}


def relative_error(gradient: dict, reference: dict) -> float:
    import torch

    if set(gradient) != set(reference):
        raise GradaccError("The accumulated and full-batch gradients cover different parameters.", "backend")
    names = sorted(reference)
    accumulated = torch.cat([gradient[n] for n in names])
    full = torch.cat([reference[n] for n in names])
    return float(torch.linalg.vector_norm(accumulated - full) / torch.linalg.vector_norm(full))
