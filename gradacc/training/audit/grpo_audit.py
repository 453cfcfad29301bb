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

An MoE model whose router (load-balancing) loss TRL adds (``aux_loss_enabled``: coef · aux_loss ÷ the accumulation
steps, per micro-batch) has coef × the micro-batches' mean router loss in its objective, as the audit judges it for
Trainer and DPO (``gradacc.training.audit.router``): each replayed forward returns its router logits, the audit
computes that micro-batch's router loss itself (it must equal the model's ``aux_loss``) and adds coef ÷ the window's
micro-batches (every process's) × it to the micro-batch's share, in the same backward. The step is exact only when
it fits that sum over every parameter and on the router weights alone, where the router term is not drowned; when
it does not, the window is replayed again without the router loss, the router term is the difference, and each term
is judged on its own share.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch

from gradacc.training import distributed
from gradacc.training.audit import grpo, losses, router
from gradacc.training.audit.capture import RandomState
from gradacc.training.audit.verdict import EXACT, NOT_JUDGED, Fit, RouterFit, Verdict, clip_check
from gradacc.training.audit.vocabulary import Cause, Integration, LossKind
from gradacc.training.compat import transformers as compat_transformers
from gradacc.training.compat import trl
from gradacc.training.gradients import projection
from gradacc.training.tolerances import AGREE

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


@dataclass(frozen=True)
class RouterLoss:
    """One micro-batch's router (load-balancing) loss, computed by the audit from its replayed router logits."""

    loss: torch.Tensor        # router.load_balancing(sums), with grad through the router probabilities
    sums: torch.Tensor        # router.expert_sums, detached: what adds up over micro-batches and processes
    model_loss: float | None  # the model's own aux_loss of that forward (what TRL adds), to agree with ``loss``


def replayed(model, inputs: dict, temperature: float) -> grpo.MicroBatch:
    """One micro-batch through ``model``: its completion tokens' log-probs (with grad), beside what was stored."""
    return _forward(model, inputs, temperature)[0]


def replayed_with_router(model, inputs: dict, temperature: float, per_token: int) -> tuple[grpo.MicroBatch,
                                                                                           RouterLoss]:
    """``replayed``, its forward asked for the router logits (as TRL's is), and the micro-batch's router loss from
    them (``per_token``: the experts each token chooses)."""
    micro_batch, output, attention_mask = _forward(model, inputs, temperature, router_logits=True)
    sums = router.expert_sums(output.router_logits, per_token, attention_mask)
    own = getattr(output, "aux_loss", None)
    return micro_batch, RouterLoss(loss=router.load_balancing(sums), sums=sums.detach(),
                                   model_loss=float(own.detach()) if torch.is_tensor(own) else None)


def _forward(model, inputs: dict, temperature: float, router_logits: bool = False):
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    extra = {"output_router_logits": True} if router_logits else {}
    output = model(input_ids=input_ids, attention_mask=attention_mask, **extra)
    logps = grpo.completion_logps(output.logits, inputs["completion_ids"], temperature)
    old, ref = inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps")
    micro_batch = grpo.MicroBatch(logps=logps, mask=inputs["completion_mask"], advantages=inputs["advantages"],
                                  old_logps=None if old is None else old.to(logps.dtype),
                                  ref_logps=None if ref is None else ref.to(logps.dtype))
    return micro_batch, output, attention_mask


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
    reason = trl.grpo_unsupported(args)
    if reason:
        return reason
    if trl.adds_router_loss(trainer) and compat_transformers.router_loss_settings(trainer.model) is None:
        return ("GRPOTrainer adds an MoE router loss, and the model holds no router settings the audit reads (its "
                "router_aux_loss_coef > 0, num_experts, num_experts_per_tok)")
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
    # An MoE model whose router loss TRL adds: coef × the micro-batches' mean router loss is in the objective.
    router_settings = compat_transformers.router_loss_settings(model) if trl.adds_router_loss(trainer) else None
    coefficient = trl.router_loss_coefficient(trainer) if router_settings else 0.0
    replay = _Replay(model, micro_batches, window, whole, start, params, applied, loss_type, settings(args),
                     args.temperature, processes, precision)
    told_apart = False  # the window replayed a second time, without the router loss
    if not coefficient:
        sums = replay.shares(weights)
    else:
        # One backward for both terms: when the step fits their sum (over every parameter and on the router
        # weights), that is the verdict; otherwise a replay without the router loss tells the two apart.
        both = replay.shares({}, router_weight=coefficient / len(whole), per_token=router_settings.per_token)
        if replay.disagreement:
            return Verdict(gradient=NOT_JUDGED, meaning=f"GRPOTrainer, {replay.disagreement}", **base)
        names = compat_transformers.router_parameter_names(model) & set(applied) or set(applied)
        together = _fit(applied, both["reference"], unclip, precision)
        on_router = _fit({n: applied[n] for n in names}, {n: both["reference"][n] for n in names}, unclip, precision)
        if _right(together) and _right(on_router) and loss_type not in MICRO_BATCH_LOSSES:
            sums = both
        else:
            sums, told_apart = replay.shares(weights), True
            router_gradient = {n: both["reference"][n] - sums["reference"][n] for n in sums["reference"]}
    seconds = time.perf_counter() - started
    if not any(bool(g.any()) for g in sums["reference"].values()):  # nothing to project on
        return Verdict(gradient=NOT_JUDGED, meaning=f"GRPOTrainer, loss_type={loss_type!r}: the window's objective has "
                       "no gradient (every advantage 0: the rewards of each prompt's completions tie)", **base)
    router_fit = None
    main = applied  # the step's gradient less its router term (fitted) when that term was told apart
    if coefficient:
        mean, window_loss = router.mean_and_window(replay.router_sums, len(whole), distributed.sum_over_ranks,
                                                   next(iter(applied.values())).device)
        if told_apart:
            main_scale, router_scale = router.two_term_scales(applied, sums["reference"], router_gradient, unclip)
            fit, off = router.router_term_fit(applied, sums["reference"], router_gradient, names, main_scale, unclip,
                                              precision, [1.0, 0.0, k, k * processes])
            main = router.without_router(applied, router_gradient, router_scale, unclip)
        else:
            main_scale, fit, off = together.scale, on_router, on_router.rel_error
        router_fit = _router_cause(fit, k, processes, coefficient, main_scale, off, mean, window_loss)
    fits = {which: _fit(main, sums[which], unclip, precision) for which in sums}
    fit = fits["reference"]
    cause, meaning, fix = _cause(loss_type, fit, fits, k, spg, window_tokens, generation_tokens, len(whole))
    checks = ()
    if router_fit is not None:
        if not fit.plain_scale and router_fit.cause != EXACT:  # the main loss's error spills onto the router weights
            router_fit = _router_cause(router_fit.fit, k, processes, coefficient, router_fit.main_scale,
                                       router_fit.off_on_router_weights, router_fit.micro_batch_mean,
                                       router_fit.window_loss, main_off=True)
        leads = cause in (EXACT, Cause.BY_DESIGN) and router_fit.cause != EXACT
        if leads:  # the main objective is right: the router term is the cause
            cause, meaning, fix = router_fit.cause, router_fit.meaning, router_fit.fix
        elif router_fit.cause == EXACT:
            meaning += (f"; its router term coef·(the micro-batches' mean router loss) is in it, on the router weights "
                        f"(scale {router_fit.fit.scale:.5g}, coef {coefficient:g})")
        checks = (router.check(router_fit, leads, added_by="GRPOTrainer"),)
    reference = (f"the documented {loss_type} objective, computed from the window's stored completions, advantages "
                 "and log-probs" + (", plus coef × the micro-batches' mean router loss, computed from their router "
                                    "logits" if coefficient else ""))
    return Verdict(gradient=cause, meaning=meaning, fix=fix, fit=fit, items=tuple(tokens[start:start + j]),
                   reference=reference, window_items=window_tokens, counted_items=generation_tokens[0],
                   replay="each micro-batch's forward replayed once from its own random state"
                          + ("; replayed again without the router loss, to tell its term apart" if told_apart else ""),
                   reference_seconds=seconds, audit_seconds=time.perf_counter() - started, router=router_fit,
                   **{**base, "checks": base["checks"] + checks})


class _Replay:
    """The window's micro-batches (this process's) replayed into the window objective, each one's share of its
    gradient summed, over the processes too."""

    def __init__(self, model, micro_batches, window, whole, start, params, applied, loss_type, objective,
                 temperature, processes, precision):
        self.model, self.micro_batches, self.window, self.whole, self.start = model, micro_batches, window, whole, start
        self.params, self.applied, self.loss_type, self.objective = params, applied, loss_type, objective
        self.temperature, self.processes = temperature, processes
        self.tolerance = AGREE[precision]  # the audit's router loss against the model's, as Replayer checks it
        self.router_sums: list = []  # each of this process's micro-batches' router.expert_sums
        self.disagreement: str | None = None  # why the audit's router loss is not the model's, on any process

    def shares(self, weights: dict, router_weight: float | None = None, per_token: int = 0) -> dict:
        """{"reference": Σ shares, and per ``weights`` Σ w_i × share_i}, {name: flat float32}. With
        ``router_weight``: each share holds ``router_weight`` × the micro-batch's router loss too."""
        # In float32 whatever the parameters' dtype: a bf16 sum of k shares would round each one.
        sums = {name: {n: torch.zeros_like(g, dtype=torch.float32) for n, g in self.applied.items()}
                for name in ("reference", *weights)}
        router_sums, disagreements = [], []
        kept = RandomState.take()
        try:
            for mine_at, (micro_batch, inputs) in enumerate(zip(self.micro_batches, self.window)):
                i = self.start + mine_at  # its place in the whole window
                if micro_batch.rng is not None:
                    micro_batch.rng.put_back_torch()  # dropout draws as the run's forward did
                with _autocast_of(micro_batch):
                    if router_weight is None:
                        mine, routed = replayed(self.model, inputs, self.temperature), None
                    else:
                        mine, routed = replayed_with_router(self.model, inputs, self.temperature, per_token)
                alone = [mine if n == i else _held(other, mine.logps.dtype) for n, other in enumerate(self.whole)]
                objective = grpo.window_objective(self.loss_type, alone, self.objective)
                if routed is not None:
                    objective = objective + router_weight * routed.loss
                    router_sums.append(routed.sums)
                    disagreements.append(_disagreement(routed, self.tolerance))
                share = torch.autograd.grad(objective, list(self.params.values()), allow_unused=True)
                for (name, _), g in zip(self.params.items(), share):
                    if g is None or name not in self.applied:
                        continue
                    g = g.detach().reshape(-1).float()
                    sums["reference"][name].add_(g)
                    for which, w in weights.items():
                        sums[which][name].add_(g, alpha=w[i])
        finally:
            kept.put_back()
        if router_weight is not None:  # a replay without the router loss keeps the last one's
            self.router_sums = router_sums
        said = next((d for d in disagreements if d), None)
        if self.processes > 1:  # each process's shares: the whole window's gradient is their sum
            sums = {which: distributed.sum_gradients_over_ranks(shares) for which, shares in sums.items()}
            if router_weight is not None:  # every process stops alike, or one would wait on the others' reduces
                device = next(iter(self.applied.values())).device
                anywhere = distributed.sum_over_ranks([float(said is not None)], device)[0]
                if anywhere and said is None:
                    said = "on another process, the model's router loss is not the one the audit computes"
        self.disagreement = said
        return sums


def _disagreement(routed: RouterLoss, tolerance: float) -> str | None:
    """Why the micro-batch's router loss the audit computed is not the model's own (what TRL adds); None when they
    agree within the replay's tolerance."""
    value = float(routed.loss.detach())
    if routed.model_loss is None or abs(routed.model_loss - value) <= tolerance * max(1.0, abs(value)):
        return None
    return (f"the model's router loss (aux_loss {routed.model_loss:.6g}) is not the load-balancing loss the audit "
            f"computes from its router logits ({value:.6g}), so the router term TRL adds cannot be computed")


def _right(fit: Fit) -> bool:
    """The step is the reference's gradient: a plain scale of 1."""
    return fit.plain_scale and fit.near(1.0)


# What GRPOTrainer should add per micro-batch, as TRL 1.16 does: the router term a verdict's fix names.
TRL_ROUTER_TERM = "loss + router_aux_loss_coef * aux_loss / gradient_accumulation_steps per micro-batch, as TRL 1.16 adds it"


def _router_cause(fit: Fit, k: int, processes: int, coefficient: float, main_scale: float, off: float,
                  micro_batch_mean: float, window_loss: float, main_off: bool = False) -> RouterFit:
    """The router term's cause from its fit on the router weights (1: coef × the micro-batches' mean router loss)."""
    return router.judge(fit, who=Integration.TRAINER, k=k, processes=processes, coefficient=coefficient,
                        forward_coefficient=coefficient, main_scale=main_scale, off=off,
                        micro_batch_mean=micro_batch_mean, window_loss=window_loss, main_off=main_off,
                        trainer_adds=TRL_ROUTER_TERM)


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
