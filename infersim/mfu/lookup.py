"""Kernel time from measured tables: the `KernelTables` the simulator core asks.

Each table is indexed once at load into grids keyed by the kernel's categorical parameters (GEMM K
and N, head layout, expert configuration, dtypes); only an exact match of those counts:

  GEMM                 key (dtype, k, n)                                        axes (m)
  grouped GEMM         key (dtype, stage, projection, experts, topk, hidden,
                            intermediate, gated)                                axes (ep, tokens per GPU)
  attention decode     key (kind, dtype, kv_dtype, heads, kv heads, qk dim,
                            v dim, q_len, window)                               axes (batch, kv_len)
  attention prefill    key (kind, dtype, kv_dtype, heads, kv heads, qk dim,
                            v dim, causal, window)                              axes (seq_len), batch 1;
                                                                                windowed: (attended_pairs)

The window (0: full attention) is part of the key: a sliding-window shape is answered only by rows
of the same window, a full-attention shape never by windowed rows. A windowed row's kv_len is the
whole context, as for full attention (each query attends to the last `window` of it); a windowed
decode grid's kv_len has a work limit at the window: above a row's range the time is extended only
up to the window and held flat beyond (the keys outside it are not attended). A windowed prefill
is interpolated over the query-key pairs each head computes, linear in the sequence beyond the
window (a full prefill's s(s+1)/2).

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
per GPU, batch, kv_len, seq_len, attended_pairs) of a time table, where the time is extended at the last
interval's cost per unit of work (never at a falling efficiency), marked "extrapolated"
(`_extend_above`). Prefill for batch > 1 runs
`batch` sequences: `batch` times the one-sequence time. Shapes no table covers (another K/N,
layout, dtype or window, chunked prefill, decode with several query tokens unless
measured so, fused memory-bound kernels) get None.

Elementwise kernels (one eager PyTorch kernel each, `MemoryBoundShape.op`): by (op, dtype), piecewise
linear in the bytes the op moves; below the smallest measured size the smallest size's time (a
kernel is not faster than its launch-bound floor), above the largest extended at the last interval's
time per byte (marked extrapolated).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Literal, Sequence, Union

from infersim.errors import ConfigError, InferSimError
from infersim.cards.registry import display_path
from infersim.kernels import (
    AttentionShape,
    CollectiveShape,
    GemmShape,
    GroupedGemmShape,
    KernelShape,
    MemoryBoundShape,
    TableHit,
    minimum_bytes,
)
from infersim.mfu.format import (
    PROVENANCE_FILE,
    AttentionRow,
    CollectiveRow,
    ElementwiseRow,
    GemmRow,
    GroupedGemmRow,
    Row,
    TableDirectory,
    efficiency_of,
    read_table_dir,
    table_directories,
)

_RELATIVE_TOLERANCE = 1e-9  # coordinates this close (relatively) are the same grid point
_CACHE_LIMIT = 200_000
#: share of the K x N product a GEMM table must measure to interpolate between (K, N) (see _gemm_planes)
PLANE_COVERAGE = 0.9

GridKey = tuple[Hashable, ...]


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


@dataclass(frozen=True)
class Clamp:
    """A requested coordinate outside the range of the table row it fell in."""

    axis: str
    requested: float
    low: float
    high: float
    extrapolated: bool = False  # above the range of a work axis: extended at the last interval's slope

    def describe(self) -> str:
        side = "below" if self.requested < self.low else "above"
        return f"{self.axis}={self.requested:g} {side} the table's range {self.low:g}..{self.high:g}"


Leaf = tuple[float, float]  # (interpolated value, efficiency)


@dataclass(frozen=True)
class GridNode:
    """One axis level: ascending interpolation coordinates and, per coordinate, a sub-grid or a leaf."""

    coords: tuple[float, ...]
    values: tuple[float, ...]  # the axis values as given, same order (for messages)
    children: tuple[Union["GridNode", Leaf], ...]


@dataclass(frozen=True)
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
        coords = tuple(self.interpolation.coordinate(a, q) for a, q in zip(self.axes, query))
        limits = tuple(math.inf if limit is None else self.interpolation.coordinate(a, limit)
                       for a, limit in zip(self.axes, self.work_limits or (None,) * len(self.axes)))
        (value, eff), exact, clamps = _evaluate(self.root, coords, tuple(query), self.axes,
                                                self.interpolation.convex_envelope,
                                                self.interpolation.interpolates_time, limits)
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


def build_grid(axes: Sequence[str], points: Iterable[tuple[Sequence[float], float, float]],
               flops_per_second: float, interpolation: Interpolation = DEFAULT_INTERPOLATION,
               work_limits: Sequence[float | None] = ()) -> KernelGrid:
    """A ragged grid from (axis values, seconds, efficiency) points; repeated points are averaged.
    `work_limits`: per axis, the value above which the work stops growing (None: it does not stop)."""
    listed = []
    for coords, seconds, eff in points:
        coords = tuple(float(x) for x in coords)
        if len(coords) != len(axes) or min(coords) <= 0 or not seconds > 0 or not eff > 0:
            raise ValueError(f"grid point {coords}: needs {len(axes)} positive axis values, a positive time "
                             f"and efficiency")
        value = seconds if interpolation.interpolates_time else math.log(eff)
        listed.append((coords, (value, eff)))
    limits = tuple(work_limits) if any(limit is not None for limit in work_limits) else ()
    if limits and len(limits) != len(axes):
        raise ValueError(f"work limits {limits}: needs one per axis {tuple(axes)}")
    return KernelGrid(tuple(axes), _build_level(listed, tuple(axes), interpolation), interpolation, flops_per_second,
                      limits, max((leaf[1] for _, leaf in listed), default=0.0))


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _RELATIVE_TOLERANCE * max(abs(a), abs(b))


def _build_level(points: list[tuple[tuple[float, ...], Leaf]], axes: tuple[str, ...],
                 interpolation: Interpolation) -> GridNode:
    groups: dict[float, list[tuple[tuple[float, ...], Leaf]]] = {}
    raw: dict[float, float] = {}
    for coords, leaf in points:
        c = interpolation.coordinate(axes[0], coords[0])
        key = next((k for k in groups if _same(k, c)), c)
        groups.setdefault(key, []).append((coords[1:], leaf))
        raw.setdefault(key, coords[0])
    ordered = sorted(groups)
    children: list[GridNode | Leaf] = []
    for key in ordered:
        members = groups[key]
        if members[0][0]:
            children.append(_build_level(members, axes[1:], interpolation))
        else:
            n = len(members)
            children.append((sum(m[1][0] for m in members) / n, sum(m[1][1] for m in members) / n))
    return GridNode(tuple(ordered), tuple(raw[k] for k in ordered), tuple(children))


def _evaluate(node: GridNode, coords: tuple[float, ...], raw: tuple[float, ...],
              names: tuple[str, ...], envelope: bool = False,
              extend: bool = False, limits: tuple[float, ...] = ()) -> tuple[Leaf, bool, tuple[Clamp, ...]]:
    x = coords[0]
    grid = node.coords
    clamps: tuple[Clamp, ...] = ()
    if x > grid[-1] and not _same(x, grid[-1]) and extend and names[0] in EXTENDED_AXES and len(grid) >= 2:
        extended = _extend_above(node, coords, raw, names, envelope, x, limits)
        if extended is not None:
            return extended
    if (x < grid[0] and not _same(x, grid[0])) or (x > grid[-1] and not _same(x, grid[-1])):
        clamps = (Clamp(names[0], raw[0], min(node.values), max(node.values)),)
        x = min(max(x, grid[0]), grid[-1])
    i = bisect.bisect_left(grid, x)
    for j in (i - 1, i):
        if 0 <= j < len(grid) and _same(grid[j], x):
            leaf, exact, inner = _child(node.children[j], coords, raw, names, envelope, extend, limits)
            return leaf, exact and not clamps, clamps + inner
    lo, hi = i - 1, i
    t = (x - grid[lo]) / (grid[hi] - grid[lo])
    (v0, e0), _, c0 = _child(node.children[lo], coords, raw, names, envelope, extend, limits)
    (v1, e1), _, c1 = _child(node.children[hi], coords, raw, names, envelope, extend, limits)
    value = (1.0 - t) * v0 + t * v1
    if envelope and not (c0 or c1):
        # A kernel's time along a work axis is convex between tile steps (flat while bound by
        # fixed costs or weight bytes, then growing with the work), so the straight line across a
        # knee overestimates and the secants of the segments beside it, extended, bound it from
        # below: take their larger, never above the straight line nor below the lower endpoint.
        # Where the data are locally concave the straight line is already the smaller.
        secants = [min(v0, v1)]
        for a, b, vb in ((lo - 1, lo, v0), (hi + 1, hi, v1)):
            if 0 <= a < len(grid):
                (va, _), _, ca = _child(node.children[a], coords, raw, names, envelope, extend, limits)
                if not ca:
                    secants.append(_secant(grid[a], va, grid[b], vb, x))
        if len(secants) == 3:
            value = min(value, max(secants))
    return (value, (1.0 - t) * e0 + t * e1), False, clamps + c0 + c1


# Work axes a time table may be extended above (ep is not work: fewer GPUs is another layout).
EXTENDED_AXES = frozenset({"m", "tokens_per_gpu", "batch", "kv_len", "seq_len", "attended_pairs"})


def _extend_above(node: GridNode, coords: tuple[float, ...], raw: tuple[float, ...], names: tuple[str, ...],
                  envelope: bool, x: float, limits: tuple[float, ...] = ()
                  ) -> tuple[Leaf, bool, tuple[Clamp, ...]] | None:
    """Time above a row's last point: the last interval's cost per unit of work carried on
    (t = t_top + slope (x - x_top)), the shape of a kernel with a fixed cost plus a cost per unit of
    work; the slope is capped at t_top / x_top, so efficiency never falls above the range, and is
    never negative. Holding the edge efficiency instead (time proportional to work) charges the
    fixed cost again for every multiple of the range: predicting each row's next two points from
    the two before it (from 512 up), this rule errs by a median 9.8% (p90 42%) over the bundled
    tables where constant efficiency errs by 34.7% (p90 208%), always on the slow side
    (benchmarks/mfu_extrapolation.py). None when the top points are themselves clamped on an
    inner axis (the caller then clamps).

    An axis with a work limit (`limits`, in coordinates: a sliding window's kv_len) is extended only
    up to it and held flat above: keys beyond the window add no work, and a row that ends inside
    the window (large batches are measured over short contexts only) would otherwise carry the
    window's growth on over the whole context."""
    grid = node.coords
    (v_top, e_top), _, c_top = _child(node.children[-1], coords, raw, names, envelope, True, limits)
    (v_prev, _), _, c_prev = _child(node.children[-2], coords, raw, names, envelope, True, limits)
    if any(not c.extrapolated for c in c_top + c_prev) or not v_top > 0:
        return None
    x_top, x_prev = grid[-1], grid[-2]
    slope = min(v_top / x_top, max(0.0, (v_top - v_prev) / (x_top - x_prev)))
    clamp = Clamp(names[0], raw[0], min(node.values), max(node.values), extrapolated=True)
    reach = min(x, max(x_top, limits[0])) if limits else x
    return (v_top + slope * (reach - x_top), e_top), False, (clamp,) + c_top


def _secant(xa: float, va: float, xb: float, vb: float, x: float) -> float:
    return vb + (vb - va) / (xb - xa) * (x - xb)


def _child(child: GridNode | Leaf, coords: tuple[float, ...], raw: tuple[float, ...],
           names: tuple[str, ...], envelope: bool = False, extend: bool = False,
           limits: tuple[float, ...] = ()) -> tuple[Leaf, bool, tuple[Clamp, ...]]:
    if isinstance(child, GridNode):
        return _evaluate(child, coords[1:], raw[1:], names[1:], envelope, extend, limits[1:])
    return child, True, ()


# ---------------------------------------------------------------------------------------------
# Families: how a row and a shape map to (grid key, axis values)


GEMM_AXES = ("m",)
GROUPED_AXES = ("ep", "tokens_per_gpu")
DECODE_AXES = ("batch", "kv_len")
PREFILL_AXES = ("seq_len",)
# A sliding-window prefill's work is linear in the sequence beyond the window, not quadratic: its
# axis is the query-key pairs each head computes (AttentionShape.attended_pairs), which for full
# attention would be s(s+1)/2, the seq_len coordinate
WINDOW_PREFILL_AXES = ("attended_pairs",)


def row_grid_key(row: Row) -> tuple[GridKey, tuple[float, ...], tuple[str, ...]]:
    """(grid key, axis values, axis names) of a table row."""
    if isinstance(row, GemmRow):
        return ("gemm", row.dtype, row.k, row.n), (float(row.m),), GEMM_AXES
    if isinstance(row, GroupedGemmRow):
        key = ("grouped_gemm", row.dtype, row.stored_weight_dtype, row.stage, row.projection, row.num_experts,
               row.topk, row.hidden, row.intermediate, row.gated)
        return key, (float(row.ep), float(row.tokens_per_gpu)), GROUPED_AXES
    if isinstance(row, AttentionRow):
        kv_heads = 1 if row.kind == "mla" else row.num_kv_heads
        layout = (row.kind, row.dtype, row.kv_dtype, row.num_heads, kv_heads, row.qk_head_dim, row.v_head_dim)
        # the window is part of the key: a windowed kernel skips the keys outside it, so only rows
        # of the same window answer a windowed shape, and full-attention shapes never by them
        if row.stage == "decode":
            key = ("attention", "decode") + layout + (row.q_len, row.window)
            return key, (float(row.batch), float(row.kv_len)), DECODE_AXES
        if row.batch != 1 or row.q_len != row.kv_len:
            raise ValueError("prefill attention rows must be one sequence (batch 1) with q_len == kv_len")
        key = ("attention", "prefill") + layout + (row.causal, row.window)
        if row.window:
            return key, (row.shape().attended_pairs,), WINDOW_PREFILL_AXES
        return key, (float(row.kv_len),), PREFILL_AXES
    raise TypeError(f"not a table row: {row!r}")


def shape_grid_key(shape: KernelShape) -> tuple[GridKey, tuple[float, ...], int] | None:
    """(grid key, axis values, repeats) a shape is looked up under, or None if no table kind
    covers it. `repeats` is how many grid-point kernels the shape is (prefill: one per sequence)."""
    if isinstance(shape, GemmShape):
        if shape.weight_dtype != shape.dtype or shape.m <= 0:
            return None
        return ("gemm", shape.dtype, shape.k, shape.n), (float(shape.m),), 1
    if isinstance(shape, GroupedGemmShape):
        if shape.tokens_per_gpu <= 0 or shape.ep <= 0:
            return None
        # weight-only quantised experts (weights narrower than the activations) have grids of their own
        key = ("grouped_gemm", shape.dtype, shape.weight_dtype, shape.stage, shape.projection, shape.num_experts,
               shape.topk, shape.hidden, shape.intermediate, shape.gated)
        return key, (float(shape.ep), float(shape.tokens_per_gpu)), 1
    if isinstance(shape, AttentionShape):
        if shape.window < 0 or shape.batch <= 0 or shape.kv_len <= 0:
            return None
        kv_heads = 1 if shape.kind == "mla" else shape.num_kv_heads
        layout = (shape.kind, shape.dtype, shape.kv_dtype, shape.num_heads, kv_heads, shape.qk_head_dim,
                  shape.v_head_dim)
        if shape.stage == "decode":
            key = ("attention", "decode") + layout + (shape.q_len, shape.window)
            return key, (float(shape.batch), float(shape.kv_len)), 1
        if shape.q_len != shape.kv_len:
            return None  # chunked prefill over a cached prefix: not what the prefill tables measured
        key = ("attention", "prefill") + layout + (shape.causal, shape.window)
        if shape.window:
            return key, (shape.attended_pairs,), shape.batch
        return key, (float(shape.kv_len),), shape.batch
    return None


def describe_key(key: GridKey) -> str:
    family = key[0]
    if family == "gemm":
        return f"{key[1]} k={key[2]} n={key[3]}"
    if family == "grouped_gemm":
        _, dtype, weights, stage, proj, experts, topk, hidden, inter, gated = key
        formats = dtype if weights == dtype else f"{dtype} x {weights} weights"
        return f"{formats} {stage} {proj} experts={experts} topk={topk} hidden={hidden} intermediate={inter}"
    _, stage, kind, dtype, kv_dtype, heads, kv_heads, qk, v, extra, window = key
    return f"{kind} {stage} {heads}-{kv_heads}-{qk}-{v} {dtype} kv {kv_dtype}" + (f" window {window}" if window else "")


def work_limits(key: GridKey, axes: tuple[str, ...]) -> tuple[float | None, ...]:
    """Per axis of a grid, the value above which the kernel's work stops growing, or None: a
    sliding-window decode's kv_len (the keys beyond the window are not attended). Above a row's
    range the time is extended only up to it (_extend_above). A windowed prefill needs none: its
    attended_pairs axis is the work itself."""
    if key[0] == "attention" and key[1] == "decode" and key[-1]:
        return tuple(float(key[-1]) if axis == "kv_len" else None for axis in axes)
    return (None,) * len(axes)


# ---------------------------------------------------------------------------------------------
# The table set


@dataclass(frozen=True)
class GridPoint:
    """One measured point of a grid: coordinates on its axes, time and efficiency."""

    coords: tuple[float, ...]  # axis values
    seconds: float  # measured kernel time
    efficiency: float  # relative to the table's peak for the row's dtype
    row: Row


@dataclass(frozen=True)
class GridSource:
    """The measured points of one grid key before indexing, with their axes and peak."""

    axes: tuple[str, ...]
    tables: tuple[str, ...]  # CSV file names the points come from
    peak_flops: float
    points: tuple[GridPoint, ...]
    work_limits: tuple[float | None, ...] = ()  # see work_limits()


def grid_points(table_dir: TableDirectory) -> dict[GridKey, GridSource]:
    """Every grid's measured points, by grid key."""
    prov = table_dir.provenance
    collected: dict[GridKey, tuple[tuple[str, ...], list[str], float, list[GridPoint]]] = {}
    for name, rows in table_dir.tables.items():
        for row in rows:
            if isinstance(row, (CollectiveRow, ElementwiseRow)):
                continue  # no FLOPs, no efficiency: indexed by MfuTables (collective_series, elementwise_series)
            key, coords, axes = row_grid_key(row)
            peak = prov.peak_flops[row.dtype]
            entry = collected.setdefault(key, (axes, [], peak, []))
            if name not in entry[1]:
                entry[1].append(name)
            entry[3].append(GridPoint(coords, row.latency_us * 1e-6, efficiency_of(row, peak), row))
    return {key: GridSource(axes, tuple(files), peak, tuple(points), work_limits(key, axes))
            for key, (axes, files, peak, points) in collected.items()}


def _routing_skew(table_dir: TableDirectory, files: Sequence[str]) -> float:
    """The power-law exponent of the routing a grid's grouped-GEMM rows were timed under (provenance
    moe_routing 'power_law_<alpha>'), 0 for balanced routing or other families."""
    for name in files:
        info = table_dir.provenance.tables.get(name)
        if info is not None and info.includes_imbalance and info.moe_routing.startswith("power_law_"):
            return float(info.moe_routing.removeprefix("power_law_"))
    return 0.0


def grid_from_points(source: GridSource, points: Sequence[GridPoint] | None = None,
                     interpolation: Interpolation = DEFAULT_INTERPOLATION) -> KernelGrid:
    """The interpolating grid of `source` (or of a subset of its points, for leave-one-out)."""
    chosen = source.points if points is None else points
    return build_grid(source.axes, ((p.coords, p.seconds, p.efficiency) for p in chosen), source.peak_flops,
                      interpolation, source.work_limits)


@dataclass(frozen=True)
class Grid:
    """An indexed grid of one kernel key, with the table it came from."""

    key: GridKey
    kernel_grid: KernelGrid
    table: str  # "<directory>/<file>" the points came from
    points: int
    # power-law exponent of the routing its grouped-GEMM rows were timed under (0: balanced)
    routing_skew: float = 0.0


class MfuTables:
    """Measured kernel tables of one device directory, indexed for cheap lookups."""

    def __init__(self, directory: Path, table_dir: TableDirectory,
                 interpolation: Interpolation = DEFAULT_INTERPOLATION) -> None:
        self.directory = Path(directory)
        self.provenance = table_dir.provenance
        self.interpolation = interpolation
        label = self.directory.name
        grids: dict[GridKey, Grid] = {}
        for key, source in grid_points(table_dir).items():
            tables = "+".join(source.tables)
            grids[key] = Grid(key, grid_from_points(source, interpolation=interpolation),
                              f"{label}/{tables}", len(source.points), _routing_skew(table_dir, source.tables))
        self.grids: Mapping[GridKey, Grid] = grids  # a KeptGrids where read from the on-disk cache
        self._cache: dict[tuple[KernelShape, float], TableHit | None] = {}
        self._gemm_planes = _gemm_planes(self.grids)
        self.collectives = collective_series(table_dir, label)
        self.elementwise = elementwise_series(table_dir, label)
        self._hbm_rows: Iterable[tuple[str, float, float, str]] = _hbm_rows(self.directory, table_dir)
        self._hbm_fastest = _fastest_rows(self._hbm_rows)
        self._checked: set[tuple[str, float, tuple[tuple[str, float], ...]]] = set()

    @cached_property  # asked for every grouped-GEMM kernel priced
    def moe_includes_imbalance(self) -> bool:
        """True when the grouped-GEMM (MoE) tables were timed on the most loaded rank under uneven
        (power-law) routing (provenance `moe_routing`, e.g. aiconfigurator's): their times already
        contain the expert-load imbalance, so the simulator must not multiply in its own factor."""
        return any(info.includes_imbalance for info in self.provenance.tables.values())

    @property
    def elementwise_memory_efficiency(self) -> float | None:
        """The share of HBM bandwidth elementwise kernels stream at under these tables' rule, or None
        (the hardware card's elementwise_memory_efficiency applies)."""
        return self.provenance.elementwise_memory_efficiency

    @property
    def moe_routing(self) -> tuple[str, ...]:
        """The routings the grouped-GEMM tables were timed under ('balanced', 'power_law_1.01', ...)."""
        return tuple(sorted({info.moe_routing for info in self.provenance.tables.values()
                             if info.family == "grouped_gemm"}))

    def check_hardware(self, hw: Any, source: str = "") -> None:
        """Refuse rows that, on the GPU of hardware card `hw`, would move their bytes faster than its
        HBM peak (a latency too small: a unit slip, a cached benchmark); each names file and line.
        Only tables measured on that GPU are checked (on another GPU, lookups are floored at the
        HBM bound instead: see infersim.timing)."""
        if not same_device(self.provenance.device.name, hw.name):
            return
        key = (hw.name, hw.peak.hbm_bandwidth, hw.peak.l2_bytes, tuple(sorted(hw.peak.flops.items())))
        if key in self._checked:
            return
        if self._may_beat_hbm(hw):
            self._check_rows(hw, source)
        self._checked.add(key)

    def _may_beat_hbm(self, hw: Any) -> bool:
        """Whether any row might fail check_hardware, from each dtype's fastest rows (the rows
        themselves are unpickled only for the full check, which names the failing row)."""
        for dtype, (moved, fastest) in self._hbm_fastest.items():
            peak = self.provenance.peak_flops.get(dtype)
            card_peak = hw.peak.flops.get(dtype)
            if not peak or not card_peak:
                continue
            first = bisect.bisect_right(moved, hw.peak.l2_bytes)  # the rows moving more than L2 holds
            # a row fails when moved > latency_us * 1e-6 * peak / card_peak * bandwidth, i.e. when
            # its bytes per us exceed `limit`; the margin leaves a row at the limit (up to rounding)
            # to the full check
            limit = 1e-6 * peak / card_peak * hw.peak.hbm_bandwidth
            if first < len(moved) and fastest[first] * (1 + 1e-9) > limit:
                return True
        return False

    def _check_rows(self, hw: Any, source: str) -> None:
        for dtype, latency_us, moved, where in self._hbm_rows:
            peak = self.provenance.peak_flops.get(dtype)
            card_peak = hw.peak.flops.get(dtype)
            if not peak or not card_peak:
                continue
            seconds = latency_us * 1e-6 * peak / card_peak  # as lookups scale it
            # a benchmark that repeats a kernel without flushing L2 can read an operand set that
            # fits in L2 faster than HBM allows (aiconfigurator's small GEMMs do): only data larger
            # than L2 must have crossed HBM
            if moved > seconds * hw.peak.hbm_bandwidth and moved > hw.peak.l2_bytes:
                raise ConfigError(where, "latency_us", latency_us,
                                  f"moves {moved:.4g} bytes in {seconds * 1e6:.4g} us = {moved / seconds / 1e12:.4g} "
                                  f"TB/s, more than the {hw.peak.hbm_bandwidth / 1e12:.4g} TB/s HBM peak of hardware "
                                  f"card {hw.name}" + (f" ({source})" if source else ""))

    def lookup(self, shape: KernelShape, peak_flops: float) -> TableHit | None:
        """Time of `shape` from the tables at the caller's peak FLOP/s, or None (see module doc)."""
        cache_key = (shape, peak_flops)
        try:
            return self._cache[cache_key]
        except KeyError:
            pass
        except TypeError:  # an unhashable shape: look it up uncached
            return self._lookup(shape, peak_flops)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        hit = self._cache[cache_key] = self._lookup(shape, peak_flops)
        return hit

    def _lookup(self, shape: KernelShape, peak_flops: float) -> TableHit | None:
        if isinstance(shape, CollectiveShape):
            return self._collective(shape)
        if isinstance(shape, MemoryBoundShape):
            return self._elementwise(shape) if shape.op else None
        found = shape_grid_key(shape)
        if found is None or not peak_flops > 0:
            return None
        key, coords, repeats = found
        grid = self.grids.get(key)
        if grid is None:
            if isinstance(shape, GemmShape):
                return self._gemm_between_planes(shape, peak_flops)
            return None
        value = grid.kernel_grid.evaluate(coords, shape.flops / repeats)
        # the table's efficiency carries over to the caller's peak: time scales with peak ratio
        seconds = repeats * value.seconds * grid.kernel_grid.flops_per_second / peak_flops
        if value.clamps:
            note = f"{describe_key(key)}: " + "; ".join(c.describe() for c in value.clamps)
            if all(c.extrapolated for c in value.clamps):
                kernel_grid = grid.kernel_grid
                edge = _edge_of(kernel_grid, coords, value.clamps, shape.flops / repeats)
                axis, top, edge_seconds = edge if edge else ("", 0.0, 0.0)
                return TableHit(seconds, grid.table, "extrapolated", value.efficiency,
                                note + "; extended at the last interval's time per unit of work",
                                axis, top, repeats * edge_seconds * kernel_grid.flops_per_second / peak_flops,
                                kernel_grid.best_efficiency if len(kernel_grid.axes) > 1 else 0.0, grid.routing_skew)
            return TableHit(seconds, grid.table, "edge", value.efficiency,
                            note + f"; roofline at edge efficiency {value.efficiency:.3f}",
                            moe_routing_skew=grid.routing_skew)
        method: Literal["exact", "interpolated"] = "exact" if value.exact else "interpolated"
        return TableHit(seconds, grid.table, method, value.efficiency, moe_routing_skew=grid.routing_skew)

    def _collective(self, shape: CollectiveShape) -> TableHit | None:
        """A collective inside one node, by kind and ranks, piecewise linear in the message bytes
        (a latency plus bytes over a bandwidth on each segment). Below the smallest message: the
        smallest message's time (the latency floor). Above the largest: the largest message's time
        scaled by bytes (bandwidth-bound), marked edge. Across nodes, or not NCCL-style (DeepEP): None."""
        if shape.nodes != 1 or shape.implementation != "nccl" or shape.ranks <= 1:
            return None
        series = self.collectives.get((shape.kind, shape.ranks))
        if series is None:
            return None
        points, table = series
        sizes = [b for b, _ in points]
        x = shape.bytes_per_rank
        if x <= sizes[0]:
            return TableHit(points[0][1], table, "exact" if x == sizes[0] else "interpolated", 0.0,
                            "" if x == sizes[0] else f"{x:g} bytes below the smallest message: its latency")
        if x > sizes[-1]:
            seconds = points[-1][1] * x / sizes[-1]
            return TableHit(seconds, table, "edge", 0.0,
                            f"{shape.kind} of {x:g} bytes above the table's largest message ({sizes[-1]:g}): "
                            f"its time scaled by bytes")
        return _inside_series(points, sizes, x, table)

    def _elementwise(self, shape: MemoryBoundShape) -> TableHit | None:
        """One eager kernel by (op, dtype), piecewise linear in its bytes (module docstring)."""
        series = self.elementwise.get((shape.op, shape.dtype))
        if series is None:
            return None
        points, table = series
        sizes = [b for b, _ in points]
        x = shape.bytes_moved
        if x <= sizes[0]:
            exact = x == sizes[0]
            return TableHit(points[0][1], table, "exact" if exact else "interpolated", 0.0,
                            "" if exact else f"{shape.op} {shape.dtype}: {x:.4g} bytes below the smallest size timed: "
                                             f"its time (the launch-bound floor)")
        if x > sizes[-1]:
            (b0, t0), (b1, t1) = points[-2] if len(points) > 1 else (0.0, 0.0), points[-1]
            per_byte = max((t1 - t0) / (b1 - b0), 0.0) if b1 > b0 else t1 / b1
            return TableHit(t1 + per_byte * (x - b1), table, "extrapolated", 0.0,
                            f"{shape.op} {shape.dtype}: {x:.4g} bytes above the largest size timed ({b1:.4g}): "
                            f"extended at the last interval's time per byte")
        return _inside_series(points, sizes, x, table)

    def _gemm_between_planes(self, shape: GemmShape, peak_flops: float) -> TableHit | None:
        """A GEMM whose (K, N) was not measured, in a table measured on a full K x N grid: the times
        of the four measured (K, N) around it at the same m, bilinear in K and N (a GEMM's work is
        bilinear in them). Tables not measured on a full K x N grid (e.g. per-model shapes) answer None."""
        plane = self._gemm_planes.get(shape.dtype)
        if plane is None:
            return None
        ks, ns = plane
        # above the largest K or N measured (a 128k-vocabulary LM head against aiconfigurator's
        # N <= 65,536): the GEMM at the largest plane, its time scaled by the work ratio. At that
        # width every SM already holds output tiles (or K iterations), so more N or K is more of the
        # same work at the same rate
        k_in, n_in = min(shape.k, ks[-1]), min(shape.n, ns[-1])
        scale = (shape.k / k_in) * (shape.n / n_in)
        if scale != 1.0:
            inside = self._gemm_between_planes(
                GemmShape(m=shape.m, k=k_in, n=n_in, dtype=shape.dtype, weight_dtype=shape.weight_dtype,
                          out_dtype=shape.out_dtype), peak_flops)
            if inside is None:
                return None
            seconds = inside.seconds * scale
            above = ", ".join(f"{axis}={value} above the table's largest {axis}={largest}"
                              for axis, value, largest in (("k", shape.k, ks[-1]), ("n", shape.n, ns[-1]))
                              if value > largest)
            note = f"{above}: the time at k={k_in}, n={n_in} scaled by the work ratio {scale:.3g}"
            return TableHit(seconds, inside.table, "extrapolated", shape.flops / (seconds * peak_flops), note)
        k_pair = _bracket(ks, shape.k)
        n_pair = _bracket(ns, shape.n)
        if k_pair is None or n_pair is None:
            return None
        corners = {}
        tables = set()
        edge_notes = []
        for k in set(k_pair):
            for n in set(n_pair):
                corner = GemmShape(m=shape.m, k=k, n=n, dtype=shape.dtype, weight_dtype=shape.weight_dtype)
                hit = self.lookup(corner, peak_flops)
                if hit is None:
                    return None
                corners[(k, n)] = hit.seconds
                tables.add(hit.table)
                if hit.method == "edge":
                    edge_notes.append(hit.note)
        seconds = _bilinear(corners, k_pair, n_pair, shape.k, shape.n)
        efficiency = shape.flops / (seconds * peak_flops)
        table = "+".join(sorted(tables))
        where = (f"k={shape.k} between {k_pair[0]} and {k_pair[1]}, n={shape.n} between {n_pair[0]} and "
                 f"{n_pair[1]}")
        if edge_notes:
            return TableHit(seconds, table, "edge", efficiency, f"{where}; " + edge_notes[0])
        return TableHit(seconds, table, "interpolated", efficiency, where)

    def describe(self) -> str:
        prov = self.provenance
        families: dict[str, int] = {}
        for key in self.grids:
            family = str(key[0]) if key[0] != "attention" else f"attention {key[1]}"
            families[family] = families.get(family, 0) + 1
        kinds = ", ".join(f"{n} {f}" for f, n in sorted(families.items()))
        origin = prov.origin
        if prov.source.get("project"):
            origin += f" from {prov.source['project']}"
        engine = ""
        if prov.software.get("framework"):
            engine = f", engine {prov.software['framework']} {prov.software.get('framework_version', '')}".rstrip()
        collectives = f", {len(self.collectives)} collective series" if self.collectives else ""
        if self.elementwise:
            collectives += f", {len(self.elementwise)} elementwise series"
        routing = ""
        if self.moe_includes_imbalance:
            routing = (f"; MoE tables timed under {', '.join(self.moe_routing)} routing: expert-load imbalance "
                       f"included")
        elementwise = ""
        if prov.elementwise_memory_efficiency is not None:
            source = prov.elementwise_source or "the tables' own rule"
            elementwise = f"; elementwise kernels at {prov.elementwise_memory_efficiency:.2f} of HBM bandwidth ({source})"
        return (f"{display_path(self.directory)} ({prov.device.name}, {origin}{engine}, measured {prov.measured_on}; "
                f"{len(self.grids)} grids: {kinds}{collectives}{routing}{elementwise})")


# ---------------------------------------------------------------------------------------------
# Beyond a table's range: when the last interval's slope stands, and what prices the kernel if not
#
# A row is extended above its last point at the last interval's time per unit of work (_extend_above):
# the shape of a kernel with a fixed cost plus a cost per unit of work, which predicts the next points
# of a row best, and (benchmarks/mfu_extrapolation.py --far) goes on predicting points 4-32x beyond a
# row's end best while the kernel stays in one regime. Where the shape turns from memory-bound (at
# the row's last point, on the hardware card's roofline) to compute-bound (at the query), the slope
# describes weight streaming, not the compute-bound kernel: an MoE grouped GEMM measured up to a few
# hundred tokens per expert re-reads its weights there, and its slope says nothing of the GEMM at
# thousands. If the table measured the kernel elsewhere on its grid (other EP sizes, other batches),
# the kernel is then priced by the roofline anchored at the table: its streaming rate at the row's
# last point (bytes / time) and the best FLOP efficiency the grid reaches, marked "edge". This holds
# for the MoE grouped GEMMs, whose grids span EP sizes (the compute-bound kernel is measured at the
# small EP sizes' token counts): on held-out points 4-32x beyond cuts from 256 up it cuts the p90
# error of the aiconfigurator grouped-GEMM tables from 59-106% to 51-76% (medians 14-24% -> 19-24%).
# Elsewhere the slope stays: grids of one row (a GEMM's m, a prefill's sequence) know nothing else
# (anchored at the row's own efficiency they err 108-243% where they cross), and attention decode
# crossings were measured worse anchored (median 24-53% against 20-28%).

# the shape field each extended work axis sets (prefill seq_len sets q_len and kv_len)
_WORK_FIELDS = {"m": ("m",), "tokens_per_gpu": ("tokens_per_gpu",), "batch": ("batch",), "kv_len": ("kv_len",),
                "seq_len": ("q_len", "kv_len")}


def _edge_of(grid: KernelGrid, coords: tuple[float, ...], clamps: tuple[Clamp, ...],
             query_flops: float) -> tuple[str, float, float] | None:
    """(axis, last measured value, table time there) of an extrapolated lookup: the shape moved back
    to the lowest last point among the rows it was extended on. None when more than one axis was
    extended, or the edge itself falls outside the table."""
    axes = {c.axis for c in clamps}
    if len(axes) != 1:
        return None
    axis = axes.pop()
    top = min(c.high for c in clamps)
    at_edge = tuple(top if name == axis else value for name, value in zip(grid.axes, coords))
    value = grid.evaluate(at_edge, query_flops)
    if value.clamps:
        return None
    return axis, top, value.seconds


def with_work(shape: KernelShape, axis: str, value: float) -> KernelShape | None:
    """`shape` with work axis `axis` set to `value` (None: an axis no shape field carries)."""
    fields = _WORK_FIELDS.get(axis)
    if fields is None:
        return None
    import dataclasses

    cast = {name: type(getattr(shape, name)) for name in fields}
    return dataclasses.replace(shape, **{name: cast[name](value) for name in fields})


#: (FLOPs the tensor cores execute, achievable FLOP/s, achievable bytes/s) of a shape on the
#: hardware card's roofline (infersim.timing supplies it)
Roofline = Callable[[KernelShape], tuple[float, float, float]]


def regime(shape: KernelShape, roofline: Roofline) -> Literal["compute", "memory"]:
    """Which bound the card's roofline puts this shape under."""
    flops, compute, memory = roofline(shape)
    return "compute" if flops / compute >= shape.bytes / memory else "memory"


def beyond_range(shape: KernelShape, hit: TableHit, roofline: Roofline, peak_flops: float) -> TableHit:
    """Apply the beyond-range rule to an extrapolated hit of `shape` (see the section comment): the
    hit as it is, unless an MoE grouped GEMM crosses from its row's memory-bound last point into the
    compute regime in a grid of several rows; then the roofline anchored at the table, marked edge."""
    if not isinstance(shape, GroupedGemmShape) or not hit.best_efficiency > 0:
        return hit
    edge = with_work(shape, hit.edge_axis, hit.edge_value) if hit.edge_axis and hit.edge_seconds > 0 else None
    if edge is None or not edge.flops > 0:
        return hit
    if regime(edge, roofline) != "memory" or regime(shape, roofline) != "compute":
        return hit
    streaming = edge.bytes / hit.edge_seconds  # the table's streaming rate at the row's last point
    compute = hit.best_efficiency * peak_flops  # the best FLOP rate its grid measured
    seconds = max(shape.flops / compute, shape.bytes / streaming)
    note = (hit.note.replace("; extended at the last interval's time per unit of work", "")
            + f"; memory-bound at the table's last point, compute-bound here: roofline anchored at the table "
              f"(its streaming rate there, {streaming / 1e12:.3g} TB/s, and its best efficiency, "
              f"{hit.best_efficiency:.3f} of peak)")
    return TableHit(seconds, hit.table, "edge", shape.flops / (seconds * peak_flops), note)


def _hbm_rows(directory: Path, table_dir: TableDirectory) -> tuple[tuple[str, float, float, str], ...]:
    """(dtype, latency_us, minimum bytes moved, "file:line") of every row check_hardware checks,
    computed once when the tables are indexed (and so kept in the on-disk cache with them): the
    bytes do not depend on the hardware card, and computing them for each row was most of the
    check's ~10 ms in every process. Collective rows are left out: latencies of links, not of HBM
    traffic."""
    found = []
    for name, rows in table_dir.tables.items():
        lines = table_dir.row_lines.get(name, ())
        for i, row in enumerate(rows):
            if not hasattr(row, "dtype"):
                continue
            where = f"{directory / name}:{lines[i]}" if i < len(lines) else f"{directory / name}"
            found.append((row.dtype, row.latency_us, minimum_bytes(row.shape()), where))
    return tuple(found)


def _fastest_rows(rows: Iterable[tuple[str, float, float, str]]
                  ) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """dtype -> (bytes moved by its rows, ascending; at each, the most bytes per microsecond of the
    rows moving at least that much): what check_hardware needs to pass a card without the rows."""
    by_dtype: dict[str, list[tuple[float, float]]] = {}
    for dtype, latency_us, moved, _where in rows:
        rate = moved / latency_us if latency_us > 0 else math.inf  # inf: always fully checked
        by_dtype.setdefault(dtype, []).append((moved, rate))
    fastest_rows = {}
    for dtype, pairs in by_dtype.items():
        pairs.sort()
        fastest, best = [], -math.inf
        for _moved, rate in reversed(pairs):
            best = max(best, rate)
            fastest.append(best)
        fastest_rows[dtype] = (tuple(moved for moved, _ in pairs), tuple(reversed(fastest)))
    return fastest_rows


def collective_series(table_dir: TableDirectory, label: str
                      ) -> dict[tuple[str, int], tuple[list[tuple[float, float]], str]]:
    """(kind, ranks) -> ([(message bytes, seconds)] ascending, table name); repeats averaged. One
    library per (kind, ranks): a directory holding two (e.g. NCCL and an engine's custom all-reduce
    for the same kind) is refused, as the lookup could not say which the engine runs."""
    found: dict[tuple[str, int], dict[float, list[float]]] = {}
    names: dict[tuple[str, int], tuple[str, str]] = {}
    for name, rows in table_dir.tables.items():
        for row in rows:
            if not isinstance(row, CollectiveRow):
                continue
            key = (row.kind, row.ranks)
            seen = names.setdefault(key, (name, row.library))
            if seen[1] != row.library:
                raise InferSimError(f"{label}: {row.kind} over {row.ranks} GPUs is timed by both {seen[1]} "
                                    f"({seen[0]}) and {row.library} ({name}); keep one")
            found.setdefault(key, {}).setdefault(float(row.message_bytes), []).append(row.latency_us * 1e-6)
    return {key: (sorted((b, sum(t) / len(t)) for b, t in by_size.items()), f"{label}/{names[key][0]}")
            for key, by_size in found.items()}


def _inside_series(points: list[tuple[float, float]], sizes: list[float], x: float, table: str) -> TableHit:
    """A (bytes, seconds) series at x within its range: exact at a point, else linear between the two around."""
    i = bisect.bisect_left(sizes, x)
    if sizes[i] == x:
        return TableHit(points[i][1], table, "exact", 0.0)
    (b0, t0), (b1, t1) = points[i - 1], points[i]
    return TableHit(t0 + (t1 - t0) * (x - b0) / (b1 - b0), table, "interpolated", 0.0)


def elementwise_series(table_dir: TableDirectory, label: str
                       ) -> dict[tuple[str, str], tuple[list[tuple[float, float]], str]]:
    """(op, dtype) -> ([(bytes, seconds)] ascending, table name); repeats averaged."""
    found: dict[tuple[str, str], dict[float, list[float]]] = {}
    names: dict[tuple[str, str], str] = {}
    for name, rows in table_dir.tables.items():
        for row in rows:
            if isinstance(row, ElementwiseRow):
                key = (row.op, row.dtype)
                names.setdefault(key, name)
                found.setdefault(key, {}).setdefault(float(row.bytes), []).append(row.latency_us * 1e-6)
    return {key: (sorted((b, sum(t) / len(t)) for b, t in by_size.items()), f"{label}/{names[key]}")
            for key, by_size in found.items()}


def _gemm_planes(grids: dict[GridKey, Grid]) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """dtype -> (K values, N values) for the GEMM dtypes measured on a K x N product grid (at least
    two of each, and at least PLANE_COVERAGE of all K x N pairs measured, e.g. aiconfigurator's 483
    of 22 x 22): only those interpolate between (K, N). Per-model tables (the original InferSim's
    cover 15-21% of their K x N product) answer only their measured (K, N)."""
    pairs: dict[str, set[tuple[int, int]]] = {}
    for key in grids:
        if key[0] == "gemm":
            pairs.setdefault(str(key[1]), set()).add((int(key[2]), int(key[3])))  # type: ignore[call-overload]
    planes = {}
    for dtype, measured in pairs.items():
        ks = tuple(sorted({k for k, _ in measured}))
        ns = tuple(sorted({n for _, n in measured}))
        if len(ks) >= 2 and len(ns) >= 2 and len(measured) >= PLANE_COVERAGE * len(ks) * len(ns):
            planes[dtype] = (ks, ns)
    return planes


def _bracket(values: tuple[int, ...], x: int) -> tuple[int, int] | None:
    """The grid values on either side of x (the same twice if x is one), or None outside the range."""
    if x < values[0] or x > values[-1]:
        return None
    i = bisect.bisect_left(values, x)
    if values[i] == x:
        return x, x
    return values[i - 1], values[i]


def _bilinear(corners: dict[tuple[int, int], float], k_pair: tuple[int, int], n_pair: tuple[int, int],
              k: int, n: int) -> float:
    def along_n(kk: int) -> float:
        n0, n1 = n_pair
        if n0 == n1:
            return corners[(kk, n0)]
        t = (n - n0) / (n1 - n0)
        return (1.0 - t) * corners[(kk, n0)] + t * corners[(kk, n1)]

    k0, k1 = k_pair
    if k0 == k1:
        return along_n(k0)
    t = (k - k0) / (k1 - k0)
    return (1.0 - t) * along_n(k0) + t * along_n(k1)


def same_device(device_name: str, card_name: str) -> bool:
    """Whether a table's device (as the driver names it, e.g. "NVIDIA H800") is the GPU of a
    hardware card (e.g. "h800"): the card name's first token with a digit appears in it."""
    device = "".join(ch for ch in device_name.lower() if ch.isalnum())
    tokens = [t for t in card_name.lower().split("-") if any(ch.isdigit() for ch in t)]
    return bool(tokens) and tokens[0] in device


_LOADED: dict[tuple[str, str, tuple[tuple[str, int, int], ...]], MfuTables] = {}


def load_tables(directory: Path, interpolation: Interpolation = DEFAULT_INTERPOLATION) -> MfuTables:
    """Load one device's table directory (refused without provenance.yaml) and index it. Loaded
    tables are kept for the process (they are read-only), keyed by the files' sizes and mtimes so
    an edited table is read again."""
    directory = Path(directory)
    try:
        stamp = tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()))
    except OSError:
        stamp = ()
    key = (str(directory.resolve()), str(interpolation), stamp)
    if stamp and key in _LOADED:
        return _LOADED[key]
    cache = _disk_cache_file(directory, interpolation, stamp) if stamp else None
    tables = _read_disk_cache(*cache) if cache else None
    if tables is None:
        tables = _load_tables(directory, interpolation)
        if cache:
            _write_disk_cache(*cache, tables)
    if stamp:
        _LOADED[key] = tables
    return tables


