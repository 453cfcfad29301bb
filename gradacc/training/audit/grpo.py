"""GRPO's documented objective over one optimizer step's window, by ``loss_type``, computed by hand.

TRL's ``GRPOTrainer`` turns per-token log-probs into a loss in two stages: a per-token surrogate (clipped ratio ×
advantage, CISPO's and VESPO's detached weights × log-prob, SAPO's soft gate; plus β × the k3 KL estimate to the
reference, × the importance ratio by default), then an aggregate whose normaliser depends on ``loss_type``. What each aggregate *should* be over a
window (the k micro-batches of one optimizer step) is what ``GRPOConfig.loss_type``'s help says; this module writes
each one out from that text, from what a run stored per micro-batch, and nothing of TRL's loss code. The gradient a
step applies should be the gradient of the function here of the same name; ``gradacc bench grpo`` measures whether
it is.

Scope: ``num_iterations=1`` runs (old log-probs are the ones stored at generation, or, where TRL stores none, the
policy's own detached), no vLLM importance-sampling correction, no entropy mask, no entropy bonus, ``delta=None``.
Pure torch; no TRL import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class MicroBatch:
    """What one micro-batch of a GRPO run holds: ``logps`` the policy's per-token log-probs of the completion tokens
    (B × T, with grad), ``mask`` the completion mask (B × T, 1 for a token that counts), ``advantages`` (B,),
    ``old_logps`` the log-probs stored at generation (B × T; None: on-policy, the policy's own, detached) and
    ``ref_logps`` the reference model's (B × T; needed only when β > 0)."""

    logps: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None


@dataclass(frozen=True)
class Settings:
    """The GRPOConfig fields the objective reads, with TRL 1.16's defaults."""

    max_completion_length: int
    beta: float = 0.0
    # use_bias_correction_kl: the KL term × the importance ratio r (differentiable, so it changes the gradient even
    # where r = 1): the unbiased reverse-KL gradient of DeepSeek-V3.2; TRL 1.16's default.
    bias_correction_kl: bool = True
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    importance_sampling_level: str = "token"  # "sequence": GSPO's (and LUSPO's) length-mean log-ratio per sequence
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


def _float_mask(batch: MicroBatch) -> torch.Tensor:
    return batch.mask.to(batch.logps.dtype)


def _log_ratio(batch: MicroBatch) -> torch.Tensor:
    old = batch.logps.detach() if batch.old_logps is None else batch.old_logps.to(batch.logps.dtype)
    return batch.logps - old


def _ratio(batch: MicroBatch, settings: Settings) -> torch.Tensor:
    """π_θ/π_old per token (B × T), or per sequence as exp of the mean log-ratio over its tokens (B × 1)."""
    log_ratio = _log_ratio(batch)
    if settings.importance_sampling_level == "sequence":
        mask = _float_mask(batch)
        mean = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        return mean.exp()
    return log_ratio.exp()


def _advantages(batch: MicroBatch) -> torch.Tensor:
    a = batch.advantages.to(batch.logps.dtype)
    return a.unsqueeze(1) if a.dim() == 1 else a


def kl_per_token(batch: MicroBatch) -> torch.Tensor:
    """The k3 estimate of KL(π_θ ‖ π_ref) per token: exp(ref − logp) − (ref − logp) − 1."""
    d = batch.ref_logps.to(batch.logps.dtype) - batch.logps
    return d.exp() - d - 1.0


def per_token_loss(batch: MicroBatch, loss_type: str, settings: Settings) -> torch.Tensor:
    """The per-token surrogate to minimise, before any aggregate (B × T)."""
    a = _advantages(batch)
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        # PPO's clipped surrogate: −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)
        r = _ratio(batch, settings)
        clipped = r.clamp(1.0 - settings.epsilon_low, 1.0 + settings.epsilon_high)
        loss = -torch.minimum(r * a, clipped * a)
    elif loss_type == "cispo":
        # MiniMax-M1: −sg(min(r, ε_high))·A·log π_θ — the weight is clipped, and carries no gradient
        weight = _ratio(batch, settings).clamp(max=settings.epsilon_high).detach()
        loss = -weight * a * batch.logps
    elif loss_type == "sapo":
        # SAPO: the hard clip replaced by a soft gate σ(τ(r − 1))·4/τ, τ by the advantage's sign
        tau = torch.where(a > 0, torch.full_like(a, settings.sapo_temperature_pos),
                          torch.full_like(a, settings.sapo_temperature_neg))
        loss = -torch.sigmoid(tau * (_ratio(batch, settings) - 1.0)) * 4.0 / tau * a
    elif loss_type == "vespo":
        loss = -_vespo_weight(batch, settings) * a * batch.logps
    else:
        raise ValueError(f"no documented objective here for loss_type {loss_type!r}")
    loss = loss.expand_as(batch.logps)
    if settings.beta:
        kl = kl_per_token(batch)
        if settings.bias_correction_kl:
            kl = kl * _ratio(batch, settings)
        loss = loss + settings.beta * kl
    return loss


def _vespo_weight(batch: MicroBatch, settings: Settings) -> torch.Tensor:
    """VESPO's Gamma weight of the sequence's importance ratio w = Π_t π_θ/π_old: φ(w) = e^λ · w^k · e^(−λw),
    φ(1) = 1, (k, λ) by the advantage's sign; detached (it only scales the gradient). log w is kept within
    [log 1e-8, 20] as the paper's implementation does."""
    with torch.no_grad():
        mask = _float_mask(batch)
        log_w = (_log_ratio(batch).clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
        nonneg = _advantages(batch) >= 0
        k = torch.where(nonneg, torch.full_like(log_w, settings.vespo_k_pos), torch.full_like(log_w, settings.vespo_k_neg))
        lam = torch.where(nonneg, torch.full_like(log_w, settings.vespo_lambda_pos),
                          torch.full_like(log_w, settings.vespo_lambda_neg)).clamp(min=1e-4)
        phi = (lam + k * log_w - lam * log_w.exp()).exp()
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _masked_terms(window: list[MicroBatch], loss_type: str, settings: Settings):
    for batch in window:
        yield batch, per_token_loss(batch, loss_type, settings) * _float_mask(batch)


def _sequence_mean_over_window(window, loss_type, settings):
    """Each sequence's token mean, then the mean over the micro-batch's sequences, then over the window's k."""
    means = [(terms.sum(-1) / _float_mask(b).sum(-1).clamp(min=1.0)).mean()
             for b, terms in _masked_terms(window, loss_type, settings)]
    return torch.stack(means).mean()


def _token_mean_over_window(window, loss_type, settings):
    """Σ over the window's tokens ÷ the window's token count: every token of the k micro-batches weighs the same."""
    total = sum(terms.sum() for _, terms in _masked_terms(window, loss_type, settings))
    tokens = sum(_float_mask(b).sum() for b in window)
    return total / tokens.clamp(min=1.0)


def grpo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="grpo"``. TRL's help: "Aggregates token-level losses by normalizing over sequence length" — the
    mean of each sequence's token mean; over the window, the mean over its k micro-batches (÷ accumulation steps), which
    is the mean over the window's sequences when the micro-batches hold as many sequences each."""
    return _sequence_mean_over_window(window, "grpo", settings)


def bnpo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="bnpo"``. TRL's help: "normalizing with the number of active token in the local batch. Note that
    normalization is performed over the local batch only, so results may slightly vary depending on the local batch
    size, despite a constant effective batch size." Each micro-batch's token mean, then their mean over the k
    micro-batches: by design not the window's token mean."""
    means = [terms.sum() / _float_mask(b).sum().clamp(min=1.0) for b, terms in _masked_terms(window, "bnpo", settings)]
    return torch.stack(means).mean()


def dr_grpo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="dr_grpo"``. TRL's help: "normalizing with a global constant ... The value of the constant
    corresponds to ``max_completion_length``" (Dr. GRPO): the window's token sum ÷ (its sequences ×
    max_completion_length)."""
    total = sum(terms.sum() for _, terms in _masked_terms(window, "dr_grpo", settings))
    sequences = sum(b.logps.size(0) for b in window)
    return total / (sequences * settings.max_completion_length)


def dapo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="dapo"`` (TRL's default). TRL's help: "normalizing with the number of active token in the global
    accumulated batch" (DAPO's token-level loss): the window's token sum ÷ the window's token count."""
    return _token_mean_over_window(window, "dapo", settings)


def cispo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="cispo"``. TRL's help: "Clips the importance sampling weights ... multiplied with the advantages and
    policy model's log probs. Individual token losses are aggregated by normalizing with the number of active tokens
    in the global accumulated batch" (MiniMax-M1): the window's token mean of −sg(min(r, ε_high))·A·log π_θ."""
    return _token_mean_over_window(window, "cispo", settings)


def sapo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="sapo"``. TRL's help: "Replaces hard clipping with a smooth, temperature-controlled gate" (SAPO);
    the help names no normaliser: TRL aggregates it as ``grpo`` (the sequence mean, ÷ accumulation steps), the
    aggregate taken as documented here."""
    return _sequence_mean_over_window(window, "sapo", settings)


def luspo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="luspo"``. TRL's help: "A sequence-level loss that scales each sequence's loss by its length. This
    is a modification of GSPO and requires ``importance_sampling_level='sequence'``" (LUSPO): each sequence's loss ×
    its length (the sum over its tokens), the mean over the window's sequences."""
    sums = [terms.sum(-1).mean() for _, terms in _masked_terms(window, "luspo", settings)]
    return torch.stack(sums).mean()


def vespo_window(window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """``loss_type="vespo"``. TRL's help: "Replaces hard clipping with a smooth, asymmetric Gamma weighting function
    applied directly to sequence-level importance weights" (VESPO): −sg(φ(w))·A·log π_θ per token, aggregated like
    DAPO (the help names no normaliser; TRL's code and the VESPO paper use the window's token count)."""
    return _token_mean_over_window(window, "vespo", settings)


WINDOW_OBJECTIVES = {"grpo": grpo_window, "bnpo": bnpo_window, "dr_grpo": dr_grpo_window, "dapo": dapo_window,
                     "cispo": cispo_window, "sapo": sapo_window, "luspo": luspo_window, "vespo": vespo_window}


def window_objective(loss_type: str, window: list[MicroBatch], settings: Settings) -> torch.Tensor:
    """The documented objective of ``loss_type`` over one optimizer step's window: its gradient is the one the step
    should apply."""
    if loss_type not in WINDOW_OBJECTIVES:
        raise ValueError(f"no documented objective here for loss_type {loss_type!r}; known: "
                         + ", ".join(WINDOW_OBJECTIVES))
    return WINDOW_OBJECTIVES[loss_type](window, settings)


def completion_logps(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs of ``completion_ids`` (B × T) from a causal LM's logits over prompt + completion
    (B × (P + T) × V): the logits at the positions just before each completion token, ÷ the sampling temperature."""
    steps = completion_ids.size(1)
    scores = logits[:, -steps - 1:-1, :] / temperature
    return scores.log_softmax(-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
