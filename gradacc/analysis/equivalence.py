"""Proof that accumulation is the full-batch gradient — and where the textbook recipe is not.

For one accumulation window of W examples (split into micro-batches of m, accumulated over up to k), train
one optimizer step with a backend, read the accumulated gradient just before ``optimizer.step()``, and
compare it with the gradient of the mean loss over all W items in one batch, at the same weights:

    relative error = ‖g_accumulated − g_full‖ / ‖g_full‖      (dropout off, no clipping)

Cases: ``equal_windows`` (W = m·k), ``short_last_window`` (W < m·k, its last micro-batch partial, like the
end of an epoch) and ``token_level`` (a per-token loss: micro-batches hold different numbers of tokens).

Where the examples of a batch are coupled, no weighting makes accumulation the big batch: ``bow-batchnorm``
(BatchNorm's statistics are the micro-batch's) reports its error for each m at the same m·k
(``by_micro_batch``), beside ``bow-layernorm`` (per-example statistics: exact). The contrastive loss with
in-batch negatives is ``gradacc.analysis.contrastive``.

Under ``accelerate launch`` / ``torchrun`` with P processes (``config.num_processes``) the same check runs on
every rank: the window is m·k·P examples, each rank accumulates its own micro-batches with DDP, and the
gradient after the sync is compared with the full-batch gradient of the whole window computed in this one
process. It also reports the gradient all-reduces of the window, with ``no_sync`` and without. A sharded run
(``fsdp``) is checked with its own sync choice, then both choices side by side (``grad_sync``): each one's error,
and what each rank measured (gradient bytes held, bytes handed to reduce-scatter).

The comparison means something only if the model is deterministic at dropout 0: the run's dropout is set on
every family's config and Dropout modules (``gradacc.training.sources.dropout``), and before any gradient is compared
two examples of the window go through the model twice in training mode; a model whose output still varies is
refused with a reason instead of a false verdict.
"""

from __future__ import annotations

import math

from gradacc.analysis import contrastive
from gradacc.analysis.gradient_runs import accumulated_gradient, full_batch_gradient, relative_error
from gradacc.choices import GRAD_SYNCS, PER_MICRO_BATCH, PER_WINDOW
from gradacc.config import RunConfig
from gradacc.labels import field_label
from gradacc.errors import GradaccError
from gradacc.training.tasks import task_of

CASES = ("equal_windows", "short_last_window", "token_level", "language_model")
# The language-model case: a causal LM's next-token loss, where micro-batches of texts of uneven lengths
# predict very different numbers of tokens (the October 2024 accumulation bug). Same backend, m and k.
LANGUAGE_MODEL = dict(model="tiny-gpt", dataset="builtin-text", task="causal-lm")
NORMALIZATIONS = ("naive", "exact")
# Models whose examples are coupled within a micro-batch (BatchNorm), beside the same model without (LayerNorm).
COUPLED_MODELS = ("bow-batchnorm", "bow-layernorm")


