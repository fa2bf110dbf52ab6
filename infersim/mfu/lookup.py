"""Kernel time from measured tables: the `KernelTables` the simulator core asks.

Each table is indexed once at load into grids keyed by the kernel's categorical parameters (GEMM K
and N, head layout, expert configuration, dtypes); only an exact match of those counts:

  GEMM                 key (dtype, k, n)                                        axes (m)
  grouped GEMM         key (dtype, stage, projection, experts, topk, hidden,
                            intermediate, gated)                                axes (ep, tokens per GPU)
  attention decode     key (kind, dtype, kv_dtype, heads, kv heads, qk dim,
                            v dim, q_len)                                       axes (batch, kv_len)
  attention prefill    key (kind, dtype, kv_dtype, heads, kv heads, qk dim,
                            v dim, causal)                                      axes (seq_len), batch 1

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
clamped point), marked "edge" with a note; it is never extrapolated. Prefill for batch > 1 runs
`batch` sequences: `batch` times the one-sequence time. Shapes no table covers (another K/N,
layout or dtype, sliding windows, chunked prefill, decode with several query tokens unless
measured so, memory-bound kernels) get None.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Literal, Sequence, Union

from infersim.errors import ConfigError, InferSimError
from infersim.kernels import (
    AttentionShape,
    GemmShape,
    GroupedGemmShape,
    KernelShape,
    TableHit,
    minimum_bytes,
)
from infersim.mfu.format import (
    PROVENANCE_FILE,
    AttentionRow,
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

    def evaluate(self, query: Sequence[float], query_flops: float) -> GridValue:
        """Time and efficiency of the kernel at `query` (axis values) doing `query_flops`."""
        coords = tuple(self.interpolation.coordinate(a, q) for a, q in zip(self.axes, query))
        (value, eff), exact, clamps = _evaluate(self.root, coords, tuple(query), self.axes,
                                                self.interpolation.convex_envelope)
        if self.interpolation.interpolates_time:
            seconds = value
            if clamps:
                seconds = query_flops / (self.flops_per_second * eff)
            else:
                eff = query_flops / (self.flops_per_second * seconds)
        else:
            eff = math.exp(value)
            seconds = query_flops / (self.flops_per_second * eff)
        return GridValue(seconds, eff, exact, clamps)


def build_grid(axes: Sequence[str], points: Iterable[tuple[Sequence[float], float, float]],
               flops_per_second: float, interpolation: Interpolation = DEFAULT_INTERPOLATION) -> KernelGrid:
    """A ragged grid from (axis values, seconds, efficiency) points; repeated points are averaged."""
    listed = []
    for coords, seconds, eff in points:
        coords = tuple(float(x) for x in coords)
        if len(coords) != len(axes) or min(coords) <= 0 or not seconds > 0 or not eff > 0:
            raise ValueError(f"grid point {coords}: needs {len(axes)} positive axis values, a positive time "
                             f"and efficiency")
        value = seconds if interpolation.interpolates_time else math.log(eff)
        listed.append((coords, (value, eff)))
    return KernelGrid(tuple(axes), _build_level(listed, tuple(axes), interpolation), interpolation, flops_per_second)


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
              names: tuple[str, ...], envelope: bool = False) -> tuple[Leaf, bool, tuple[Clamp, ...]]:
    x = coords[0]
    grid = node.coords
    clamps: tuple[Clamp, ...] = ()
    if (x < grid[0] and not _same(x, grid[0])) or (x > grid[-1] and not _same(x, grid[-1])):
        clamps = (Clamp(names[0], raw[0], min(node.values), max(node.values)),)
        x = min(max(x, grid[0]), grid[-1])
    i = bisect.bisect_left(grid, x)
    for j in (i - 1, i):
        if 0 <= j < len(grid) and _same(grid[j], x):
            leaf, exact, inner = _child(node.children[j], coords, raw, names, envelope)
            return leaf, exact and not clamps, clamps + inner
    lo, hi = i - 1, i
    t = (x - grid[lo]) / (grid[hi] - grid[lo])
    (v0, e0), _, c0 = _child(node.children[lo], coords, raw, names, envelope)
    (v1, e1), _, c1 = _child(node.children[hi], coords, raw, names, envelope)
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
                (va, _), _, ca = _child(node.children[a], coords, raw, names, envelope)
                if not ca:
                    secants.append(_secant(grid[a], va, grid[b], vb, x))
        if len(secants) == 3:
            value = min(value, max(secants))
    return (value, (1.0 - t) * e0 + t * e1), False, clamps + c0 + c1


def _secant(xa: float, va: float, xb: float, vb: float, x: float) -> float:
    return vb + (vb - va) / (xb - xa) * (x - xb)


def _child(child: GridNode | Leaf, coords: tuple[float, ...], raw: tuple[float, ...],
           names: tuple[str, ...], envelope: bool = False) -> tuple[Leaf, bool, tuple[Clamp, ...]]:
    if isinstance(child, GridNode):
        return _evaluate(child, coords[1:], raw[1:], names[1:], envelope)
    return child, True, ()


# ---------------------------------------------------------------------------------------------
# Families: how a row and a shape map to (grid key, axis values)


GEMM_AXES = ("m",)
GROUPED_AXES = ("ep", "tokens_per_gpu")
DECODE_AXES = ("batch", "kv_len")
PREFILL_AXES = ("seq_len",)


def row_grid_key(row: Row) -> tuple[GridKey, tuple[float, ...], tuple[str, ...]]:
    """(grid key, axis values, axis names) of a table row."""
    if isinstance(row, GemmRow):
        return ("gemm", row.dtype, row.k, row.n), (float(row.m),), GEMM_AXES
    if isinstance(row, GroupedGemmRow):
        key = ("grouped_gemm", row.dtype, row.stage, row.projection, row.num_experts, row.topk,
               row.hidden, row.intermediate, row.gated)
        return key, (float(row.ep), float(row.tokens_per_gpu)), GROUPED_AXES
    if isinstance(row, AttentionRow):
        kv_heads = 1 if row.kind == "mla" else row.num_kv_heads
        layout = (row.kind, row.dtype, row.kv_dtype, row.num_heads, kv_heads, row.qk_head_dim, row.v_head_dim)
        if row.stage == "decode":
            return ("attention", "decode") + layout + (row.q_len,), (float(row.batch), float(row.kv_len)), DECODE_AXES
        if row.batch != 1 or row.q_len != row.kv_len:
            raise ValueError("prefill attention rows must be one sequence (batch 1) with q_len == kv_len")
        return ("attention", "prefill") + layout + (row.causal,), (float(row.kv_len),), PREFILL_AXES
    raise TypeError(f"not a table row: {row!r}")


def shape_grid_key(shape: KernelShape) -> tuple[GridKey, tuple[float, ...], int] | None:
    """(grid key, axis values, repeats) a shape is looked up under, or None if no table kind
    covers it. `repeats` is how many grid-point kernels the shape is (prefill: one per sequence)."""
    if isinstance(shape, GemmShape):
        if shape.weight_dtype != shape.dtype or shape.m <= 0:
            return None
        return ("gemm", shape.dtype, shape.k, shape.n), (float(shape.m),), 1
    if isinstance(shape, GroupedGemmShape):
        if shape.weight_dtype != shape.dtype or shape.tokens_per_gpu <= 0 or shape.ep <= 0:
            return None
        key = ("grouped_gemm", shape.dtype, shape.stage, shape.projection, shape.num_experts, shape.topk,
               shape.hidden, shape.intermediate, shape.gated)
        return key, (float(shape.ep), float(shape.tokens_per_gpu)), 1
    if isinstance(shape, AttentionShape):
        if shape.window > 0 or shape.batch <= 0 or shape.kv_len <= 0:
            return None
        kv_heads = 1 if shape.kind == "mla" else shape.num_kv_heads
        layout = (shape.kind, shape.dtype, shape.kv_dtype, shape.num_heads, kv_heads, shape.qk_head_dim,
                  shape.v_head_dim)
        if shape.stage == "decode":
            return ("attention", "decode") + layout + (shape.q_len,), (float(shape.batch), float(shape.kv_len)), 1
        if shape.q_len != shape.kv_len:
            return None  # chunked prefill over a cached prefix: not what the prefill tables measured
        return ("attention", "prefill") + layout + (shape.causal,), (float(shape.kv_len),), shape.batch
    return None


def describe_key(key: GridKey) -> str:
    family = key[0]
    if family == "gemm":
        return f"{key[1]} k={key[2]} n={key[3]}"
    if family == "grouped_gemm":
        _, dtype, stage, proj, experts, topk, hidden, inter, gated = key
        return f"{dtype} {stage} {proj} experts={experts} topk={topk} hidden={hidden} intermediate={inter}"
    _, stage, kind, dtype, kv_dtype, heads, kv_heads, qk, v, extra = key
    return f"{kind} {stage} {heads}-{kv_heads}-{qk}-{v} {dtype} kv {kv_dtype}"


# ---------------------------------------------------------------------------------------------
# The table set


@dataclass(frozen=True)
class GridPoint:
    coords: tuple[float, ...]  # axis values
    seconds: float  # measured kernel time
    efficiency: float  # relative to the table's peak for the row's dtype
    row: Row


@dataclass(frozen=True)
class GridSource:
    axes: tuple[str, ...]
    tables: tuple[str, ...]  # CSV file names the points come from
    peak_flops: float
    points: tuple[GridPoint, ...]


def grid_points(table_dir: TableDirectory) -> dict[GridKey, GridSource]:
    """Every grid's measured points, by grid key."""
    prov = table_dir.provenance
    collected: dict[GridKey, tuple[tuple[str, ...], list[str], float, list[GridPoint]]] = {}
    for name, rows in table_dir.tables.items():
        for row in rows:
            key, coords, axes = row_grid_key(row)
            peak = prov.peak_flops[row.dtype]
            entry = collected.setdefault(key, (axes, [], peak, []))
            if name not in entry[1]:
                entry[1].append(name)
            entry[3].append(GridPoint(coords, row.latency_us * 1e-6, efficiency_of(row, peak), row))
    return {key: GridSource(axes, tuple(files), peak, tuple(points))
            for key, (axes, files, peak, points) in collected.items()}


