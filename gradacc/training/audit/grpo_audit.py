"""The audit of TRL's ``GRPOTrainer``: the step's gradient against the gradient of its ``loss_type``'s documented
objective over the window (``gradacc.training.audit.grpo``, written from ``GRPOConfig.loss_type``'s help), computed
from what each micro-batch's ``compute_loss`` was given: the stored completions and their masks, the advantages,
the log-probs stored at generation (off-policy windows) and the reference model's (β > 0).

The reference costs one forward and one backward per micro-batch, as the window did: micro-batch i's forward is
replayed (from the random state it ran under) into the window objective with the other micro-batches' log-probs
held constant, and ``autograd.grad`` gives its share. Every documented aggregate is a sum over micro-batches with
normalisers that depend only on the masks, so the shares add up to the window's gradient, and the same shares
weighted give the two other gradients a verdict needs: the window's token mean (``bnpo``'s distance from it) and
the token mean divided per generation batch (``dapo``/``cispo``/``vespo`` when ``steps_per_generation`` ≠ k).
On several processes the window is every process's micro-batches: each replays its own, holds the others', and the
shares are summed over the processes.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from gradacc.training import distributed
from gradacc.training.audit import grpo, losses
from gradacc.training.audit.capture import RandomState
from gradacc.training.audit.verdict import NOT_JUDGED, Fit, Verdict, clip_check
from gradacc.training.audit.vocabulary import Cause, Integration, LossKind
from gradacc.training.compat import trl
from gradacc.training.gradients import projection

# Normalised by the window's token count: by TRL by the generation batch's count × k / steps_per_generation, which
# is the window's only when steps_per_generation = k.
TOKEN_COUNT_LOSSES = ("dapo", "cispo", "vespo")
# Each micro-batch's token mean, by design: accumulation-variant.
MICRO_BATCH_LOSSES = ("bnpo",)
AGGREGATES = {"grpo": "each sequence's token mean, averaged over the micro-batch, then over the k micro-batches",
              "bnpo": "each micro-batch's token mean, averaged over the k micro-batches",
              "dr_grpo": "the window's token sum ÷ (its sequences × max_completion_length)",
              "dapo": "the window's token sum ÷ the window's token count",
              "cispo": "the window's token sum ÷ the window's token count",
              "vespo": "the window's token sum ÷ the window's token count",
              "sapo": "each sequence's token mean, averaged over the micro-batch, then over the k micro-batches",
              "luspo": "each sequence's token sum, averaged over the micro-batch, then over the k micro-batches"}


def settings(args) -> grpo.Settings:
    return grpo.Settings(**trl.grpo_settings(args))


def replayed(model, inputs: dict, temperature: float) -> grpo.MicroBatch:
    """One micro-batch through ``model``: its completion tokens' log-probs (with grad), beside what was stored."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logps = grpo.completion_logps(logits, inputs["completion_ids"], temperature)
    old, ref = inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps")
    return grpo.MicroBatch(logps=logps, mask=inputs["completion_mask"], advantages=inputs["advantages"],
                           old_logps=None if old is None else old.to(logps.dtype),
                           ref_logps=None if ref is None else ref.to(logps.dtype))


def _held(inputs: dict, dtype) -> grpo.MicroBatch:
    """A micro-batch whose log-probs are constants (0, ratio 1, KL 0): in the window, it adds to the objective but
    not to the gradient; its mask and advantages keep every normaliser the window's."""
    mask = inputs["completion_mask"]
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return grpo.MicroBatch(logps=zeros, mask=mask, advantages=inputs["advantages"], ref_logps=zeros)


def unsupported(trainer, window: list[dict]) -> str | None:
    """Why the audit's objective is not this run's, in the user's terms; None when it is."""
    args = trainer.args
    if args.loss_type not in grpo.WINDOW_OBJECTIVES:
        return (f"loss_type={args.loss_type!r} has no documented objective the audit computes (it knows "
                + ", ".join(grpo.WINDOW_OBJECTIVES) + ")")
    reason = trl.grpo_unsupported(args, trainer)
    if reason:
        return reason
    if args.world_size > 1 and not distributed.is_distributed():
        return (f"{args.world_size} processes that share no process group: each would be judged against a window it "
                "does not hold")
    extra = sorted({key for inputs in window for key in trl.grpo_model_inputs(inputs)})
    if extra:
        return (f"the micro-batches hold {', '.join(extra)}: a mask, a ratio or a model input the audit's objective "
                "does not use")
    return None


