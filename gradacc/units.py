"""Bytes as people read them (kB, MB, GB: powers of 1000, as the budgets are given)."""

from __future__ import annotations

import math

MB = 1_000_000


def format_bytes(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{value:,.0f} B"
