"""Where this process stands in a data-parallel launch (accelerate launch / torchrun set these)."""

from __future__ import annotations

import os


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0
