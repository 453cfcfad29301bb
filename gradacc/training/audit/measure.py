"""The one measurement both integrations (Trainer's callback, Accelerate's watch) make, right before the window's
optimizer step: read the gradient about to be applied (in place; before its final clipping), replay the window into
the reference, project one on the other, and name the cause.

    g = the step's gradient ÷ the final clipping's factor     r = Σ_i ∇(micro-batch i's loss summed over its items) ÷ N

N counts the window's items on every process. When g is no scale of r (its residual is above the precision's
noise), the window is replayed once more with each micro-batch's mean loss counted equally: if g is a scale of
that, the cause is weighting by micro-batch, not by item. That second replay happens only on such a run; a right
run, or one off by a plain scale, costs one replay of the window.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch

from gradacc.training import distributed
from gradacc.training.audit import causes, losses, router
from gradacc.training.audit.capture import MicroBatch, Recorder, WindowLog
from gradacc.training.audit.reference import NotReplayable, Replayer, set_aside
from gradacc.training.audit.verdict import EXACT, NOT_JUDGED, Check, Fit, Verdict, clip_check
from gradacc.training.audit.vocabulary import CheckName, Integration, kind_words
from gradacc.training.compat import transformers as compat_transformers
from gradacc.training.gradients import projection
from gradacc.training.tolerances import OWN_LOSS


@dataclass(frozen=True, kw_only=True)
class Setup:
    """How to measure one loop's window."""

    who: Integration
    module: object                   # the model whose forwards were recorded (replays call it)
    recorder: Recorder
    k: int                           # the configured accumulation steps
    num_processes: int
    precision: str                   # the loop's own setting: fp32, bf16 or fp16 (the forwards may say more)
    rule: losses.LossRule
    custom_loss: str | None = None
    trainer: object = None
    no_sync: object = contextlib.nullcontext  # () -> DDP's no_sync: no all-reduce inside the replays
    model_name: str = ""
    override: str | None = None      # Trainer: "TheirTrainer.compute_loss" / ".training_step", the user's own method


def precision_of(setup: Setup, micro_batches: list[MicroBatch]) -> str:
    for micro_batch in micro_batches:
        for forward in micro_batch.forwards:
            for _, enabled, dtype in forward.autocast:
                if enabled:
                    return "bf16" if dtype == torch.bfloat16 else "fp16"
    if any(p.dtype == torch.bfloat16 for p in setup.module.parameters() if p.requires_grad):
        return "bf16"
    return setup.precision


