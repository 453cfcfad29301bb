"""The audit's vocabulary, typed: the causes a verdict names, the checks beside it, the kinds of loss, the ways into a
run. Each member's value is its stable name (the API, the JSON, what tests and benchmarks compare); the words people
read live apart, in WORDS, so a wording can change without breaking anyone. Importing this module imports neither
torch nor transformers (the app's pages read it before torch loads)."""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    """The one cause a verdict names for the step's gradient before its final clipping (docs/audit.md's catalogue)."""

    EXACT = "exact"
    K_TIMES = "k_times_too_large"
    DIVIDED_TWICE = "k_times_too_small"
    SHORT_WINDOW = "short_window_divided_by_k"
    MISCOUNTED = "items_miscounted"
    WEIGHTED = "weighted_by_micro_batch"
    CLIPPED = "changed_by_clipping"
    ZEROED = "zeroed_inside_the_window"
    SCALED = "scaled"
    OTHER_LOSS = "not_the_window_mean_loss"
    NOT_JUDGED = "not_judged"
    # GRPO: the step follows its loss type's documented objective, which by design depends on the micro-batches
    # (bnpo's token mean per micro-batch): not a bug, and not a problem of the run.
    BY_DESIGN = "varies_with_micro_batch_by_design"
    # GRPO's dapo/cispo/vespo: divided by the generation batch's token count × k / steps_per_generation, the window's
    # token count only when steps_per_generation = k.
    GENERATION_COUNT = "normalised_by_generation_batch"
    # An MoE model's router (load-balancing) loss, judged on the router weights apart from the main loss (which is
    # exact when one of these is the verdict's cause).
    ROUTER_K_TIMES = "router_loss_k_times_too_large"
    ROUTER_SCALED = "router_loss_scaled"
    ROUTER_OTHER = "router_loss_not_the_micro_batch_mean"


class CheckName(StrEnum):
    """The checks beside the cause."""

    CLIPPING = "clipping"
    SCHEDULER = "scheduler"
    LOGGED_LOSS = "logged_loss"
    SYNC = "sync"
    PROCESSES = "processes"
    OBJECTIVE = "objective"
    LAST_WINDOW = "last_window"  # Lightning: the epoch's short last window, when the first one was judged
    ROUTER_LOSS = "router_loss"  # an MoE model's router (load-balancing) loss term


class LossKind(StrEnum):
    """What a micro-batch's loss is, item by item, as the audit computes (or replays) it."""

    CLASSIFICATION = "classification"
    MULTI_LABEL = "multi_label"
    REGRESSION = "regression"
    TOKEN = "token_classification"
    CAUSAL = "causal_lm"
    FUSED_CAUSAL = "fused_causal_lm"        # TRL's fused LM head: log-probs of the next tokens
    TRAINER_LOSS = "trainers_own"           # no labels in the batch: the trainer's compute_loss, replayed
    USER_LOSS = "loss_fn"                   # the user's loss_fn
    DPO = "dpo"                             # TRL's DPOTrainer: computed from the policy's and reference's log-probs
    GRPO = "grpo"                           # TRL's GRPOTrainer: its loss_type's documented objective over the window


class Integration(StrEnum):
    """The way the audit came into the run."""

    TRAINER = "trainer"
    ACCELERATE = "accelerate"
    LOOP = "loop"
    LIGHTNING = "lightning"


# What a verdict's line says for each cause, as the noun phrase after "gradient" ("gradient k× too large: ...").
WORDS = {Cause.EXACT: "exact", Cause.K_TIMES: "k× too large", Cause.DIVIDED_TWICE: "k× too small",
         Cause.SHORT_WINDOW: "short window ÷ configured k", Cause.MISCOUNTED: "items miscounted",
         Cause.WEIGHTED: "weighted by micro-batch, not by item", Cause.CLIPPED: "changed by clipping",
         Cause.ZEROED: "zeroed inside the window", Cause.SCALED: "scaled",
         Cause.OTHER_LOSS: "not the window's mean loss", Cause.NOT_JUDGED: "not judged",
         Cause.BY_DESIGN: "varies with the micro-batch by design",
         Cause.GENERATION_COUNT: "scaled by the generation batch's token count",
         Cause.ROUTER_K_TIMES: "router loss k× too large", Cause.ROUTER_SCALED: "router loss scaled",
         Cause.ROUTER_OTHER: "router loss not the micro-batches' mean"}
# Each cause as an English sentence about the gradient, before its details (the Audit page's headline, ending ":").
SENTENCES = {Cause.EXACT: "The gradient is exact", Cause.K_TIMES: "The gradient is k× too large",
             Cause.DIVIDED_TWICE: "The gradient is k× too small",
             Cause.SHORT_WINDOW: "A short window is divided by the configured k",
             Cause.MISCOUNTED: "The loss is divided by a miscount of its items",
             Cause.WEIGHTED: "Micro-batches are weighted equally, not by their items",
             Cause.CLIPPED: "Clipping inside the window changed the gradient",
             Cause.ZEROED: "The gradients were zeroed inside the window",
             Cause.SCALED: "The gradient is scaled",
             Cause.OTHER_LOSS: "The gradient is not that of the window's mean loss",
             Cause.NOT_JUDGED: "Not judged",
             Cause.BY_DESIGN: "The gradient varies with the micro-batch by design",
             Cause.GENERATION_COUNT: "The gradient is scaled by how the generation batch's tokens fall",
             Cause.ROUTER_K_TIMES: "The router loss's gradient is k× too large",
             Cause.ROUTER_SCALED: "The router loss's gradient is scaled",
             Cause.ROUTER_OTHER: "The router loss's gradient is not that of the micro-batches' mean router loss"}
# Each kind of loss in words ("the model's own {…} loss").
KIND_WORDS = {LossKind.CLASSIFICATION: "classifier", LossKind.MULTI_LABEL: "multi-label classifier",
              LossKind.REGRESSION: "regression head", LossKind.TOKEN: "token classifier",
              LossKind.CAUSAL: "causal LM", LossKind.FUSED_CAUSAL: "causal LM (TRL's fused head)",
              LossKind.TRAINER_LOSS: "the trainer's own loss", LossKind.USER_LOSS: "your loss_fn",
              LossKind.DPO: "DPO's loss", LossKind.GRPO: "GRPO's objective"}


# What a hand-written micro-batch loss adds for an MoE model's router term (``outputs = model(**batch)``): the
# model's own loss holds it at the config's coefficient, a loss computed from the logits does not.
ROUTER_LOSS_TERM = "model.config.router_aux_loss_coef * outputs.aux_loss"
ROUTER_TERM = ROUTER_LOSS_TERM + " / {k}"  # a loop's: nothing divides it by k for you (Accelerate's backward does)


def words(cause) -> str:
    """A cause's words; a name this version does not know (a newer verdict's JSON) as it is."""
    try:
        return WORDS[Cause(cause)]
    except ValueError:
        return str(cause)


def kind_words(kind) -> str:
    if kind is None:
        return ""
    try:
        return KIND_WORDS[LossKind(kind)]
    except ValueError:
        return str(kind)