def judge(trainer, micro_batches: list, clips: tuple, precision: str) -> Verdict:
    """The verdict on the gradient in ``.grad`` now (before the step), for a GRPOTrainer's first window."""
    started = time.perf_counter()
    args, model = trainer.args, trainer.model
    k, loss_type = args.gradient_accumulation_steps, args.loss_type
    micro_batches = [m for m in micro_batches if m.inputs is not None]
    window = [trl.grpo_inputs(m.inputs) for m in micro_batches]
    j = len(window)
    base = dict(who=Integration.TRAINER, kind=LossKind.GRPO, k=k, micro_batches=j, num_processes=args.world_size,
                precision=precision, clips=tuple(clips), model=losses.model_name(model),
                checks=(clip_check(tuple(clips), j, Integration.TRAINER),))
    reason = unsupported(trainer, window)
    if reason is None and not j:
        reason = "the window ran no GRPO micro-batch"
    if reason:
        return Verdict(gradient=NOT_JUDGED, meaning=f"GRPOTrainer, {reason}", **base)
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    applied = {name: p.grad.detach().reshape(-1) for name, p in params.items() if p.grad is not None}
    if not applied:
        return Verdict(gradient=NOT_JUDGED, meaning="the model has no gradient at the optimizer step", **base)
    final = [c.factor for c in clips if c.after_micro_batch >= j]  # judged before the step's own clipping
    unclip = 1.0 / math.prod(final) if final and math.prod(final) > 0 else 1.0

    # On P processes the window is every process's micro-batches (rank 0's first): the documented aggregates count
    # over all of them, as TRL's normalisers and DDP's average do. Each process replays its own and holds the others'.
    everyone = _over_processes(window)
    start = sum(len(held) for held in everyone[:distributed.rank()]) if len(everyone) > 1 else 0
    whole = [inputs for held in everyone for inputs in held]
    processes = len(everyone)
    tokens = [float(inputs["completion_mask"].sum()) for inputs in whole]
    window_tokens = sum(tokens)
    generation_tokens = [float(inputs["num_items_in_batch"]) if "num_items_in_batch" in inputs else None
                         for inputs in whole]
    spg = args.steps_per_generation or k
    # Each micro-batch's share × these weights: the window's token mean (bnpo's shares are ÷ k·P·n_i), and the token
    # mean with each micro-batch's tokens ÷ its generation batch's count × k/spg (dapo's are ÷ the window's count).
    weights = ({"token_mean": [k * processes * n / window_tokens for n in tokens]}
               if loss_type in MICRO_BATCH_LOSSES else {})
    if loss_type in TOKEN_COUNT_LOSSES and None not in generation_tokens:
        weights["generation"] = [window_tokens * spg / (g * k) for g in generation_tokens]
    # In float32 whatever the parameters' dtype: a bf16 sum of k shares would round each one.
    sums = {name: {n: torch.zeros_like(g, dtype=torch.float32) for n, g in applied.items()}
            for name in ("reference", *weights)}
    objective = settings(args)
    kept = RandomState.take()
    try:
        for mine_at, (micro_batch, inputs) in enumerate(zip(micro_batches, window)):
            i = start + mine_at  # its place in the whole window
            if micro_batch.rng is not None:
                micro_batch.rng.put_back_torch()  # dropout draws as the run's forward did
            with _autocast_of(micro_batch):
                mine = replayed(model, inputs, args.temperature)
            alone = [mine if n == i else _held(other, mine.logps.dtype) for n, other in enumerate(whole)]
            share = torch.autograd.grad(grpo.window_objective(loss_type, alone, objective), list(params.values()),
                                        allow_unused=True)
            for (name, _), g in zip(params.items(), share):
                if g is None or name not in applied:
                    continue
                g = g.detach().reshape(-1).float()
                sums["reference"][name].add_(g)
                for which, w in weights.items():
                    sums[which][name].add_(g, alpha=w[i])
    finally:
        kept.put_back()
    if processes > 1:  # each process's shares: the whole window's gradient is their sum
        sums = {which: distributed.sum_gradients_over_ranks(shares) for which, shares in sums.items()}
    seconds = time.perf_counter() - started
    if not any(bool(g.any()) for g in sums["reference"].values()):  # nothing to project on
        return Verdict(gradient=NOT_JUDGED, meaning=f"GRPOTrainer, loss_type={loss_type!r}: the window's objective has "
                       "no gradient (every advantage 0: the rewards of each prompt's completions tie)", **base)
    fits = {which: _fit(applied, sums[which], unclip, precision) for which in sums}
    fit = fits["reference"]
    cause, meaning, fix = _cause(loss_type, fit, fits, k, spg, window_tokens, generation_tokens, len(whole))
    return Verdict(gradient=cause, meaning=meaning, fix=fix, fit=fit, items=tuple(tokens[start:start + j]),
                   reference=f"the documented {loss_type} objective, computed from the window's stored completions, "
                             "advantages and log-probs",
                   window_items=window_tokens, counted_items=generation_tokens[0],
                   replay="each micro-batch's forward replayed once from its own random state",
                   reference_seconds=seconds, audit_seconds=time.perf_counter() - started, **base)


