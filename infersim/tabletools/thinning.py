"""Thinning a converted kernel table where interpolation loses nothing: a measured point is left out
only where the lookup, interpolating the points kept, reproduces its time within a tolerance.

A table's grids (infersim.tables.grid_keys) are thinned row by row along their innermost work axis: a
GEMM's m, a grouped GEMM's tokens per GPU (one row per EP size), a decode's kv_len (one row per
batch), a prefill's sequence length (or attended pairs). Outer axes are kept whole. The first point
of every row and its last two are always kept, so that nothing inside the measured range becomes
an edge or an extrapolation, and the row's top time, which the lookup extends above its range from
(at the slope of its last doubling, from its time at half the top's work, interpolated from the kept
points), is the measured one.

Within a row the lookup's rule is replicated exactly (infersim.tables.interpolation): time is linear
in the axis's work coordinate between the two points around the query, and where both segments
beside that interval exist it is also bounded by the convex envelope (the larger of their
extensions, when below the straight line, never below the lower endpoint). Points are chosen
greedily, farthest reach first on straight lines, then every point left out is checked with the
envelope against the kept ones and put back until each is reproduced within the tolerance.
Repeated measurements at one coordinate are averaged, as the lookup averages them.

aiconfigurator measures some kernels at m and m + 1 (vLLM's fp8 GEMM takes 168 us at m = 257 on an
H100 and 58 us at m = 256: a kernel chosen by size); such steps are kept by construction, where a
fixed thinning to powers of two (the first design) left them to interpolation and missed by 70%.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from infersim.tables.format import CollectiveRow, ElementwiseRow, Row
from infersim.tables.grid_keys import row_grid_key
from infersim.tables.interpolation import DEFAULT_INTERPOLATION

#: default: a point is left out only where interpolating the kept points reproduces it within 3%,
#: below the spread of repeated measurements of one kernel in aiconfigurator's tables
DEFAULT_TOLERANCE = 0.03
#: points of every row always kept at each end: the first, and the last two (the extension slope)
KEEP_FIRST, KEEP_LAST = 1, 2


@dataclass(frozen=True)
class ThinResult:
    rows: tuple[Row, ...]
    kept_points: int  # distinct coordinates kept, over all rows of the table
    total_points: int
    worst_error: float  # largest relative error of a point left out, as the kept points predict it


def _row_values(coords: Sequence[float], values: Sequence[float], kept: Sequence[int], x_index: int) -> float:
    """The lookup's 1-D value at coordinate index `x_index` from the kept indices (ascending;
    x_index lies strictly inside their range and is not one of them)."""
    hi_pos = next(p for p, k in enumerate(kept) if k > x_index)
    lo, hi = kept[hi_pos - 1], kept[hi_pos]
    x = coords[x_index]
    v0, v1 = values[lo], values[hi]
    t = (x - coords[lo]) / (coords[hi] - coords[lo])
    value = (1.0 - t) * v0 + t * v1
    if not DEFAULT_INTERPOLATION.convex_envelope or hi_pos - 2 < 0 or hi_pos + 1 >= len(kept):
        return value
    before, after = kept[hi_pos - 2], kept[hi_pos + 1]
    left = v0 + (v0 - values[before]) / (coords[lo] - coords[before]) * (x - coords[lo])
    right = v1 + (v1 - values[after]) / (coords[hi] - coords[after]) * (x - coords[hi])
    return min(value, max(min(v0, v1), left, right))


def _error(measured: float, predicted: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else 0.0


def thin_row(coords: Sequence[float], values: Sequence[float], tolerance: float) -> tuple[list[int], float]:
    """(indices kept, worst relative error of the points left out) for one row: ascending work
    coordinates and the times measured there."""
    n = len(coords)
    if n <= KEEP_FIRST + KEEP_LAST:
        return list(range(n)), 0.0
    forced = set(range(KEEP_FIRST)) | set(range(n - KEEP_LAST, n))
    last_free = n - KEEP_LAST  # a straight line may reach the first of the last points, not skip it
    kept = [0]
    anchor = 0
    while anchor < last_free:
        reach = anchor + 1
        for candidate in range(anchor + 2, last_free + 1):
            line = [anchor, candidate]
            if not all(_error(values[j], _row_values(coords, values, line, j)) <= tolerance
                       for j in range(anchor + 1, candidate)):
                break
            reach = candidate
        kept.append(reach)
        anchor = reach
    kept = sorted(set(kept) | forced)
    while True:  # the envelope may lower a prediction below the straight line: put such points back
        worst, worst_index = 0.0, -1
        kept_set = set(kept)
        for j in range(n):
            if j not in kept_set:
                error = _error(values[j], _row_values(coords, values, kept, j))
                if error > worst:
                    worst, worst_index = error, j
        if worst <= tolerance:
            return kept, worst
        kept = sorted(kept_set | {worst_index})


def thin_rows(rows: Sequence[Row], tolerance: float = DEFAULT_TOLERANCE) -> ThinResult:
    """The rows of one table, thinned along each grid row's innermost axis (see the module doc).
    Collective and elementwise rows (series by message size) are returned whole."""
    if not rows or isinstance(rows[0], (CollectiveRow, ElementwiseRow)):
        return ThinResult(tuple(rows), len(rows), len(rows), 0.0)
    series: dict[tuple, dict[float, list[Row]]] = defaultdict(lambda: defaultdict(list))
    axis_of: dict[tuple, str] = {}
    for row in rows:
        key, coords, axes = row_grid_key(row)
        series[(key, coords[:-1])][coords[-1]].append(row)
        axis_of[(key, coords[:-1])] = axes[-1]
    kept_rows: list[Row] = []
    kept_points = total = 0
    worst = 0.0
    for line, by_value in series.items():
        values = sorted(by_value)
        coords = [DEFAULT_INTERPOLATION.coordinate(axis_of[line], v) for v in values]
        times = [sum(r.latency_us for r in by_value[v]) / len(by_value[v]) for v in values]
        kept, error = thin_row(coords, times, tolerance)
        worst = max(worst, error)
        kept_points += len(kept)
        total += len(values)
        for index in kept:
            kept_rows.extend(by_value[values[index]])
    order = {id(row): i for i, row in enumerate(rows)}
    kept_rows.sort(key=lambda r: order[id(r)])
    return ThinResult(tuple(kept_rows), kept_points, total, worst)
