"""Interpolation within one kernel grid: measured times over named size axes, read between and
beyond their points.

Within a grid the kernel time is interpolated multilinearly in "work" coordinates, each
proportional to what the axis adds to the kernel's work: m, tokens, batch and kv_len as they
are, a prefill's seq_len as s(s+1)/2 (causal query-key pairs), and ep as 1/ep (local experts, so
weight bytes). Between grid points time is then affine in the work, the shape of a kernel with a
fixed cost plus a cost per unit of work, except across a knee: where the segments on both sides
of the interval, extended into it, both lie below the straight line (the data are convex there,
e.g. a GEMM flat in m up to a tile or wave boundary and linear after it), the time is the larger
of the two extensions (the convex envelope; never below the interval's lower endpoint). The
leave-one-out benchmark (benchmarks/mfu_leave_one_out.py) chose this over plain multilinear time
(`TIME_IN_WORK`) and over interpolating log(efficiency) in log2 of the axes (the first design,
`LOG_EFFICIENCY`): see mfu_tables/FORMAT.md.
The efficiency reported is FLOPs / (time * peak).

Grids may be ragged (rows of different extents, as published tables are): interpolation is
nested, one axis at a time, each row over its own range. A coordinate outside its row's range is
clamped there: the result is the roofline at the table's edge efficiency (the efficiency at the
clamped point), marked "edge" with a note; except above the last point of a work axis (m, tokens
per GPU, batch, kv_len, seq_len, attended_pairs) of a time table, where the time is extended at the cost
per unit of work of the row's last doubling (never at a falling efficiency), marked "extrapolated"
(`_extend_above`; when that slope stands is infersim.tables.beyond_range's rule). An axis with a work
limit (a sliding window's kv_len) is extended only up to it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from itertools import repeat
from dataclasses import dataclass
from typing import NamedTuple
from collections.abc import Callable

from infersim.base.records import cheap_init

_RELATIVE_TOLERANCE = 1e-9  # coordinates this close (relatively) are the same grid point


# ---------------------------------------------------------------------------------------------
# Interpolation schemes


@dataclass(frozen=True)
class Interpolation:
    """How a grid interpolates: the coordinate of each axis, and the value combined linearly."""

    name: str
    coordinate: Callable[[str, float], float]  # (axis name, axis value) -> interpolation coordinate
    interpolates_time: bool  # True: kernel time; False: log(efficiency)
    convex_envelope: bool = False  # between two points, never above the secants of the segments beside them


def _work_coordinate(axis: str, value: float) -> float:
    if axis == "seq_len":
        return value * (value + 1.0) / 2.0  # causal query-key pairs of one sequence
    if axis == "ep":
        return 1.0 / value  # local experts per GPU, hence expert weight bytes, scale as 1/ep
    return value


TIME_IN_WORK = Interpolation("time-in-work", _work_coordinate, True)
TIME_IN_WORK_ENVELOPE = Interpolation("time-in-work-convex-envelope", _work_coordinate, True, convex_envelope=True)
LOG_EFFICIENCY = Interpolation("log-efficiency-in-log-axes", lambda axis, value: math.log2(value), False)
INTERPOLATIONS = {"time": TIME_IN_WORK, "envelope": TIME_IN_WORK_ENVELOPE, "log-efficiency": LOG_EFFICIENCY}
DEFAULT_INTERPOLATION = TIME_IN_WORK_ENVELOPE


# ---------------------------------------------------------------------------------------------
# Ragged multilinear grid


@cheap_init
@dataclass(frozen=True, slots=True)
class Clamp:
    """A requested coordinate outside the range of the table row it fell in."""

    axis: str
    requested: float
    low: float
    high: float
    extrapolated: bool = False  # above the range of a work axis: extended at the last doubling's slope

    def describe(self) -> str:
        side = "below" if self.requested < self.low else "above"
        return f"{self.axis}={self.requested:g} {side} the table's range {self.low:g}..{self.high:g}"


Leaf = tuple[float, float]  # (interpolated value, efficiency)


@dataclass(frozen=True)
class GridNode:
    """One axis level: ascending interpolation coordinates and, per coordinate, a sub-grid or a leaf."""

    coords: tuple[float, ...]
    values: tuple[float, ...]  # the axis values as given, same order (for messages)
    children: tuple[GridNode | Leaf, ...]


@cheap_init
@dataclass(frozen=True, slots=True)
class GridValue:
    """Interpolation result: time at the table's peak (in range) and efficiency (edge: at the clamp)."""

    seconds: float
    efficiency: float
    exact: bool
    clamps: tuple[Clamp, ...]


