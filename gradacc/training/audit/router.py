"""An MoE model's router (load-balancing) loss, computed by the audit from the router logits, and its term in the step
judged apart from the main loss.

The loss is Switch Transformer's (eqs. 4-6), as transformers' MoE models define it: with E experts each choosing
its top k experts, over every (layer, token) row that is not padding,

    aux = E · Σ_e f_e · P_e    f_e = the rows' top-k choices of expert e ÷ the rows,   P_e = the mean router
                               probability (softmax of the router logits) of e over the rows

and a model's loss is its main loss + router_aux_loss_coef · aux, per forward. It is not linear in the batch (f and P
are means over the batch's rows): the micro-batches' mean router loss is not the window's, and no accumulation gives
the big batch's. The audit's reference for the router term is therefore coef × the micro-batches' mean (what a
right accumulation of the model's own per-forward loss applies), and the window's router loss is reported beside it.

The step's gradient g is fitted on two references at once, g ≈ a·M + b·R (M: the main loss's, R: the router
term's): the main loss is then judged as any other (g − b·R against M), the router term on the router weights,
where it is not drowned by the main loss (g − a·M against R there): at Mixtral's coefficient 0.001 the router term
is under the fp32 noise of the whole gradient, and a large share of the router weights'.
"""

from __future__ import annotations

import torch

from gradacc.training.audit.verdict import EXACT, Check, Fit, RouterFit
from gradacc.training.audit.vocabulary import ROUTER_TERM, Cause, CheckName, Integration, words
from gradacc.training.gradients import projection


def expert_sums(router_logits, top_k: int, attention_mask=None) -> torch.Tensor:
    """[the top-k choices of each expert, each expert's router probabilities summed, the rows], in float64, summed
    over the layers' rows that are not padding: what the loss is made of, and what adds up over micro-batches and
    processes. ``router_logits``: one (rows, E) tensor per layer; ``attention_mask``: (batch, sequence) or None."""
    experts = router_logits[0].shape[-1]
    choices = torch.zeros(experts, dtype=torch.float64, device=router_logits[0].device)
    probabilities = torch.zeros_like(choices)
    rows = torch.zeros((), dtype=torch.float64, device=choices.device)
    for logits in router_logits:
        p = torch.softmax(logits.double(), dim=-1)
        weight = (torch.ones(p.shape[0], dtype=torch.float64, device=p.device) if attention_mask is None or
                  attention_mask.dim() != 2 else attention_mask.reshape(-1).to(p.device, torch.float64))
        chosen = torch.nn.functional.one_hot(p.detach().topk(top_k, dim=-1).indices, experts).sum(dim=1)
        choices = choices + (chosen.double() * weight[:, None]).sum(dim=0)
        probabilities = probabilities + (p * weight[:, None]).sum(dim=0)
        rows = rows + weight.sum()
    return torch.cat([choices, probabilities, rows.reshape(1)])


def load_balancing(sums: torch.Tensor) -> torch.Tensor:
    """The router loss from ``expert_sums`` (its gradient flows through the probabilities; the choices are counts)."""
    experts = (sums.numel() - 1) // 2
    choices, probabilities, rows = sums[:experts], sums[experts:2 * experts], sums[-1]
    return experts * ((choices / rows) * (probabilities / rows)).sum()


def mean_and_window(sums: list, micro_batches: int, over_ranks, device) -> tuple[float, float]:
    """(the micro-batches' mean router loss, the router loss of the window's tokens as one batch) from each
    micro-batch's ``expert_sums``; ``over_ranks`` sums a list of floats over the processes that share the window,
    ``micro_batches`` counts them all."""
    mean = over_ranks([sum(float(load_balancing(s)) for s in sums)], device)[0] / micro_batches
    window = torch.tensor(over_ranks(torch.stack(sums).sum(dim=0).tolist(), device), dtype=torch.float64)
    return mean, float(load_balancing(window))


