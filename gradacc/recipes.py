"""How each built-in model trains well: the values a run takes for every setting the user leaves unset."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gradacc.choices import BUILTIN_MODEL_TASKS, CLASSIFICATION, FROM_SCRATCH_MODELS, TASK_DATASETS
from gradacc.labels import field_label


# These optimizers take one learning rate (the recipes' learning_rate); the others (SGD, Adafactor) their own.
ADAMW_LIKE = ("adamw", "adamw-fused", "adamw-8bit")


@dataclass(frozen=True)
class Recipe:
    """How a model trains well on the built-in data: the values a run takes when the user sets none.

    ``learning_rate`` is AdamW's (and its kin's, ADAMW_LIKE); ``optimizer_rates`` holds the rates of the optimizers
    that update on another scale (SGD, Adafactor), measured for this model by ``python -m gradacc bench
    learning-rates``. An optimizer with no rate here has none in the recipe: the run must set one."""

    learning_rate: float
    warmup_ratio: float
    epochs: int
    max_seq_length: int
    dropout: float
    optimizer_rates: dict[str, float] = field(default_factory=dict, hash=False)
    # The fewest optimizer steps from which the model learnt on every seed tried, at this recipe's AdamW rate and a
    # large effective batch (`python -m gradacc bench learning-steps`); None where none was measured.
    min_optimizer_steps: int | None = None

    def learning_rate_for(self, optimizer: str) -> float | None:
        """The recipe's learning rate for ``optimizer``; None when the recipe has none for it."""
        if optimizer in ADAMW_LIKE:
            return self.learning_rate
        return self.optimizer_rates.get(optimizer)


# One row per built-in model; add a model here and the Train page, the CLI and RunConfig all use its row.
# Measured on the built-in data, m=8, k=4, one epoch, seed 42: tiny-bert (2000 examples, 63 steps) learns from
# scratch only with a high rate (eval F1 0.000 at 1e-3, 0.884 at 5e-3; other seeds can still sit on the plateau
# after one epoch). Its two-epoch default run ends at 0.883 with 5e-3 (0.945 with 1e-3, which fails one epoch). MiniLM (512 examples, 16 steps) reached F1 0.698 at 5e-5 and 0.910 at 2e-4; at 1e-3 a
# pretrained model collapses (the issue: F1 0.000 after a spike at step ~55 of 63).
# optimizer_rates: SGD's and Adafactor's own rates, from `python -m gradacc bench learning-rates` (the sweep and
# its scores are in BENCHMARKS.md); an optimizer is absent where its best rate trained far worse than AdamW at
# the recipe's (SGD stuck on one class), so a run of it must set a rate.
# min_optimizer_steps: from `python -m gradacc bench learning-steps` (BENCHMARKS.md), 2,000 examples at 256 a step:
# the fewest steps from which every seed tried learnt (6 seeds; 3 for MiniLM, whose fewest tried, 8, already did).
RECIPES = {
    "tiny-bert": Recipe(learning_rate=5e-3, warmup_ratio=0.1, epochs=2, max_seq_length=64, dropout=0.1,
                        optimizer_rates={"adafactor": 3e-3}, min_optimizer_steps=24),
    "all-MiniLM-L6-v2": Recipe(learning_rate=2e-4, warmup_ratio=0.1, epochs=1, max_seq_length=64, dropout=0.1,
                               optimizer_rates={"adafactor": 3e-4}, min_optimizer_steps=8),
    # A causal LM from scratch on builtin-text (measured in the issue-12 report: eval loss falls clearly in
    # about 20 s at m=8, k=4); dropout 0, since the LM scenarios compare curves.
    "tiny-gpt": Recipe(learning_rate=5e-3, warmup_ratio=0.1, epochs=1, max_seq_length=64, dropout=0.0,
                       optimizer_rates={"adafactor": 3e-3}),
    # Two small MLPs over mean word embeddings, the same recipe for both so only the norm differs. Measured on the
    # built-in data, m=8, k=4, seed 42: eval F1 after 3 epochs at 2e-2 BatchNorm 0.874, LayerNorm 0.907 (about 1 s);
    # at 5e-3 and 2 epochs 0.733 and 0.704.
    "bow-batchnorm": Recipe(learning_rate=2e-2, warmup_ratio=0.1, epochs=3, max_seq_length=64, dropout=0.0,
                            optimizer_rates={"sgd": 0.3, "adafactor": 1e-1}, min_optimizer_steps=16),
    "bow-layernorm": Recipe(learning_rate=2e-2, warmup_ratio=0.1, epochs=3, max_seq_length=64, dropout=0.0,
                            optimizer_rates={"adafactor": 3e-2}, min_optimizer_steps=24),
}
# Any other model (a local folder or a hub id) is a pretrained checkpoint: fine-tune it gently.
PRETRAINED_RECIPE = Recipe(learning_rate=5e-5, warmup_ratio=0.1, epochs=2, max_seq_length=128, dropout=0.1)
# The run fields a recipe fills (its optimizer_rates fill learning_rate, for the run's optimizer).
RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe) if f.name not in ("optimizer_rates",
                                                                                     "min_optimizer_steps"))


def recipe_for(model: str | None) -> Recipe:
    return RECIPES.get(model.strip() if isinstance(model, str) else "", PRETRAINED_RECIPE)


def learning_rate(model: str | None, optimizer: str, asked: float | None = None) -> float | None:
    """A run's learning rate, resolved in this one place: ``asked`` where the user set one, else ``model``'s recipe
    rate for ``optimizer`` (None where the recipe has none for it: the run must set one).

    ``RunConfig.check`` (the CLI, the Python API, a JSON config), the Train page's field and its notes, and the
    planner's hand-off to the Train page all read the rate here."""
    if asked is not None:
        return asked
    return recipe_for(model).learning_rate_for(optimizer) if isinstance(optimizer, str) else None


def shares_learning_rate(optimizer: str, other: str) -> bool:
    """Whether a learning rate tuned for ``optimizer`` suits ``other`` (same update rule, another kernel)."""
    return optimizer == other or (optimizer in ADAMW_LIKE and other in ADAMW_LIKE)


def recipe_named(model: str) -> str:
    """"tiny-bert's recipe", or "the recipe for a pretrained model" for a folder or hub id."""
    return f"{model.strip()}'s recipe" if model.strip() in RECIPES else "the recipe for a pretrained model"


def no_recipe_rate(model: str, optimizer: str) -> str:
    """Why a run of ``optimizer`` on ``model`` cannot take its learning rate from the recipe (none was measured)."""
    shown = model if model in RECIPES else "a pretrained model (a folder or hub id)"
    return (f"{field_label('learning_rate')}: {optimizer} needs one of its own, and the recipe for {shown} has "
            f"none for it (its {recipe_for(model).learning_rate:g} is AdamW's); set one.")


def default_dataset(model: str | None) -> str:
    """The built-in data a built-in model trains on: its task's (builtin-text for a causal LM, builtin-sentiment for
    a classifier, and for a model not built in)."""
    return TASK_DATASETS[BUILTIN_MODEL_TASKS.get((model or "").strip(), CLASSIFICATION)]


def is_pretrained(model: str | None) -> bool:
    """Every model but the ones made here (tiny-bert, tiny-gpt, the bag-of-embeddings) starts from trained weights."""
    return (model or "").strip() not in FROM_SCRATCH_MODELS