@dataclass(frozen=True)
class KernelGrid:
    """Measured kernel times over named size axes; see the module docstring."""

    axes: tuple[str, ...]
    root: GridNode
    interpolation: Interpolation
    flops_per_second: float  # the peak the efficiencies are relative to
    # per axis, the value above which the kernel's work stops growing along it (a sliding window's
    # kv_len: keys beyond the window are not attended), or None: above a row's range the time is
    # extended only up to it (see _extend_above)
    work_limits: tuple[float | None, ...] = ()
    best_efficiency: float = 0.0  # the highest efficiency of any of its points (beyond_range's anchor)

    def evaluate(self, query: Sequence[float], query_flops: float) -> GridValue:
        """Time and efficiency of the kernel at `query` (axis values) doing `query_flops`."""
        coords = tuple(map(self.interpolation.coordinate, self.axes, query))
        limits, rows = _grid_constants(self)
        (value, eff), exact, clamps = _evaluate(self.root, 0, _Query(
            coords, tuple(query), self.axes, self.interpolation.convex_envelope,
            self.interpolation.interpolates_time, limits, rows))
        if self.interpolation.interpolates_time:
            seconds = value
            if clamps and not all(c.extrapolated for c in clamps):
                seconds = query_flops / (self.flops_per_second * eff)
            else:
                if clamps:  # extended above the range: never faster than the peak
                    seconds = max(seconds, query_flops / self.flops_per_second)
                eff = query_flops / (self.flops_per_second * seconds)
        else:
            eff = math.exp(value)
            seconds = query_flops / (self.flops_per_second * eff)
        return GridValue(seconds, eff, exact, clamps)

    def __getstate__(self) -> dict[str, object]:
        """The grid's fields without the evaluations kept on it (see _grid_constants)."""
        state = dict(self.__dict__)
        state.pop(_KEPT, None)
        return state


# What a grid's evaluations share, kept on the grid itself (in its __dict__, beside its fields, from
# its first evaluation; never pickled): the work limits in coordinates, and the values of its
# sub-grids (rows) at the inner axes' query values. A sweep asks a grid for many points that share
# their inner coordinates (every batch size at one context length): each interpolation along the
# outer axis reads up to four rows at them (the bracketing two and, for the convex envelope, their
# neighbours), so a row evaluated once answers every later query between the same rows. The rows
# are keyed by the identity of a node of the grid, which the grid holds.
_RowValues = dict[tuple[int, tuple[float, ...]], tuple[Leaf, bool, tuple[Clamp, ...]]]
_KEPT = "_evaluations_kept"
_ROWS_KEPT = 20_000  # row values per grid (three small tuples each); at the bound they are dropped


def _grid_constants(grid: KernelGrid) -> tuple[tuple[float, ...], _RowValues]:
    """(per axis, the coordinate its work stops growing at (inf: never); the grid's row values)."""
    kept = grid.__dict__.get(_KEPT)
    if kept is None:
        limits = tuple(math.inf if limit is None else grid.interpolation.coordinate(a, limit)
                       for a, limit in zip(grid.axes, grid.work_limits or (None,) * len(grid.axes)))
        kept = grid.__dict__[_KEPT] = (limits, {})  # a frozen dataclass: its fields are not in __dict__
    if len(kept[1]) >= _ROWS_KEPT:
        kept[1].clear()
    return kept