def grid_from_points(source: GridSource, points: Sequence[GridPoint] | None = None,
                     interpolation: Interpolation = DEFAULT_INTERPOLATION) -> KernelGrid:
    """The interpolating grid of `source` (or of a subset of its points, for leave-one-out)."""
    chosen = source.points if points is None else points
    return build_grid(source.axes, ((p.coords, p.seconds, p.efficiency) for p in chosen), source.peak_flops,
                      interpolation)


@dataclass(frozen=True)
class Grid:
    key: GridKey
    kernel_grid: KernelGrid
    table: str  # "<directory>/<file>" the points came from
    points: int


class MfuTables:
    """Measured kernel tables of one device directory, indexed for cheap lookups."""

    def __init__(self, directory: Path, table_dir: TableDirectory,
                 interpolation: Interpolation = DEFAULT_INTERPOLATION) -> None:
        self.directory = Path(directory)
        self.provenance = table_dir.provenance
        self.interpolation = interpolation
        self.grids: dict[GridKey, Grid] = {}
        label = self.directory.name
        for key, source in grid_points(table_dir).items():
            tables = "+".join(source.tables)
            self.grids[key] = Grid(key, grid_from_points(source, interpolation=interpolation),
                                   f"{label}/{tables}", len(source.points))
        self._cache: dict[tuple[KernelShape, float], TableHit | None] = {}
        self._rows = tuple((name, table_dir.row_lines.get(name, ()), rows) for name, rows in table_dir.tables.items())
        self._checked: set[tuple[str, float, tuple[tuple[str, float], ...]]] = set()

    def check_hardware(self, hw: Any, source: str = "") -> None:
        """Refuse rows that, on the GPU of hardware card `hw`, would move their bytes faster than its
        HBM peak (a latency too small: a unit slip, a cached benchmark); each names file and line.
        Only tables measured on that GPU are checked (on another GPU, lookups are floored at the
        HBM bound instead: see infersim.timing)."""
        if not same_device(self.provenance.device.name, hw.name):
            return
        key = (hw.name, hw.peak.hbm_bandwidth, tuple(sorted(hw.peak.flops.items())))
        if key in self._checked:
            return
        for name, lines, rows in self._rows:
            for i, row in enumerate(rows):
                peak = self.provenance.peak_flops.get(row.dtype)
                card_peak = hw.peak.flops.get(row.dtype)
                if not peak or not card_peak:
                    continue
                seconds = row.latency_us * 1e-6 * peak / card_peak  # as lookups scale it
                moved = minimum_bytes(row.shape())
                if moved > seconds * hw.peak.hbm_bandwidth:
                    where = f"{self.directory / name}:{lines[i]}" if i < len(lines) else f"{self.directory / name}"
                    raise ConfigError(where, "latency_us", row.latency_us,
                                      f"moves {moved:.4g} bytes in {seconds * 1e6:.4g} us = {moved / seconds / 1e12:.4g} "
                                      f"TB/s, more than the {hw.peak.hbm_bandwidth / 1e12:.4g} TB/s HBM peak of hardware "
                                      f"card {hw.name}" + (f" ({source})" if source else ""))
        self._checked.add(key)

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
        found = shape_grid_key(shape)
        if found is None or not peak_flops > 0:
            return None
        key, coords, repeats = found
        grid = self.grids.get(key)
        if grid is None:
            return None
        value = grid.kernel_grid.evaluate(coords, shape.flops / repeats)
        # the table's efficiency carries over to the caller's peak: time scales with peak ratio
        seconds = repeats * value.seconds * grid.kernel_grid.flops_per_second / peak_flops
        if value.clamps:
            note = (f"{describe_key(key)}: " + "; ".join(c.describe() for c in value.clamps)
                    + f"; roofline at edge efficiency {value.efficiency:.3f}")
            return TableHit(seconds, grid.table, "edge", value.efficiency, note)
        method: Literal["exact", "interpolated"] = "exact" if value.exact else "interpolated"
        return TableHit(seconds, grid.table, method, value.efficiency)

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
        return (f"{self.directory} ({prov.device.name}, {origin}, measured {prov.measured_on}; "
                f"{len(self.grids)} grids: {kinds})")


def same_device(device_name: str, card_name: str) -> bool:
    """Whether a table's device (as the driver names it, e.g. "NVIDIA H800") is the GPU of a
    hardware card (e.g. "h800"): the card name's first token with a digit appears in it."""
    device = "".join(ch for ch in device_name.lower() if ch.isalnum())
    tokens = [t for t in card_name.lower().split("-") if any(ch.isdigit() for ch in t)]
    return bool(tokens) and tokens[0] in device


def load_tables(directory: Path, interpolation: Interpolation = DEFAULT_INTERPOLATION) -> MfuTables:
    """Load one device's table directory (refused without provenance.yaml) and index it."""
    directory = Path(directory)
    if directory.is_dir() and not (directory / PROVENANCE_FILE).is_file():
        nested = table_directories(directory)
        if nested:
            names = ", ".join(str(p.relative_to(directory)) for p in nested)
            raise InferSimError(f"{directory} holds several device table directories ({names}): "
                                f"name one of them")
    return MfuTables(directory, read_table_dir(directory), interpolation)
