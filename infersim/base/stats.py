"""Small statistics shared by reports that must not pull in numpy (serving metrics, plots, table comparison)."""

from __future__ import annotations

import math


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100; numpy's default method) of already sorted
    values; 0.0 for none."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
