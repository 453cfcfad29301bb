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
    """Whether DPOTrainer adds an MoE router loss to DPO's (``aux_loss_enabled``)."""
    return bool(getattr(trainer, "aux_loss_enabled", False))
