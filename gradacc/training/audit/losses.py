"""What a micro-batch's loss is, item by item: the model's kind (classifier, regression head, multi-label head, token
classifier, causal LM, TRL's fused LM head), its items, and its loss summed over them, computed here from the
model's output, not by the model's own loss code (which is what the audit checks).

The kind is read from the model as transformers decides it at the forward (the head's class, ``problem_type``,
``num_labels``, the labels' dtype); where the model's own ``.loss`` is there, the hand-made loss must agree with it
(÷ the micro-batch's items, or ÷ the ``num_items_in_batch`` it was given), or the kind is not one the audit knows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gradacc.conventions import IGNORE_INDEX
from gradacc.training.audit.vocabulary import LossKind

# The kinds by their short names (gradacc.training.audit.vocabulary.LossKind).
CLASSIFICATION, MULTI_LABEL, REGRESSION = LossKind.CLASSIFICATION, LossKind.MULTI_LABEL, LossKind.REGRESSION
TOKEN, CAUSAL, FUSED_CAUSAL = LossKind.TOKEN, LossKind.CAUSAL, LossKind.FUSED_CAUSAL
TRAINER_LOSS, USER_LOSS, DPO = LossKind.TRAINER_LOSS, LossKind.USER_LOSS, LossKind.DPO
KINDS = tuple(LossKind)
# DPO's pair losses the audit computes itself, as TRL documents them (DPOConfig.loss_type).
DPO_LOSS_TYPES = ("sigmoid", "hinge", "robust")


def base_model(model):
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def model_name(model) -> str:
    base = base_model(model)
    return type(base).__name__ + (" (PEFT)" if base is not model else "")


def model_kind(model, labels) -> str | None:
    """The loss a transformers head computes from ``labels``, as its forward decides; None: not one the audit knows."""
    model = base_model(model)
    name = type(model).__name__
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return None  # its labels line up with the decoder's outputs: not a kind judged here
    if name.endswith(("ForCausalLM", "LMHeadModel")) or getattr(model, "loss_type", None) == "ForCausalLM":
        return CAUSAL
    if name.endswith("ForTokenClassification"):
        return TOKEN
    if name.endswith(("ForSequenceClassification", "ForMultipleChoice")):
        problem = getattr(config, "problem_type", None)
        num_labels = getattr(config, "num_labels", 2)
        if problem == "regression" or (problem is None and num_labels == 1):
            return REGRESSION
        if problem == "multi_label_classification" or (problem is None and labels is not None
                                                        and labels.is_floating_point()):
            return MULTI_LABEL
        return CLASSIFICATION
    return None


CANDIDATES = (CLASSIFICATION, REGRESSION, MULTI_LABEL, TOKEN, CAUSAL)


def find_kind(model, output, labels, shift_labels, given_count, tolerance: float,
              router_part: float = 0.0) -> str | None:
    """The kind whose hand-made loss is the model's own: the head's kind when transformers names it, else (a model
    of the user's own) the first standard loss that agrees with its ``.loss`` (less ``router_part``: an MoE model's
    router loss term, added to it). None: none does."""
    if hasattr(output, "log_probs") and hasattr(output, "label_mask"):
        return FUSED_CAUSAL
    named = model_kind(model, labels)
    own = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if router_part and torch.is_tensor(own):
        own = own.detach().double() - router_part
    for kind in ((named,) if named else CANDIDATES if own is not None else ()):
        try:
            total, count = summed(kind, output, labels, shift_labels)
        except (RuntimeError, ValueError, IndexError, AttributeError, KeyError):
            continue  # shapes that do not fit this kind
        if agrees(own, total, count, given_count, tolerance):
            return kind
    return None


def summed(kind: str, output, labels, shift_labels=None, label_smoothing: float = 0.0) -> tuple[torch.Tensor, int]:
    """(the micro-batch's loss summed over its items, its items), from the model's output. ``label_smoothing``: the
    cross-entropy's ε, (1 − ε)·(−log p_label) + ε·mean over the classes of (−log p), as Trainer's
    ``label_smoothing_factor`` defines it."""
    if kind == FUSED_CAUSAL:  # TRL's fused head: log-probs of the next tokens, 0 where ignored
        return -output.log_probs.float().sum(), int(output.label_mask.sum())
    logits = output["logits"] if isinstance(output, dict) else output.logits
    logits = logits.float()
    if kind == CAUSAL:
        if shift_labels is None:  # the labels shifted, not the logits: no copy of a (tokens × vocabulary) tensor
            shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        target = shift_labels.reshape(-1)
        total = F.cross_entropy(logits.reshape(target.numel(), -1), target, ignore_index=IGNORE_INDEX, reduction="sum",
                                label_smoothing=label_smoothing)
        return total, int((target != IGNORE_INDEX).sum())
    if kind in (CLASSIFICATION, TOKEN):
        flat = labels.reshape(-1)
        total = F.cross_entropy(logits.reshape(flat.numel(), -1), flat, ignore_index=IGNORE_INDEX, reduction="sum",
                                label_smoothing=label_smoothing)
        return total, int((flat != IGNORE_INDEX).sum())
    if kind == REGRESSION:
        values = logits.squeeze() if logits.numel() == labels.numel() else logits
        return F.mse_loss(values.reshape(labels.shape), labels.float(), reduction="sum"), labels.numel()
    if kind == MULTI_LABEL:
        return F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="sum"), labels.numel()
    raise ValueError(f"no hand-made loss for {kind!r}")


def items(kind: str, labels, shift_labels=None) -> int:
    """The items a micro-batch's loss averages over (without running the model)."""
    if kind in (CAUSAL, FUSED_CAUSAL):
        return int(((shift_labels if shift_labels is not None else labels[..., 1:]) != IGNORE_INDEX).sum())
    if kind in (CLASSIFICATION, TOKEN):
        return int((labels != IGNORE_INDEX).sum())
    return labels.numel()


def agrees(own_loss, total: torch.Tensor, count: int, given_count, tolerance: float) -> bool:
    """Whether the model's own loss is the hand-made sum ÷ the micro-batch's items or ÷ the count it was given."""
    if own_loss is None or not torch.is_tensor(own_loss) or own_loss.numel() != 1:
        return True  # nothing to check against (the trainer popped the labels, or TRL computes it outside)
    own, total = float(own_loss.detach()), float(total.detach())
    divisors = [count] + ([float(given_count)] if given_count is not None else [])
    return any(math.isclose(own, total / d, rel_tol=tolerance, abs_tol=1e-7) for d in divisors if d)


@dataclass(frozen=True)
class DPOObjective:
    """DPOConfig's objective: ``loss_type`` (each of DPO_LOSS_TYPES) weighted by ``loss_weights``, ``beta`` and
    ``label_smoothing`` (robust DPO's flip probability)."""

    loss_types: tuple
    loss_weights: tuple
    beta: float
    label_smoothing: float = 0.0

    @classmethod
    def of(cls, args) -> "DPOObjective | None":
        """The objective of a DPOConfig, when it is one the audit computes (else None: the trainer's compute_loss is
        replayed instead)."""
        types = tuple(args.loss_type if isinstance(args.loss_type, (list, tuple)) else [args.loss_type])
        if (not set(types) <= set(DPO_LOSS_TYPES) or getattr(args, "f_divergence_type", "reverse_kl") != "reverse_kl"
                or getattr(args, "ld_alpha", None) is not None or getattr(args, "use_weighting", False)):
            return None
        weights = tuple(args.loss_weights or [1.0] * len(types))
        return cls(types, weights, float(args.beta), float(getattr(args, "label_smoothing", 0.0)))

    def summed(self, chosen, rejected, ref_chosen, ref_rejected) -> torch.Tensor:
        """The loss summed over the pairs, from each sequence's summed log-probability."""
        margin = self.beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
        total = 0.0
        for loss_type, weight in zip(self.loss_types, self.loss_weights):
            if loss_type == "sigmoid":
                per_pair = -F.logsigmoid(margin)
            elif loss_type == "hinge":
                per_pair = torch.relu(1 - margin)
            else:  # robust: the preference label flipped with probability ε, unbiased
                epsilon = self.label_smoothing
                per_pair = (-(1 - epsilon) * F.logsigmoid(margin) + epsilon * F.logsigmoid(-margin)) / (1 - 2 * epsilon)
            total = total + weight * per_pair.sum()
        return total


@dataclass(frozen=True)
class LossRule:
    """How the audit gets a micro-batch's summed loss and its items (``measure`` holds the replay):

    ``kind``: one of KINDS. ``compute_loss_func``: a Trainer's own one, called with the micro-batch's items (its
    mean), then × the items; ``label_smoothing``: Trainer's ``label_smoothing_factor``, computed here by hand (with a
    ``compute_loss_func`` too: whether it keeps the smoothing is checked); ``loss_fn(model, batch)``: the user's loss,
    (summed, items) or a mean over the batch's rows."""

    kind: str
    compute_loss_func: object = None
    label_smoothing: float = 0.0
    loss_fn: object = None
    dpo: DPOObjective | None = None  # DPO: its objective
    rows_per_item: int = 1           # a trainer's own loss: 2 for DPO's pairs (chosen and rejected rows)