def two_term_scales(applied: dict, main: dict, router: dict, unclip: float) -> tuple[float, float]:
    """(a, b) of the least-squares fit g·unclip ≈ a·M + b·R over every parameter, in float64."""
    mm = mr = rr = gm = gr = 0.0
    for name, g in applied.items():
        m, r = main.get(name), router.get(name)
        g = g.double() * unclip
        m = m.double() if m is not None else torch.zeros_like(g)
        r = r.double() if r is not None else torch.zeros_like(g)
        mm, mr, rr = mm + float(m @ m), mr + float(m @ r), rr + float(r @ r)
        gm, gr = gm + float(g @ m), gr + float(g @ r)
    determinant = mm * rr - mr * mr
    if not rr or not determinant:
        return (gm / mm if mm else 1.0), 0.0
    return (gm * rr - gr * mr) / determinant, (gr * mm - gm * mr) / determinant


def without_router(applied: dict, router: dict, router_scale: float, unclip: float) -> dict:
    """The step's gradient less its fitted router term (on the step's own scale, before ÷ its final clipping)."""
    return {name: g - (router_scale / unclip) * router[name].to(g.dtype) if name in router else g
            for name, g in applied.items()}


def router_term_fit(applied: dict, main: dict, router: dict, names: set, main_scale: float, unclip: float,
                    precision: str, expected) -> tuple[Fit, float]:
    """(the router term on the router weights, g·unclip − a·M against R; ‖g·unclip − (M + R)‖ ÷ ‖M + R‖
    there)."""
    names = [n for n in names if n in applied and n in router]
    step = {n: applied[n].double() * unclip - main_scale * main[n].double() for n in names if n in main}
    reference = {n: router[n].double() for n in step}
    numbers = projection(step, reference, expected=expected)
    whole = sum(float(((applied[n].double() * unclip) - main[n].double() - router[n].double()).square().sum())
                for n in step)
    norm = sum(float((main[n].double() + router[n].double()).square().sum()) for n in step)
    off = (whole / norm) ** 0.5 if norm else 0.0
    return Fit(numbers["scale"], numbers["residual"], numbers["se"], numbers["rel_error"], precision), off