def build_grid(axes: Sequence[str], points: Iterable[tuple[Sequence[float], float, float]],
               flops_per_second: float, interpolation: Interpolation = DEFAULT_INTERPOLATION,
               work_limits: Sequence[float | None] = ()) -> KernelGrid:
    """A ragged grid from (axis values, seconds, efficiency) points; repeated points are averaged.
    `work_limits`: per axis, the value above which the work stops growing (None: it does not stop)."""
    axes = tuple(axes)
    listed = []
    best = 0.0
    dimensions = len(axes)
    interpolates_time = interpolation.interpolates_time
    for coords, seconds, eff in points:
        coords = tuple(map(float, coords))
        if len(coords) != dimensions or min(coords) <= 0 or not seconds > 0 or not eff > 0:
            raise ValueError(f"grid point {coords}: needs {dimensions} positive axis values, a positive time "
                             f"and efficiency")
        listed.append((coords, (seconds if interpolates_time else math.log(eff), eff)))
        if eff > best:
            best = eff
    limits = tuple(work_limits) if any(limit is not None for limit in work_limits) else ()
    if limits and len(limits) != len(axes):
        raise ValueError(f"work limits {limits}: needs one per axis {tuple(axes)}")
    return KernelGrid(axes, _build_level(listed, axes, 0, interpolation.coordinate), interpolation,
                      flops_per_second, limits, best)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _RELATIVE_TOLERANCE * max(abs(a), abs(b))


_Point = tuple[tuple[float, ...], Leaf]  # (axis values, leaf)
# a level's points grouped by coordinate: (the keys ascending, key -> its points in the order
# given, key -> the axis value of its first point)
_Groups = tuple[list[float], dict[float, list[_Point]], dict[float, float]]


def _build_level(points: list[_Point], axes: tuple[str, ...], depth: int,
                 coordinate: Callable[[str, float], float]) -> GridNode:
    """The level of axis `depth`: its points grouped by coordinate, each group the next level (or,
    at the last axis, the mean of its points)."""
    axis = axes[depth]
    values = [coords[depth] for coords, _ in points]
    grouped = _group_exact(points, values, list(map(coordinate, repeat(axis), values)))
    ascending, groups, raw = grouped or _group_within_tolerance(points, values, axis, coordinate)
    children: list[GridNode | Leaf] = []
    inner = depth + 1 < len(axes)
    for key in ascending:
        members = groups[key]
        n = len(members)
        if inner:
            children.append(_build_level(members, axes, depth + 1, coordinate))
        elif n == 1:
            children.append(members[0][1])  # its own (value, efficiency): positive or a log, never -0.0
        else:
            children.append((sum(m[1][0] for m in members) / n, sum(m[1][1] for m in members) / n))
    return GridNode(tuple(ascending), tuple(raw[k] for k in ascending), tuple(children))


def _group_exact(points: list[_Point], values: list[float], coords: list[float]) -> _Groups | None:
    """The points grouped by equal coordinate, where no two of the distinct coordinates lie within
    tolerance of each other, or None. Then grouping within tolerance gives the same groups (a point
    joins a key only if one is within tolerance of it) and no scan is needed: checking neighbours in
    ascending order suffices, since of a < b < c, a and c are further apart, relatively, than either
    pair of neighbours."""
    groups: dict[float, list[_Point]] = {}
    raw: dict[float, float] = {}
    for point, value, c in zip(points, values, coords):
        members = groups.get(c)
        if members is None:
            groups[c] = [point]
            raw[c] = value
        else:
            members.append(point)
    ascending = sorted(groups)
    if not all(map(math.isfinite, ascending)):  # NaN does not sort; inf is within tolerance of any key
        return None
    # _same(low, high) for low < high, inline: abs(low - high) is high - low, max(abs(low), abs(high))
    # is max(-low, high)
    if any(high - low <= _RELATIVE_TOLERANCE * max(-low, high) for low, high in zip(ascending, ascending[1:])):
        return None
    return ascending, groups, raw