def _cause(loss_type, fit, fits, k, spg, window_tokens, generation_tokens, j):
    documented = f"the documented {loss_type} objective ({AGGREGATES[loss_type]})"
    if fit.plain_scale and fit.near(1.0):
        if loss_type in MICRO_BATCH_LOSSES:
            versus = fits["token_mean"]
            return (Cause.BY_DESIGN,
                    f"the step follows {documented} exactly (scale {fit.scale:.5g}), and that objective depends on "
                    f"how the window is cut into micro-batches: against the window's token mean the step is "
                    f"{versus.scale:.4g}× (residual {versus.residual:.2g}). Not a bug; for a token mean over the "
                    f"whole window use loss_type='dapo' with steps_per_generation={k}", None)
        design = (f"{loss_type} is accumulation-invariant only while steps_per_generation = "
                  "gradient_accumulation_steps, as here" if loss_type in TOKEN_COUNT_LOSSES else
                  f"{loss_type} is accumulation-invariant by design")
        return Cause.EXACT, f"the step applies the gradient of {documented} over its {j} micro-batches; {design}", None
    generation = fits.get("generation")
    if generation is not None and generation.plain_scale and generation.near(1.0):
        g = generation_tokens[0]
        counts = ", ".join(f"{c:g}" for c in dict.fromkeys(generation_tokens))
        normaliser = (f"the generation batch's token count × k/steps_per_generation ({g:g} × {k}/{spg} = "
                      f"{g * k / spg:g}; the window holds {window_tokens:g})" if spg >= k else
                      f"each generation batch's own token count ({counts}) × k/steps_per_generation")
        said = (f"the step is {fit.scale:.4g}× the gradient of {documented}" if fit.plain_scale else
                f"the step is not the gradient of {documented} (its best scale {fit.scale:.4g}, residual "
                f"{fit.residual:.2g}): each micro-batch's tokens are weighted by its own generation batch's count")
        other = (f"; the generation's other window then gets {2 - fit.scale:.4g}× (its tokens are the rest of the "
                 f"generation's {g:g})" if spg == 2 * k and fit.plain_scale else "")
        return (Cause.GENERATION_COUNT,
                f"{said}: TRL divides by {normaliser}, the window's own token count only when "
                f"steps_per_generation = gradient_accumulation_steps{other}. The effective learning rate moves from "
                "step to step with how the generation's tokens fall",
                f"GRPOConfig(steps_per_generation={k}) (= gradient_accumulation_steps)")
    if fit.plain_scale:
        return (Cause.SCALED, f"the step is {fit.scale:.4g}× the gradient of {documented} (residual "
                f"{fit.residual:.2g})", None)
    return (Cause.OTHER_LOSS, f"the step is not the gradient of {documented}: best scale {fit.scale:.4g}, residual "
            f"{fit.residual:.2g}", None)


def _over_processes(window: list[dict]) -> list[list[dict]]:
    """Every process's micro-batches, as much of them as holding one needs (its mask, advantages and generation
    count), in rank order; [window] on one process."""
    if not distributed.is_distributed():
        return [window]
    import torch.distributed as dist  # here: only a run on several processes has a process group to gather over

    kept = ("completion_mask", "advantages", "num_items_in_batch")
    mine = [{key: inputs[key].detach().cpu() for key in kept if key in inputs} for inputs in window]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    device = window[0]["completion_mask"].device if window else "cpu"
    everyone[distributed.rank()] = window  # its own, whole and where they are
    return [held if rank == distributed.rank() else [{key: value.to(device) for key, value in inputs.items()}
                                                     for inputs in held]
            for rank, held in enumerate(everyone)]


def _fit(applied: dict, reference: dict, gradient_scale: float, precision: str) -> Fit:
    numbers = projection(applied, reference, gradient_scale=gradient_scale)
    return Fit(numbers["scale"], numbers["residual"], numbers["se"], numbers["rel_error"], precision)


def _autocast_of(micro_batch):
    """The autocast the micro-batch's forward ran under (a bf16/fp16 run's), for its replay."""
    forward = micro_batch.trained
    if forward is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for device, enabled, dtype in forward.autocast:
        if enabled:
            stack.enter_context(torch.autocast(device, dtype=dtype))
    return stack