# Indexed tables are also kept on disk between processes (reading and indexing aiconfigurator's
# H100 tables takes 1.6 s, unpickling them 0.2 s): keyed by the directory, its files' sizes and
# mtimes, and this package's table code, so an edited table or a new build is read afresh.
# INFERSIM_CACHE=off turns it off; INFERSIM_CACHE_DIR moves it (infersim.diskcache).
# kernels.py: the bytes check_hardware compares are computed at indexing (_hbm_rows)
_CODE_FILES = ("mfu/format.py", "mfu/lookup.py", "kernels.py")


def _disk_cache_file(directory: Path, interpolation: Interpolation,
                     stamp: tuple[tuple[str, int, int], ...]) -> tuple[Path, str] | None:
    """(cache file, its key) for a table directory, or None where not cached. The file's name is
    a 64-bit checksum of the key (zlib's: hashlib costs ~3 ms to import in every process) and the
    file holds the key itself, so a name shared by two keys is only a cache miss."""
    import zlib

    from infersim.diskcache import cache_dir

    root = cache_dir()
    if root is None:
        return None
    if interpolation.name not in ("time-in-work-convex-envelope", "time-in-work"):
        return None  # the other interpolation holds a lambda, which does not pickle
    package = Path(__file__).resolve().parent.parent
    try:
        code = tuple((name, (package / name).stat().st_mtime_ns, (package / name).stat().st_size)
                     for name in _CODE_FILES)
    except OSError:
        return None
    key = repr((str(directory.resolve()), interpolation.name, stamp, code))
    data = key.encode()
    return Path(root) / f"tables-{zlib.crc32(data):08x}{zlib.adler32(data):08x}.pickle", key


