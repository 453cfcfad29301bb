"""Numbers read from environment variables, each bad value refused with one sentence naming the variable.

Shared vocabulary, so every layer reads its variables alike: the deployment's limits (``serving.limits``,
which the run manager reads too), the app's torch threads (``serving.warmup``) and the demos' scale
(``analysis.demos``).
"""

from __future__ import annotations

import math
from typing import Mapping

from gradacc.errors import GradaccError

# The deployment's cap on one run's memory, in MB: read by serving.limits, named in training.budget's refusal,
# and handed to a launch's ranks (training.launch), which read it back through their CLI.
MAX_RUN_MEMORY_MB = "GRADACC_MAX_RUN_MEMORY_MB"


def whole_number(env: Mapping[str, str], name: str) -> int | None:
    """A whole number of at least 1; None when the variable is unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise GradaccError(f"{name} must be a whole number of at least 1; got {raw!r}.")
    return value


def number(env: Mapping[str, str], name: str, default: float, allow_zero: bool = False) -> float:
    """A finite number greater than 0 (or 0 too, with ``allow_zero``); ``default`` when unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value >= 0 if allow_zero else value > 0) or math.isinf(value):
        bound = "0 or more" if allow_zero else "greater than 0"
        raise GradaccError(f"{name} must be a number {bound}; got {raw!r}.")
    return value