def measure(setup: Setup, micro_batches: list[MicroBatch], log: WindowLog, backwards: int | None = None,
            counted_items: float | None = None) -> Verdict:
    """The verdict on the gradient about to be applied (read now, in ``.grad``)."""
    started = time.perf_counter()
    micro_batches = [m for m in micro_batches if m.trained is not None or (m.inputs is not None and m.rng)]
    precision = precision_of(setup, micro_batches)
    j = len(micro_batches)
    clips = tuple(log.clips)
    copies = distributed.separate_copies(setup.num_processes)  # each copy trains alone: judged alone, and said
    over_ranks = (lambda values, device: list(values)) if copies else distributed.sum_over_ranks
    base = dict(who=setup.who, k=setup.k, micro_batches=j, num_processes=setup.num_processes, precision=precision,
                clips=clips, model=setup.model_name,
                checks=(clip_check(clips, j, setup.who),) + ((copies_check(copies),) if copies else ()))
    params = {name: p for name, p in setup.module.named_parameters() if p.requires_grad}
    applied = {name: p.grad.detach().reshape(-1) for name, p in params.items() if p.grad is not None}
    if not j or not applied:
        return Verdict(gradient=NOT_JUDGED, kind=setup.rule.kind, meaning=(
            "the window ran no forward of the model with gradients on" if not j else
            "the model has no gradient at the optimizer step"), **base)
    # The gradient before the window's final clipping: what the micro-batches added up to.
    final = [c.factor for c in clips if c.after_micro_batch >= j]
    unclip = 1.0 / math.prod(final) if final and math.prod(final) > 0 else 1.0
    replayer = Replayer(setup.module, setup.recorder, setup.rule, precision, setup.trainer)
    weighted = None
    try:
        with set_aside(setup.module, setup.trainer), setup.no_sync():
            device = next(iter(applied.values())).device
            items = replayer.count(micro_batches)
            router_weight = _router_weight(setup, replayer, j, shared=not copies)  # None: none, or fitted apart
            if items is None:  # the user's loss_fn counts them as it runs: summed first, ÷ the window's items after
                reference = replayer.replay(micro_batches, [1.0] * j)
                items = list(reference.items)
                window_items = _window_items(items, device, over_ranks)
                for p in params.values():
                    if p.grad is not None:
                        p.grad.div_(window_items)
            else:
                window_items = _window_items(items, device, over_ranks)
                # ÷ the window's items, as a right run divides: a right run's gradient comes back bit for bit in bf16.
                # An MoE model's router term goes into the same backward, at its right weight: told apart (a second
                # replay) only when the step is not that objective's gradient.
                reference = replayer.replay(micro_batches, [window_items] * j, router_weight=router_weight)
            seconds = time.perf_counter() - started  # the replay: one forward+backward of the window
            window_loss = over_ranks([reference.summed_loss], device)[0]
            # The scales a cause would give, measured in the projection's one pass: k (k·P), 1/k, j/k, N/N′.
            expected = [setup.k, setup.k * setup.num_processes, 1 / setup.k, j / setup.k] + (
                [window_items / counted_items] if counted_items else [])
            shared = not copies
            router_fit = router_term = fit = None
            told_apart = False  # the router term replayed apart (a second replay)
            whole = applied  # the step's gradient, router term included
            zero_grads = tuple(z for z in log.zero_grads if z < j)
            early_clip = any(c.after_micro_batch < j and c.factor < 1 for c in clips)
            if replayer.router_sums and not replayer.router_gradient:  # both terms in .grad: is the step their sum?
                fit = _fit(applied, params, unclip, precision, expected, shared)
                router_term = _router_together(setup, replayer, applied, params, unclip, precision, j, shared,
                                               device, over_ranks, fit.scale)
                if not (router_term and fit.plain_scale and fit.near(1) and router_term["fit"].plain_scale
                        and router_term["fit"].near(1)):
                    # To say what is off: the main loss replayed alone; the router term is the rest.
                    both = {name: p.grad.detach().reshape(-1).clone() for name, p in params.items()
                            if p.grad is not None}
                    for p in params.values():
                        p.grad = None
                    replayer.replay(micro_batches, [window_items] * j, with_router=False)
                    replayer.router_apart(both, router_weight)
                    router_term, fit, told_apart = None, None, True
            if replayer.router_gradient:  # an MoE model's router loss: judged apart, and taken out of the main's
                router_term, applied = _router_term(setup, replayer, applied, params, unclip, precision, j, shared,
                                                    device, over_ranks)
            fit = fit or _fit(applied, params, unclip, precision, expected, shared)
            if router_term is not None:
                router_fit = router.judge(**router_term, main_off=not fit.plain_scale)
            if not fit.plain_scale and j > 1 and not zero_grads and not early_clip:
                for p in params.values():
                    p.grad = None
                router_kept = replayer.router_gradient, replayer.router_sums
                replayer.replay(micro_batches, [max(n, 1) * j for n in items],  # each micro-batch's mean ÷ j
                                with_router=False)
                if router_term is not None:
                    # The router term fitted again beside this main reference: beside the other, what that one
                    # could not explain went into the router term's fit too (a loop not ÷ k read as "no scale").
                    replayer.router_gradient, replayer.router_sums = router_kept
                    again, applied = _router_term(setup, replayer, whole, params, unclip, precision, j, shared,
                                                  device, over_ranks)
                weighted = _fit(applied, params, unclip * setup.num_processes, precision, expected, shared)
                if router_term is not None and weighted.plain_scale:
                    # "off" stays the step's distance from the right objective (the first reference's)
                    router_fit = router.judge(**{**again, "off": router_term["off"]}, main_off=False)
    except NotReplayable as reason:
        return Verdict(gradient=NOT_JUDGED, kind=replayer.kind, meaning=str(reason), **base)
    loss_ratio = None
    if causes.overrides(setup.custom_loss):  # a compute_loss of the user's own: is what it returns the model's loss?
        loss_ratio = own_loss_ratio(micro_batches, reference, counted_items, precision, setup.k)
        if loss_ratio is None:
            return Verdict(gradient=NOT_JUDGED, kind=reference.kind, meaning=(
                f"the loss {setup.custom_loss} returns is not the model's own {kind_words(reference.kind)} loss, "
                "nor one constant "
                "multiple of it in every micro-batch: the audit cannot judge another objective against it; give it "
                "your loss, audit_trainer(trainer, loss_fn=lambda model, batch: (summed loss, items))"), **base)
    evidence = causes.Evidence(who=setup.who, kind=reference.kind, k=setup.k, micro_batches=j,
                               num_processes=setup.num_processes, fit=fit, weighted_fit=weighted,
                               window_items=window_items, counted_items=counted_items, clips=clips,
                               zero_grads=zero_grads, backwards=backwards, custom_loss=setup.custom_loss,
                               loss_ratio=loss_ratio, override=setup.override, router_term=router_fit is not None)
    gradient, meaning, fix = causes.name(evidence)
    if router_fit is not None:
        leads = gradient == EXACT and router_fit.cause != EXACT  # the main loss is right: the router term is the cause
        if leads:
            gradient, meaning, fix = router_fit.cause, router_fit.meaning, router_fit.fix
        elif gradient == EXACT and router_fit.cause == EXACT:
            meaning += (f", its router term coef·(the micro-batches' mean router loss) on the router weights (scale "
                        f"{router_fit.fit.scale:.5g})")
        base["checks"] += (router.check(router_fit, leads, folded=isinstance(fix, causes.WithRouterTerm)),)
    if replayer.router_dropped and all(replayer.router_dropped):
        base["checks"] += (_router_dropped_check(replayer.router, setup.k),)
    if replayer.smoothing_kept:
        base["checks"] += (_smoothing_check(all(replayer.smoothing_kept), setup.rule, reference.kind),)
    return Verdict(gradient=gradient, kind=reference.kind, meaning=meaning, fix=fix, fit=fit, weighted_fit=weighted,
                   items=reference.items, micro_batch_losses=reference.losses,
                   reference="" if router_fit else replayed_loss(setup),  # a router term: the main loss by hand
                   window_items=window_items, counted_items=counted_items,
                   window_loss=window_loss / window_items if window_items else None,
                   replay=("each micro-batch replayed from its own random state; outputs bit-identical"
                           + ("; replayed again without the router loss, to tell its term apart" if told_apart else "")
                           + ("; replayed twice (equal weights fitted)" if weighted else "")),
                   reference_seconds=seconds, audit_seconds=time.perf_counter() - started, router=router_fit, **base)