def judge(fit: Fit, *, who: Integration, k: int, processes: int, coefficient: float, forward_coefficient: float,
          main_scale: float, off: float, micro_batch_mean: float, window_loss: float, main_off: bool,
          in_function: bool = False, trainer_adds: str | None = None) -> RouterFit:
    """The router term's cause, what it means and its fix, from its fit on the router weights. ``coefficient``: the
    config's (the objective); ``forward_coefficient``: the one each forward adds (the model's attribute), which the
    fix sets: the config keeps saying what the objective is. ``main_off``: the main loss is no scale of its
    reference; its error spills onto the router weights, so the router term's scale is named within that residual.
    ``trainer_adds``: a trainer whose own code adds the term to each micro-batch's loss (GRPOTrainer), in the form
    that is right; the fix names it."""
    scale = fit.scale
    plain = fit.plain_scale or main_off

    def near(value: float) -> bool:
        spread = max(fit.tolerance, fit.residual) if main_off else fit.tolerance
        return abs(scale - value) <= spread * max(1.0, value)

    gap = (f"The window's tokens as one batch have router loss {window_loss:.4g}, its micro-batches "
           f"{micro_batch_mean:.4g} on average: the router loss is not linear in the batch, so no accumulation gives "
           "the big batch's; the reference is the micro-batches' mean")
    where = f"on the router weights (the step is {off:.1%} off there; main loss {main_scale:.5g}×)"
    if main_off:
        where += (f", within {fit.residual:.2g}: the main loss is no scale of its own reference, and its error "
                  "reaches the router weights")
    if plain and near(1):
        cause, meaning, fix = EXACT, f"coef·(the micro-batches' mean router loss) {where}. {gap}", None
    elif plain and not near(0):
        large = k * processes if processes > 1 and near(k * processes) else k
        times = f"k·P = {k}·{processes}" if large != k else f"k = {k}"
        why = "each micro-batch's router loss is added whole, k of them per step"
        if who == Integration.TRAINER:
            why = ("Trainer adds each micro-batch's router_aux_loss_coef · aux_loss whole (it is not divided by "
                   "num_items_in_batch), k per step" + (", and multiplies the loss by the processes "
                                                         "(average_tokens_across_devices; transformers #48690)"
                                                         if large != k else ""))
        if trainer_adds:
            why = "each micro-batch's router_aux_loss_coef · aux_loss is added whole, not ÷ the accumulation steps"
        cause = Cause.ROUTER_K_TIMES if k > 1 and near(large) else Cause.ROUTER_SCALED
        meaning = (f"{scale:.4g}× coef·(the micro-batches' mean router loss)"
                   + (f" ({times}): {why}" if cause == Cause.ROUTER_K_TIMES else "") + f", {where}. {gap}")
        right = forward_coefficient / scale  # what each forward should add for a factor of 1
        if in_function:
            why = "your compute_loss_func adds each micro-batch's router loss at this scale, k per step"
            meaning = (f"{scale:.4g}× coef·(the micro-batches' mean router loss)"
                       + (f" ({times}): {why}" if cause == Cause.ROUTER_K_TIMES else "") + f", {where}. {gap}")
            return RouterFit(coefficient=coefficient, forward_coefficient=forward_coefficient, fit=fit,
                             main_scale=main_scale, cause=cause, meaning=meaning,
                             fix=f"divide the router term your compute_loss_func adds by {scale:.4g}: "
                                 f"model.config.router_aux_loss_coef / {k} * outputs.aux_loss",
                             off_on_router_weights=off, micro_batch_mean=micro_batch_mean, window_loss=window_loss)
        fix = (f"divide the router term each micro-batch adds by {scale:.4g}: {trainer_adds}" if trainer_adds else
               f"make each forward add the router loss at {right:.4g}, keeping the config's coefficient "
               f"{coefficient:g} (the objective): model.router_aux_loss_coef = model.config.router_aux_loss_coef / "
               f"{coefficient / right:.4g} after building the model")
    else:
        cause = Cause.ROUTER_OTHER
        meaning = (f"no scale of coef·(the micro-batches' mean router loss) {where} (residual {fit.residual:.2g}, "
                   f"scale {scale:.3g}). {gap}")
        fix = ("let the model add its router loss to each micro-batch's loss, at 1/k of the config's coefficient: "
               "model.router_aux_loss_coef = model.config.router_aux_loss_coef / k")
        if who != Integration.TRAINER and plain and near(0):  # a loss of the user's own, from the logits alone
            fix = f"add the router term to each micro-batch's loss: + {ROUTER_TERM.format(k=k)}"
        if trainer_adds:
            fix = trainer_adds
    return RouterFit(coefficient=coefficient, forward_coefficient=forward_coefficient, fit=fit, main_scale=main_scale,
                     cause=cause, meaning=meaning, fix=fix, off_on_router_weights=off,
                     micro_batch_mean=micro_batch_mean, window_loss=window_loss)


def check(fit: RouterFit, leads: bool, folded: bool = False, added_by: str = "") -> Check:
    """The ``router_loss`` check beside the gradient's verdict. ``leads``: the router term is the gradient's cause
    (said there); ``folded``: the gradient's fix adds the router term right, so this check names no fix of its own;
    ``added_by``: the trainer whose code adds the term, when not the model's forward."""
    said = f"router loss (router_aux_loss_coef={fit.coefficient:g}{f', added by {added_by}' if added_by else ''})"
    if leads:
        return Check(CheckName.ROUTER_LOSS, None, f"{said}: the gradient's cause above")
    ok = fit.cause == EXACT
    return Check(CheckName.ROUTER_LOSS, ok, f"{said} {words(fit.cause)}: {fit.meaning}",
                 "the gradient's fix above adds it at 1/k" if folded and not ok else fit.fix)