def window_size(case: str, micro_batch_size: int, grad_accum_steps: int, num_processes: int = 1) -> int:
    full = micro_batch_size * grad_accum_steps * num_processes
    if case == "short_last_window" and num_processes > 1:
        # Several processes: Accelerate (and so every backend here) fills a partial micro-batch with repeated
        # examples, so a window comes up short in micro-batches only: about half of them.
        return micro_batch_size * num_processes * max(1, grad_accum_steps // 2)
    if case == "short_last_window":
        # About half the micro-batches, the last one half full: both ways a window comes up short.
        return max(1, micro_batch_size * max(0, math.ceil(grad_accum_steps / 2) - 1) + math.ceil(micro_batch_size / 2))
    return full


def check(config: RunConfig, samples: int | None = None, cases=CASES, confinement=None) -> dict:
    """Relative errors for the main window (``samples`` examples, default m·k·processes) and each case.

    ``confinement``: where a local model or data path may lie (``paths.TRUST_USER`` from the command line;
    None: the app's visitors' folders).
    """
    task = task_of(config)
    if task.in_batch_negatives:  # the three ways to a big batch, not naive vs exact
        if samples is not None:
            raise GradaccError(f"{field_label('samples')} is not used by the contrastive check: it compares whole "
                               "batches of m×k pairs.", "samples")
        return contrastive.check(config, confinement)
    config = config.replace(dropout=0.0, max_grad_norm=0.0, epochs=1, max_steps=1, eval_samples=8,
                            instrument=False).check()  # where a check enters; the replaces below stay checked
    processes = config.num_processes
    full = config.effective_batch
    samples = full if samples is None else samples
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= full:
        product = "m×k" if processes == 1 else "m×k×processes"
        raise GradaccError(f"{field_label('samples')} must be a whole number from 1 to {product} = {full} (one "
                           f"accumulation window); got {samples!r}.", "samples")
    if task.next_token:
        # Every window of a causal LM is token-level already: the two windows are the cases.
        cases = [case for case in cases if case in ("equal_windows", "short_last_window")]
    coupled = config.model.strip() in COUPLED_MODELS
    if coupled:
        # A classifier of whole texts whose point is the norm layer: equal windows say it all (a short window's
        # micro-batch of 1 is refused by BatchNorm).
        cases = [case for case in cases if case == "equal_windows"]
    results = {case: _case(config.replace(**LANGUAGE_MODEL) if case == "language_model" else config,
                           window_size(case, config.micro_batch_size, config.grad_accum_steps, processes),
                           token_level=case == "token_level", confinement=confinement) for case in cases}
    main = (results["equal_windows"] if samples == full and "equal_windows" in results
            else _case(config, samples, confinement=confinement))
    report = {"backend": config.backend, "model": config.model, "micro_batch_size": config.micro_batch_size,
              "grad_accum_steps": config.grad_accum_steps, "num_processes": processes, "samples": samples,
              **main, "cases": results}
    if processes > 1 and config.fsdp:
        report["grad_sync"] = grad_sync_comparison(config, confinement)
    elif processes > 1:
        report["sync_rounds"] = sync_rounds(config, confinement)
    if coupled and processes == 1:
        report["by_micro_batch"] = by_micro_batch(config, confinement=confinement)
    return report


def by_micro_batch(config: RunConfig, micro_batch_sizes=None, confinement=None) -> list[dict]:
    """Exact normalisation's error at one effective batch m·k for every m from 2 up to m·k (k = m·k / m).

    BatchNorm's statistics come from m examples instead of m·k: the smaller m, the further from the full batch.
    m = m·k (k = 1) is the full batch itself, the control: 0.
    """
    full = config.effective_batch
    sizes = micro_batch_sizes or [m for m in (2, 4, 8, 16, 32, 64, 128, 256) if m <= full and full % m == 0]
    out = []
    for m in sizes:
        run = config.replace(micro_batch_size=m, grad_accum_steps=full // m)
        result = _case(run, full, confinement=confinement, normalizations=("exact",))
        out.append({"micro_batch_size": m, "grad_accum_steps": full // m, "rel_error": result["exact_rel_error"]})
    return out


def rows(report: dict) -> list[dict]:
    """Flat (case, normalization, rel_error) rows for a chart or a table."""
    out = []
    for case, result in report["cases"].items():
        for normalization in (*NORMALIZATIONS, "library_default"):
            if f"{normalization}_rel_error" in result:
                out.append({"case": case, "normalization": normalization,
                            "rel_error": result[f"{normalization}_rel_error"]})
    return out


# A relative error below this is float32 rounding of a sum of micro-batch gradients: "matches the full batch".
EXACT_LIMIT = 1e-5


def library_default_verdict(error: float, k: int) -> str:
    """Trainer's library default in words, from its relative error with equal windows at k accumulation steps:
    "right", "k× wrong" (the #47688 pitfall: its ÷k skipped) or how far off it is."""
    if error <= EXACT_LIMIT:
        return "right"
    times = 1 + error  # in the direction of the full-batch gradient, g = t·g_full has relative error t - 1
    return f"{k}× wrong" if abs(times - k) < 0.01 else f"off by {error:.0%}"


def _case(config: RunConfig, window: int, token_level: bool = False, confinement=None,
          normalizations=NORMALIZATIONS) -> dict:
    """One window: full-batch reference, then each normalisation through the backend."""
    config = config.replace(train_samples=window)
    reference = full_batch_gradient(config, token_level, confinement=confinement)
    result = {"window_examples": window, "items": reference["items"], "micro_batch_items": reference["batch_items"]}
    if reference["repeated_examples"]:
        result["repeated_examples"] = reference["repeated_examples"]
    variants = {n: {"loss_normalization": n} for n in normalizations}
    if config.backend == "trainer" and normalizations == NORMALIZATIONS:
        variants["library_default"] = {"trainer_library_default": True}
    for name, options in variants.items():
        run = accumulated_gradient(config.replace(loss_normalization=options.get("loss_normalization", "naive")),
                                   token_level, options.get("trainer_library_default", False),
                                   confinement=confinement)
        result[f"{name}_rel_error"] = relative_error(run["gradient"], reference["gradient"])
    return result


def sync_rounds(config: RunConfig, confinement=None) -> dict:
    """Gradient all-reduces per optimizer step over two full windows, with ``no_sync`` and without.

    Two steps, because DDP puts every gradient in one bucket until its first sync and then rebuilds its
    buckets: from the second step on, a window costs one round per bucket with no_sync, k per bucket without.
    The first step's gradient equals the full-batch gradient either way: no_sync changes the communication only.
    """
    config = config.replace(train_samples=2 * config.effective_batch, max_steps=2, loss_normalization="exact")
    reference = full_batch_gradient(config, token_level=False, first_windows=1, confinement=confinement)
    report = {}
    for name, sync_each in (("no_sync", False), ("without_no_sync", True)):
        run = accumulated_gradient(config, token_level=False, sync_each_micro_batch=sync_each, confinement=confinement)
        report[name] = run["sync_rounds"]
        report[f"{name}_rel_error"] = relative_error(run["gradient"], reference["gradient"])
    return report


def grad_sync_comparison(config: RunConfig, confinement=None) -> dict:
    """A sharded run's two ways to sync, over two full windows: each one's first-step gradient against the full
    batch, and each rank's measured figures at the second step (the first carries FSDP's lazy set-up); then the two
    ratios per rank, per-window ÷ per-micro-batch gradient bytes held (≈ P) and per-micro-batch ÷ per-window bytes
    handed to reduce-scatter (= k)."""
    config = config.replace(train_samples=2 * config.effective_batch, max_steps=2, loss_normalization="exact")
    reference = full_batch_gradient(config, token_level=False, first_windows=1, confinement=confinement)
    report = {}
    for choice in GRAD_SYNCS:
        run = accumulated_gradient(config.replace(grad_sync=choice), token_level=False, confinement=confinement)
        figures = run["sharding"][-1]
        report[choice] = {"rel_error": relative_error(run["gradient"], reference["gradient"]),
                          **{name: figures[name] for name in ("grad_bytes", "grad_peak_bytes", "grad_comm_bytes")}}
    window, each = report[PER_WINDOW], report[PER_MICRO_BATCH]
    report["grad_bytes_ratio"] = [a / b for a, b in zip(window["grad_bytes"], each["grad_bytes"])]
    report["grad_comm_ratio"] = [b / a for a, b in zip(window["grad_comm_bytes"], each["grad_comm_bytes"])]
    return report