def _key_within_tolerance(ascending: list[float], made: dict[float, int], c: float) -> float | None:
    """The earliest-made of the keys within tolerance of `c`, or None. Those keys are a run around
    c's place in the ascending keys (the tolerance is relative and far below 1, so moving away from c
    the distance grows faster than the tolerance), found by bisection instead of a scan of all keys."""
    place = bisect.bisect_left(ascending, c)
    low = high = place
    while low > 0 and _same(ascending[low - 1], c):
        low -= 1
    while high < len(ascending) and _same(ascending[high], c):
        high += 1
    return min(ascending[low:high], key=made.__getitem__, default=None)


def _group_within_tolerance(points: list[_Point], values: list[float], axis: str,
                            coordinate: Callable[[str, float], float]) -> _Groups:
    """A point joins the earliest-made key within tolerance of its coordinate, or makes a new key."""
    groups: dict[float, list[_Point]] = {}
    raw: dict[float, float] = {}
    made: dict[float, int] = {}  # key -> the order it was made in
    ascending: list[float] = []  # the keys
    for point, value in zip(points, values):
        c = coordinate(axis, value)
        # an exact key is the only key within tolerance of c (a key is made only where no earlier
        # key is, and later points within tolerance join it)
        key = c if c in groups else _key_within_tolerance(ascending, made, c)
        if key is None:
            key = c
            made[c] = len(made)
            bisect.insort(ascending, c)
        groups.setdefault(key, []).append(point)
        raw.setdefault(key, value)
    return ascending, groups, raw


class _Query(NamedTuple):
    """One evaluation's query, the same at every level of the grid (a level reads its axis, `depth`)."""

    coords: tuple[float, ...]  # interpolation coordinates, one per axis
    raw: tuple[float, ...]  # the axis values as asked (for messages)
    names: tuple[str, ...]
    envelope: bool
    extend: bool
    limits: tuple[float, ...]  # per axis, the coordinate the work stops growing at (inf: never)
    rows: _RowValues  # the grid's sub-grids evaluated so far, by (node id, inner query values): see _grid_constants


def _evaluate(node: GridNode, depth: int, q: _Query) -> tuple[Leaf, bool, tuple[Clamp, ...]]:
    x = q.coords[depth]
    grid = node.coords
    clamps: tuple[Clamp, ...] = ()
    if x > grid[-1] and not _same(x, grid[-1]) and q.extend and q.names[depth] in EXTENDED_AXES and len(grid) >= 2:
        extended = _extend_above(node, depth, q, x)
        if extended is not None:
            return extended
    if (x < grid[0] and not _same(x, grid[0])) or (x > grid[-1] and not _same(x, grid[-1])):
        clamps = (Clamp(q.names[depth], q.raw[depth], min(node.values), max(node.values)),)
        x = min(max(x, grid[0]), grid[-1])
    i = bisect.bisect_left(grid, x)
    for j in (i - 1, i):
        if 0 <= j < len(grid) and _same(grid[j], x):
            leaf, exact, inner = _child(node.children[j], depth, q)
            return leaf, exact and not clamps, clamps + inner
    lo, hi = i - 1, i
    t = (x - grid[lo]) / (grid[hi] - grid[lo])
    (v0, e0), _, c0 = _child(node.children[lo], depth, q)
    (v1, e1), _, c1 = _child(node.children[hi], depth, q)
    value = (1.0 - t) * v0 + t * v1
    if q.envelope and not (c0 or c1):
        # A kernel's time along a work axis is convex between tile steps (flat while bound by
        # fixed costs or weight bytes, then growing with the work), so the straight line across a
        # knee overestimates and the secants of the segments beside it, extended, bound it from
        # below: take their larger, never above the straight line nor below the lower endpoint.
        # Where the data are locally concave the straight line is already the smaller.
        secants = [min(v0, v1)]
        for a, b, vb in ((lo - 1, lo, v0), (hi + 1, hi, v1)):
            if 0 <= a < len(grid):
                (va, _), _, ca = _child(node.children[a], depth, q)
                if not ca:
                    secants.append(_secant(grid[a], va, grid[b], vb, x))
        if len(secants) == 3:
            value = min(value, max(secants))
    return (value, (1.0 - t) * e0 + t * e1), False, clamps + c0 + c1


