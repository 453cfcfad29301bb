"""Did a run go well? One-line warnings from its events, for ``run_ended`` (no torch, no Streamlit).

A green "Completed" under a collapsed model is worse than no status at all: these checks read only the
event list and the config, so the engine, the store and a test all reach the same verdict.
"""

from __future__ import annotations

import statistics

from gradacc import events as ev
from gradacc.config import RunConfig, is_pretrained

# A step whose loss is this many times the median of the steps before it is a spike...
SPIKE_FACTOR = 3.0
# ...measured against this many earlier steps, once there are at least SPIKE_MIN_HISTORY of them...
SPIKE_WINDOW = 20
SPIKE_MIN_HISTORY = 5
# ...and only when it also climbs back to at least this share of the starting loss: from-scratch models
# reach losses near 0, where a step at 3× the median is noise, not divergence.
SPIKE_MIN_SHARE_OF_START = 0.5
# Steps averaged at each end of the run to tell whether the loss went down.
ENDS = 5
# F1 within this of always predicting the majority class counts as "no better".
F1_MARGIN = 0.01
# A learning rate this many times the model's recipe is named as the likely cause.
HIGH_LR_FACTOR = 3.0


def run_warnings(run_events: list[dict], config: RunConfig | dict) -> list[str]:
    """One sentence per sign of a bad run, most telling first; [] when all is well."""
    config = RunConfig.from_dict(config) if isinstance(config, dict) else config
    losses = [e["loss"] for e in run_events if e.get("event") == ev.STEP and e.get("loss") is not None]
    evals = [e for e in run_events if e.get("event") == ev.EVAL]
    found = [w for w in (_no_better_than_majority(evals), _loss_went_up(losses), _spike(losses)) if w]
    cause = likely_cause(config) if found else None
    return found + ([cause] if cause else [])


def _no_better_than_majority(evals: list[dict]) -> str | None:
    last = evals[-1] if evals else {}
    f1, floor = last.get("eval_f1"), last.get("majority_f1")
    if f1 is None or floor is None or f1 > floor + F1_MARGIN:
        return None
    return (f"eval F1 {f1:.3f} is no better than always predicting the most frequent label ({floor:.3f}): "
            "the model learnt nothing it can use.")


def _loss_went_up(losses: list[float]) -> str | None:
    if len(losses) < 2:
        return None
    ends = max(1, min(ENDS, len(losses) // 4))
    start, end = statistics.fmean(losses[:ends]), statistics.fmean(losses[-ends:])
    if end <= start:
        return None
    return f"the loss ended higher than it started ({end:.3g} against {start:.3g})."


def _spike(losses: list[float]) -> str | None:
    if len(losses) <= SPIKE_MIN_HISTORY:
        return None
    start = statistics.fmean(losses[:max(1, min(ENDS, len(losses) // 4))])
    for index in range(SPIKE_MIN_HISTORY, len(losses)):
        median = statistics.median(losses[max(0, index - SPIKE_WINDOW):index])
        loss = losses[index]
        if median > 0 and loss > SPIKE_FACTOR * median and loss >= SPIKE_MIN_SHARE_OF_START * start:
            return (f"the loss spiked at step {index + 1}: {loss:.3g}, {loss / median:.1f}× the median "
                    f"of the steps before ({median:.3g}).")
    return None


def likely_cause(config: RunConfig) -> str | None:
    """The setting most likely to blame, said with the value the model's recipe uses."""
    recipe = config.recipe
    lr = config.learning_rate
    if lr is not None and lr >= HIGH_LR_FACTOR * recipe.learning_rate:
        kind = "a pretrained model" if is_pretrained(config.model) else config.model
        return f"Likely cause: learning rate {lr:g} is high for {kind}; its recipe uses {recipe.learning_rate:g}."
    if config.trainer_library_default and config.backend == "trainer" and config.grad_accum_steps > 1:
        return (f"Likely cause: Trainer's library default on this model scales the loss and gradients "
                f"{config.grad_accum_steps}× too large; gradacc's compute_loss_func fixes it.")
    return None