class KeptGrids(Mapping):
    """Grids as kept on disk: each one pickled on its own and unpickled when first asked for. A run
    looks up a handful of the tens of grids of a table set (82 for the H20's), and unpickling them
    all was most of reading the kept tables."""

    def __init__(self, pickled: dict[GridKey, bytes]) -> None:
        self._pickled = pickled
        self._grids: dict[GridKey, Grid] = {}

    def __getitem__(self, key: GridKey) -> Grid:
        grid = self._grids.get(key)
        if grid is None:
            grid = self._grids[key] = _unpickler().loads(self._pickled[key])
        return grid

    def __iter__(self) -> Iterator[GridKey]:
        return iter(self._pickled)

    def __len__(self) -> int:
        return len(self._pickled)

    def __reduce__(self) -> tuple[type, tuple[dict[GridKey, bytes]]]:
        return KeptGrids, (self._pickled,)


class KeptRows:
    """The rows check_hardware checks, as kept on disk: unpickled only for the full check (which a
    card passing on the rows' fastest rates skips: see MfuTables._may_beat_hbm)."""

    def __init__(self, pickled: bytes) -> None:
        self._pickled = pickled

    def __iter__(self) -> Iterator[tuple[str, float, float, str]]:
        return iter(_unpickler().loads(self._pickled))