def own_loss_ratio(micro_batches: list[MicroBatch], reference, counted: float | None, precision: str,
                   k: int) -> float | None:
    """What an overriding compute_loss returned ÷ the model's own mean loss (replayed), when that ratio is one
    constant over the window, or the loss is the window-normalised sum; None when the returned loss is not the
    model's (another objective). One micro-batch cannot show a constant: its ratio must then be 1 (or k)."""
    returned = [m.returned for m in micro_batches]
    summed, items = reference.losses, reference.items
    if None in returned or len(returned) != len(summed) or not all(summed):
        return None
    tolerance = OWN_LOSS[precision]
    candidates = [[r / (s / n) for r, s, n in zip(returned, summed, items)]]  # × each micro-batch's mean
    if counted:
        candidates.append([r / (s / counted) for r, s in zip(returned, summed)])  # × the window-normalised sum
    for ratios in candidates:
        first = ratios[0]
        if all(abs(r - first) <= tolerance * abs(first) for r in ratios):
            if len(ratios) > 1 or any(abs(first - v) <= tolerance * v for v in (1.0, float(k))):
                return first
    return None


def replayed_loss(setup: Setup) -> str:
    """Where the reference's loss comes from, said when it is the user's own code replayed: a constant factor inside
    that code is in the reference too, so it cannot be seen."""
    if setup.rule.kind == losses.USER_LOSS:
        return "your loss_fn"
    if setup.rule.kind == losses.TRAINER_LOSS:
        owner = type(setup.trainer).__name__ if setup.trainer is not None else "the trainer"
        return f"{owner}'s compute_loss, replayed: a constant factor inside it is not seen"
    if setup.rule.compute_loss_func is not None:
        return "your compute_loss_func, replayed: a constant factor inside it is not seen"
    return ""


def _smoothing_check(kept: bool, rule: losses.LossRule, kind: str) -> Check:
    epsilon = rule.label_smoothing
    if kept:
        return Check(CheckName.OBJECTIVE, True, f"compute_loss_func keeps label_smoothing_factor={epsilon:g}")
    func = causes.LOSS_FUNCS.get(kind)
    return Check(CheckName.OBJECTIVE, False, f"Trainer drops label smoothing when compute_loss_func is set: "
                 f"label_smoothing_factor={epsilon:g} is not in the loss it trains on",
                 f"pass compute_loss_func=functools.partial(gradacc.audit.{func}, label_smoothing={epsilon:g})"
                 if func in ("classifier_mean_loss", "token_mean_loss", "causal_lm_mean_loss") else
                 "apply the smoothing inside your compute_loss_func "
                 f"(F.cross_entropy(..., label_smoothing={epsilon:g}))")


def copies_check(processes: int) -> Check:
    return Check(CheckName.PROCESSES, False,
                 f"{processes} processes launched, each training alone: no gradients are shared",
                 "on a CPU, launch your script as " + distributed.CPU_LAUNCH.format(processes=processes)
                 + " (accelerate launch --multi_gpu starts separate copies there)")


