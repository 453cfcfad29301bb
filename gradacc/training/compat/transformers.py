"""transformers' internals gradacc relies on (transformers 5.24): how Trainer calls ``compute_loss``; where an MoE
model keeps its router loss's settings and its router weights."""

from __future__ import annotations

from typing import NamedTuple

# Trainer.compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None): after model and inputs,
# num_items_in_batch is the second positional argument when a caller passes it by position.
NUM_ITEMS_POSITION = 1


def num_items_in_batch(args: tuple, kwargs: dict):
    """The ``num_items_in_batch`` a ``compute_loss`` call was given (after ``model, inputs``), or None."""
    if "num_items_in_batch" in kwargs:
        return kwargs["num_items_in_batch"]
    return args[NUM_ITEMS_POSITION] if len(args) > NUM_ITEMS_POSITION else None


class RouterSettings(NamedTuple):
    coefficient: float          # the config's router_aux_loss_coef: the objective, coef × the router loss
    forward_coefficient: float  # the instance's: what each forward adds (the forward reads it, not the config)
    experts: int
    per_token: int              # experts chosen per token (top k)


def moe_model(model):
    """The MoE model in ``model``: itself, or the first module inside it (a LightningModule's ``self.model``, a
    user's wrapper, PEFT's) that holds its router loss's settings; None when there is none."""
    for module in model.modules():
        if hasattr(module, "router_aux_loss_coef") and hasattr(module, "num_experts_per_tok"):
            return module
    return None


def router_loss_settings(model) -> RouterSettings | None:
    """How an MoE model whose forward adds its router (load-balancing) loss to its loss (when it is given labels and
    ``output_router_logits`` is on) weighs it: the MoE ``…ForCausalLM`` classes (Mixtral, Qwen2-MoE, Qwen3-MoE, …)
    copy ``router_aux_loss_coef``, ``num_experts`` and ``num_experts_per_tok`` onto the instance at build, and their
    forward reads the instance's coefficient. ``model`` may hold it (``moe_model``). None for any other model (their
    classifiers add none), or a coefficient of 0."""
    model = moe_model(model)
    forward = getattr(model, "router_aux_loss_coef", None)
    experts, per_token = getattr(model, "num_experts", None), getattr(model, "num_experts_per_tok", None)
    configured = getattr(getattr(model, "config", None), "router_aux_loss_coef", forward)
    if not forward or not configured or not isinstance(experts, int) or not isinstance(per_token, int):
        return None
    return RouterSettings(float(configured), float(forward), experts, per_token)


def router_parameter_names(model) -> set[str]:
    """The names, in ``model``, of the router (gate) weights of the MoE model it is or holds: the parameters of the
    modules whose output that model records as its ``router_logits`` (``_can_record_outputs["router_logits"]``, an
    ``OutputRecorder`` of the router's class)."""
    inner = moe_model(model) or model
    recorder = (getattr(inner, "_can_record_outputs", None) or {}).get("router_logits")
    router_class = getattr(recorder, "target_class", recorder)
    if not isinstance(router_class, type):
        return set()
    return {f"{name}.{param}" if name else param
            for name, module in model.named_modules() if isinstance(module, router_class)
            for param, _ in module.named_parameters(recurse=False)}
