"""In-batch negatives: accumulation is not the big batch, GradCache is. Three ways to an effective batch E = m·k.

1. ``batch``: MultipleNegativesRankingLoss on one batch of E pairs (the reference: each query has E−1 negatives);
2. ``accumulation``: the same loss on k micro-batches of m, accumulated (each query sees only m−1 negatives: a
   different loss, so a different gradient whatever the weights);
3. ``gradcache``: CachedMultipleNegativesRankingLoss on the batch of E, embedding mini-batches of m.

Each way trains one optimizer step through the chosen backend from the same weights on the same E pairs
(dropout off, no clipping); its gradient right before ``optimizer.step()`` is compared with the batch's:
relative error = ‖g − g_batch‖ / ‖g_batch‖. Beside it, the activation bytes the run measured: a micro-batch's
for accumulation, the largest re-embedded mini-batch for GradCache (which embeds queries and positives in
separate mini-batches), the whole batch's for the reference.
"""

from __future__ import annotations

from gradacc.analysis.gradient_runs import accumulated_gradient, relative_error
from gradacc.choices import CONTRASTIVE
from gradacc.config import RunConfig

WAYS = ("batch", "accumulation", "gradcache")
WAY_NAMES = {"batch": "MultipleNegativesRankingLoss, one batch", "accumulation": "the same loss, accumulated",
             "gradcache": "CachedMultipleNegativesRankingLoss (GradCache)"}


def ways(config: RunConfig) -> dict[str, RunConfig]:
    """The three configs of a contrastive config's m and k (its gradcache_mini_batch is ignored)."""
    full, m = config.effective_batch, config.micro_batch_size
    base = config.replace(task=CONTRASTIVE, gradcache_mini_batch=None)
    return {"batch": base.replace(micro_batch_size=full, grad_accum_steps=1),
            "accumulation": base,
            "gradcache": base.replace(micro_batch_size=full, grad_accum_steps=1, gradcache_mini_batch=m)}


def check(config: RunConfig, confinement=None) -> dict:
    """Relative gradient error and activation bytes of each way, against the batch of E (one window of pairs).

    ``confinement``: where a local model folder may lie (``paths.TRUST_USER`` from the command line; None: the
    app's visitors' folders)."""
    config = config.replace(task=CONTRASTIVE, dropout=0.0, max_grad_norm=0.0, epochs=1, max_steps=1, eval_samples=8,
                            instrument=True, gradcache_mini_batch=None).check()
    config = config.replace(train_samples=config.effective_batch)
    measured = {name: accumulated_gradient(run, token_level=False, confinement=confinement)
                for name, run in ways(config).items()}
    reference = measured["batch"]["gradient"]
    report = {"task": CONTRASTIVE, "backend": config.backend, "model": config.model,
              "micro_batch_size": config.micro_batch_size, "grad_accum_steps": config.grad_accum_steps,
              "effective_batch": config.effective_batch, "num_processes": 1, "ways": {}}
    for name, run in ways(config).items():
        report["ways"][name] = {"micro_batch_size": run.micro_batch_size, "grad_accum_steps": run.grad_accum_steps,
                                "gradcache_mini_batch": run.gradcache_mini_batch,
                                "rel_error": relative_error(measured[name]["gradient"], reference),
                                "activation_bytes": measured[name]["activation_bytes"]}
    return report


def explanation(report: dict) -> list[str]:
    """Plain sentences for a contrastive check's figures."""
    ways_ = report["ways"]
    batch, accumulated, cached = ways_["batch"], ways_["accumulation"], ways_["gradcache"]
    full, m, k = report["effective_batch"], report["micro_batch_size"], report["grad_accum_steps"]
    sentences = [f"Accumulating {k} micro-batches of {m} is {accumulated['rel_error']:.0%} off the batch of {full}: "
                 f"each query is scored against {m - 1} in-batch negatives instead of {full - 1}, a different loss."]
    sentences.append(f"GradCache with mini-batches of {m} is {cached['rel_error']:.1e} off: the batch-{full} loss, "
                     "float32 rounding apart.")
    if batch["activation_bytes"] and accumulated["activation_bytes"] and cached["activation_bytes"]:
        sentences.append(f"Activations: {batch['activation_bytes'] / accumulated['activation_bytes']:.1f}× smaller "
                         f"with accumulation, {batch['activation_bytes'] / cached['activation_bytes']:.1f}× smaller "
                         "with GradCache (it re-embeds queries and positives in separate mini-batches) than the batch.")
    return sentences
