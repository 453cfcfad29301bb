"""TRL's internals gradacc relies on (TRL 1.16): what a replay of a TRL trainer's ``compute_loss`` changes, and which
class a trainer is. TRL is optional: nothing here imports it."""

from __future__ import annotations

import copy

# Attributes a TRL trainer's compute_loss updates as it runs (its logged metrics, its token count): a replay must put
# them back, or the run logs the replayed micro-batches twice.
REPLAY_MUTATED = ("_metrics", "_total_train_tokens")


def kept_state(trainer) -> dict:
    """Copies of what a replay of ``trainer``'s compute_loss would change (``put_back`` restores them)."""
    if trainer is None:
        return {}
    return {name: copy.deepcopy(value) for name, value in vars(trainer).items() if name in REPLAY_MUTATED}


def put_back(trainer, kept: dict) -> None:
    for name, value in kept.items():
        setattr(trainer, name, value)


def trl_class(trainer, names) -> str | None:
    """The name of the TRL trainer class among ``names`` that ``trainer`` is (a subclass of), or None."""
    for cls in type(trainer).__mro__:
        if cls.__name__ in names and cls.__module__.startswith("trl."):
            return cls.__name__
    return None


def dpo_reference_model(trainer):
    """DPOTrainer's frozen reference model (None when the reference is the policy with its adapters off)."""
    return getattr(trainer, "ref_model", None)


def adds_router_loss(trainer) -> bool:
    """Whether DPOTrainer or GRPOTrainer adds an MoE router loss to its own (``aux_loss_enabled``)."""
    return bool(getattr(trainer, "aux_loss_enabled", False))


def router_loss_coefficient(trainer) -> float:
    """The coefficient the trainer weighs an MoE model's router loss by: GRPOConfig's ``router_aux_loss_coef``, else
    the model config's (``GRPOTrainer.router_aux_loss_coef``). GRPOTrainer adds coef · aux_loss ÷ the accumulation
    steps to each micro-batch's loss."""
    return float(getattr(trainer, "router_aux_loss_coef", 0.0))


# GRPOTrainer: what its compute_loss is given per micro-batch, after generation and scoring (the audit's GRPO
# reference is computed from these). num_items_in_batch: the generation batch's loss tokens, over every process.
GRPO_INPUTS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
               "ref_per_token_logps", "num_items_in_batch")
# What else a micro-batch may carry that changes the loss or the forward: tool results' mask (multi-turn), vLLM's
# importance-sampling ratio, a vision-language model's inputs.
GRPO_OTHER_INPUTS = ("tool_mask", "importance_sampling_ratio", "sampling_per_token_logps", "pixel_values",
                     "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes", "token_type_ids",
                     "mm_token_type_ids", "image_position_ids", "num_images", "num_tiles")


def grpo_inputs(inputs: dict) -> dict:
    """The GRPO_INPUTS that one micro-batch's inputs hold (tensors)."""
    return {key: inputs[key] for key in GRPO_INPUTS if hasattr(inputs.get(key), "shape")}


def grpo_model_inputs(inputs: dict) -> list[str]:
    """The GRPO_OTHER_INPUTS a micro-batch holds: a loss or a forward the audit does not compute."""
    return [key for key in GRPO_OTHER_INPUTS if inputs.get(key) is not None]


def grpo_settings(args) -> dict:
    """The GRPOConfig fields the documented objective reads, by gradacc.training.audit.grpo.Settings's names."""
    return dict(max_completion_length=args.max_completion_length, beta=args.beta,
                bias_correction_kl=args.use_bias_correction_kl, epsilon_low=args.epsilon,
                epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
                importance_sampling_level=args.importance_sampling_level,
                sapo_temperature_pos=args.sapo_temperature_pos, sapo_temperature_neg=args.sapo_temperature_neg,
                vespo_k_pos=args.vespo_k_pos, vespo_lambda_pos=args.vespo_lambda_pos, vespo_k_neg=args.vespo_k_neg,
                vespo_lambda_neg=args.vespo_lambda_neg)


def grpo_unsupported(args) -> str | None:
    """The GRPOConfig setting (the first) that puts the run's loss outside the documented objectives the audit
    computes, as a reason in the config's own terms; None when there is none. (An MoE model's router loss is in
    them: the audit computes it, gradacc.training.audit.grpo_audit.)"""
    reasons = (
        (args.num_iterations != 1, f"num_iterations={args.num_iterations}: each generation is trained on more than "
                                   "once, and the audit computes the objective of num_iterations=1"),
        (args.use_vllm, "use_vllm=True: vLLM's sampling carries an importance-sampling correction the audit does not "
                        "compute"),
        (args.top_entropy_quantile < 1.0, f"top_entropy_quantile={args.top_entropy_quantile}: the entropy mask "
                                          "drops tokens the audit does not"),
        (args.delta is not None, f"delta={args.delta}: the two-sided clip is not in the audit's objective"),
        (args.off_policy_mask_threshold is not None, "off_policy_mask_threshold is set: the off-policy sequence "
                                                     "mask is not in the audit's objective"),
        (args.entropy_coef != 0.0 or args.use_adaptive_entropy,
         "an entropy bonus (entropy_coef, use_adaptive_entropy) is not in the audit's objective"),
        (args.use_liger_kernel, "use_liger_kernel=True: Liger's fused GRPO loss is not replayed"),
    )
    return next((reason for applies, reason in reasons if applies), None)
