"""How the bench's report writes numbers: thousands separators, ratios, p50/p99/max
cells, and a missing value as "–"."""

from __future__ import annotations

import math

MiB = 1024 * 1024


def num(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def pcells(v: dict[str, float], digits: int = 1) -> str:
    """p50 | p99 | max cells."""
    return " | ".join(num(v[k], digits) for k in ("p50", "p99", "max"))


def times(value: float, base: float) -> str:
    if not base or math.isnan(base) or math.isnan(value):
        return "–"
    return f"{value / base:.2f}×"


def within(value: float | None, bound: float) -> bool:
    """value ≤ bound, and a value that is missing or nan is not."""
    return value is not None and not math.isnan(value) and value <= bound