def _unpickler() -> Any:
    """The C unpickler alone: the pickle module around it (its Python pickler) is ~1 ms to import."""
    try:
        import _pickle as unpickler
    except ImportError:  # a Python without it
        import pickle as unpickler
    return unpickler


def _read_disk_cache(path: Path, key: str) -> MfuTables | None:
    try:
        with path.open("rb") as f:
            kept_key, tables = _unpickler().load(f)
            from infersim.diskcache import mark_used

            mark_used(f)
    except Exception:  # absent, unreadable or from another build: read the tables instead
        return None
    return tables if kept_key == key and isinstance(tables, MfuTables) else None


def _write_disk_cache(path: Path, key: str, tables: MfuTables) -> None:
    import copy
    import os
    import pickle

    try:
        kept = copy.copy(tables)
        kept.grids = KeptGrids({k: pickle.dumps(grid, protocol=pickle.HIGHEST_PROTOCOL)
                                for k, grid in tables.grids.items()})
        kept._hbm_rows = KeptRows(pickle.dumps(tuple(tables._hbm_rows), protocol=pickle.HIGHEST_PROTOCOL))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with partial.open("wb") as f:
            pickle.dump((key, kept), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return  # a read-only home or an unpicklable table set: only the next process is slower
    from infersim.diskcache import prune

    prune(str(path.parent))  # the cache directory stays under its cap (INFERSIM_CACHE_MAX_MB)


def _load_tables(directory: Path, interpolation: Interpolation) -> MfuTables:
    if directory.is_dir() and not (directory / PROVENANCE_FILE).is_file():
        nested = table_directories(directory)
        if nested:
            names = ", ".join(str(p.relative_to(directory)) for p in nested)
            raise InferSimError(f"{directory} holds several device table directories ({names}): "
                                f"name one of them")
    return MfuTables(directory, read_table_dir(directory), interpolation)