def _router_term(setup: Setup, replayer: Replayer, applied: dict, params: dict, unclip: float, precision: str,
                 j: int, shared: bool, device, over_ranks) -> tuple[dict, dict]:
    """What router.judge takes of the router loss term, and the step's gradient less its fitted router term."""
    coefficient = replayer.router.coefficient  # the config's: the objective (a forward may add another, the fix)
    processes = setup.num_processes if shared else 1
    main = {name: p.grad.detach().reshape(-1) for name, p in params.items() if p.grad is not None}
    # coef × the gradient of the mean router loss over the window's micro-batches, on every process
    reference = {name: g * (coefficient / (j * processes)) for name, g in replayer.router_gradient.items()}
    if shared:
        main, reference = distributed.sum_gradients_over_ranks(main), distributed.sum_gradients_over_ranks(reference)
    main_scale, router_scale = router.two_term_scales(applied, main, reference, unclip)
    names = compat_transformers.router_parameter_names(setup.module) & set(reference) or set(reference)
    expected = [1.0, 0.0, setup.k, setup.k * processes]
    fit, off = router.router_term_fit(applied, main, reference, names, main_scale, unclip, precision, expected)
    judging = _router_judging(setup, replayer, j, processes, device, over_ranks, fit, main_scale, off)
    return judging, router.without_router(applied, reference, router_scale, unclip)


def _router_weight(setup: Setup, replayer: Replayer, j: int, shared: bool) -> float | None:
    """The router loss's weight in the right objective (coef ÷ the micro-batches on every process); None for a model
    without one, or when the router weights cannot be told apart from the rest (their term then always fitted
    apart)."""
    if replayer.router is None or not compat_transformers.router_parameter_names(setup.module):
        return None
    return replayer.router.coefficient / (j * (setup.num_processes if shared else 1))


def _router_together(setup: Setup, replayer: Replayer, applied: dict, params: dict, unclip: float, precision: str,
                     j: int, shared: bool, device, over_ranks, main_scale: float) -> dict | None:
    """What router.judge takes when the reference in ``.grad`` holds both terms: the step against their sum on the
    router weights, where the router term is a large share (None: no router weight has a gradient)."""
    processes = setup.num_processes if shared else 1
    names = compat_transformers.router_parameter_names(setup.module)
    both = {name: p.grad.detach().reshape(-1) for name, p in params.items() if p.grad is not None and name in names}
    if shared:
        both = distributed.sum_gradients_over_ranks(both)
    step = {name: applied[name] for name in both if name in applied}
    if not step:
        return None
    numbers = projection(step, both, gradient_scale=unclip, expected=[setup.k, setup.k * processes])
    fit = Fit(numbers["scale"], numbers["residual"], numbers["se"], numbers["rel_error"], precision)
    return _router_judging(setup, replayer, j, processes, device, over_ranks, fit, main_scale, numbers["rel_error"])


def _router_judging(setup: Setup, replayer: Replayer, j: int, processes: int, device, over_ranks, fit: Fit,
                    main_scale: float, off: float) -> dict:
    """What router.judge takes: the router term's ``fit`` on the router weights, beside the run's settings and the
    window's router losses."""
    mean, window_loss = router.mean_and_window(replayer.router_sums, j * processes, over_ranks, device)
    return dict(fit=fit, who=setup.who, k=setup.k, processes=processes, coefficient=replayer.router.coefficient,
                forward_coefficient=replayer.router.forward_coefficient, main_scale=main_scale, off=off,
                micro_batch_mean=mean, window_loss=window_loss, in_function=setup.custom_loss == "compute_loss_func")


def _router_dropped_check(settings, k: int) -> Check:
    share = f"model.config.router_aux_loss_coef / {k}" if k > 1 else "model.config.router_aux_loss_coef"
    return Check(CheckName.ROUTER_LOSS, False,
                 f"no router loss is trained: Trainer pops the labels for a compute_loss_func, so the model adds none "
                 f"(router_aux_loss_coef={settings.coefficient:g} unused), and the function adds none either",
                 f"add it in your compute_loss_func: return the main loss + {share} * outputs.aux_loss")


def _window_items(items: list, device, over_ranks) -> float:
    window_items = over_ranks([float(sum(items))], device)[0]
    if not window_items:
        raise NotReplayable("the window holds no items to average the loss over (every label ignored)")
    return window_items


def _fit(applied: dict, params: dict, gradient_scale: float, precision: str, expected=(), shared=True) -> Fit:
    """The step's gradient × ``gradient_scale`` against the reference now in ``.grad`` (summed over the processes
    that share the gradient)."""
    reference = {name: p.grad.detach().reshape(-1) for name, p in params.items() if p.grad is not None}
    if shared:
        reference = distributed.sum_gradients_over_ranks(reference)
    numbers = projection(applied, reference, gradient_scale=gradient_scale, expected=expected)
    return Fit(numbers["scale"], numbers["residual"], numbers["se"], numbers["rel_error"], precision)