# Work axes a time table may be extended above (ep is not work: fewer GPUs is another layout).
EXTENDED_AXES = frozenset({"m", "tokens_per_gpu", "batch", "kv_len", "seq_len", "attended_pairs"})
#: what a lookup's note says of a time extended above its row (infersim.tables.beyond_range takes it out
#: where it replaces that rule)
EXTENDED_NOTE = "; extended at its last doubling's time per unit of work"


def _extend_above(node: GridNode, depth: int, q: _Query, x: float) -> tuple[Leaf, bool, tuple[Clamp, ...]] | None:
    """Time above a row's last point: the cost per unit of work of the row's last doubling carried on
    (t = t_top + slope (x - x_top), slope from the time at x_top / 2, interpolated, to t_top; from the
    row's first point where it starts above x_top / 2), the shape of a kernel with a fixed cost plus a
    cost per unit of work; the slope is capped at t_top / x_top, so efficiency never falls above the
    range, and is never negative. Holding the edge efficiency instead (time proportional to work)
    charges the fixed cost again for every multiple of the range.

    The span is a doubling, not the last interval, because a kernel's time grows in steps (one
    more wave of output tiles, another tile shape chosen) and carries run-to-run noise: between two
    close points (aiconfigurator measures m = 1536 and 2048, tokens 1536 and 2048) the slope can be
    nearly flat or twice the kernel's mean cost per unit of work, and carried on it misprices every
    multiple of the range (TensorRT-LLM's fp8 MoE of Qwen3-235B at EP8 on an H200: 743 us at 1,536
    tokens, 774 us at 2,048, 0.06 us per token where the row's last doubling costs 0.27). Predicting
    each row's next two points from the points below it (from 512 up), over the full aiconfigurator
    grids of TensorRT-LLM on H200 and B200 and vLLM on H100, the last doubling's slope errs by a
    median 4.5% (p90 22.5%), the last interval's by 6.5% (p90 27.3%) and constant efficiency by 9.2%
    (p90 69%) (benchmarks/mfu_extrapolation.py). None when the top points are themselves clamped on
    an inner axis (the caller then clamps).

    An axis with a work limit (`limits`, in coordinates: a sliding window's kv_len) is extended only
    up to it and held flat above: keys beyond the window add no work, and a row that ends inside
    the window (large batches are measured over short contexts only) would otherwise carry the
    window's growth on over the whole context."""
    grid = node.coords
    (v_top, e_top), _, c_top = _child(node.children[-1], depth, q)  # q.extend: the rows below extend too
    x_top = grid[-1]
    x_prev = max(grid[0], min(grid[-2], x_top / 2.0))  # the last doubling of the work, or the whole row
    coords = q.coords[:depth] + (x_prev,) + q.coords[depth + 1:]
    (v_prev, _), _, c_prev = _evaluate(node, depth, q._replace(coords=coords))
    if any(not c.extrapolated for c in c_top + c_prev) or not v_top > 0:
        return None
    slope = min(v_top / x_top, max(0.0, (v_top - v_prev) / (x_top - x_prev)))
    clamp = Clamp(q.names[depth], q.raw[depth], min(node.values), max(node.values), extrapolated=True)
    reach = min(x, max(x_top, q.limits[depth])) if q.limits else x
    return (v_top + slope * (reach - x_top), e_top), False, (clamp,) + c_top


def _secant(xa: float, va: float, xb: float, vb: float, x: float) -> float:
    return vb + (vb - va) / (xb - xa) * (x - xb)


def _child(child: GridNode | Leaf, depth: int, q: _Query) -> tuple[Leaf, bool, tuple[Clamp, ...]]:
    """The value of a node's child at the query: the next axis's level, or a leaf. A level reads
    the query's values of its own axis and the axes inside it only (the rest of the query is the
    grid's), so its value is kept by those (see _grid_constants)."""
    if isinstance(child, GridNode):
        key = (id(child), q.raw[depth + 1:])
        value = q.rows.get(key)
        if value is None:
            value = q.rows[key] = _evaluate(child, depth + 1, q)
        return value
    return child, True, ()
