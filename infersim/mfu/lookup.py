"""Kernel time from measured tables: the `KernelTables` the simulator core asks.

Each table is indexed once at load into grids keyed by the kernel's categorical parameters
(GEMM K and N, head layout, expert configuration, dtypes); within a grid, efficiency (achieved
FLOP/s over the dtype's dense peak) is interpolated multilinearly in log2 of the size axes:

  GEMM                 key (dtype, k, n)                                        axes (m)
  grouped GEMM         key (dtype, stage, projection, experts, topk, hidden,
                            intermediate, gated)                                axes (ep, tokens per GPU)
  attention decode     key (kind, dtype, kv_dtype, heads, kv heads, qk dim,
                            v dim, q_len)                                       axes (batch, kv_len)
  attention prefill    key (kind, dtype, kv_dtype, heads, kv heads, qk dim,
                            v dim, causal)                                      axes (seq_len), batch 1

Grids may be ragged (rows of different extents, as published tables are): interpolation is
nested, one axis at a time, each row over its own range. A coordinate outside its row's range
is clamped there: the result is the roofline at the table's edge efficiency, marked "edge" with
a note. Prefill for batch > 1 runs `batch` sequences: the same efficiency, `batch` times the
FLOPs. Shapes no table covers (another K/N, layout or dtype, sliding windows, chunked prefill,
decode with several query tokens unless measured so, memory-bound kernels) get None.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterable, Literal, Sequence, Union

from infersim.errors import InferSimError
from infersim.kernels import (
    AttentionShape,
    GemmShape,
    GroupedGemmShape,
    KernelShape,
    TableHit,
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

#: efficiency is interpolated as log(efficiency), linearly in log2 of the axes: time then follows
#: a power law between grid points (chosen by benchmarks/mfu_leave_one_out.py; see FORMAT.md)
INTERPOLATE_LOG_EFFICIENCY = True
_COORD_TOLERANCE = 1e-9  # in log2 units: coordinates this close are the same grid point
_CACHE_LIMIT = 200_000

GridKey = tuple[Hashable, ...]


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


@dataclass(frozen=True)
class GridNode:
    """One axis level: sorted log2 coordinates and, per coordinate, a sub-grid or a value."""

    coords: tuple[float, ...]  # log2 of the axis values, ascending
    values: tuple[float, ...]  # axis values as given (for messages)
    children: tuple[Union["GridNode", float], ...]


@dataclass(frozen=True)
class GridValue:
    efficiency: float
    exact: bool
    clamps: tuple[Clamp, ...]


@dataclass(frozen=True)
class EfficiencyGrid:
    """Efficiency over named size axes, from measured points; see `build_grid`."""

    axes: tuple[str, ...]
    root: GridNode
    log_efficiency: bool  # values held as log(efficiency) (True) or efficiency (False)

    def evaluate(self, query: Sequence[float]) -> GridValue:
        """Efficiency at `query` (axis values), multilinear in log2 of the axes, clamped per row."""
        value, exact, clamps = _evaluate(self.root, tuple(math.log2(q) for q in query), tuple(query), self.axes)
        return GridValue(math.exp(value) if self.log_efficiency else value, exact, clamps)


def build_grid(axes: Sequence[str], points: Iterable[tuple[Sequence[float], float]],
               log_efficiency: bool = INTERPOLATE_LOG_EFFICIENCY) -> EfficiencyGrid:
    """A ragged grid from (axis values, efficiency) points; repeated points are averaged."""
    to_value = math.log if log_efficiency else (lambda e: e)
    listed = [(tuple(float(x) for x in coords), eff) for coords, eff in points]
    for coords, eff in listed:
        if len(coords) != len(axes) or min(coords) <= 0 or not eff > 0:
            raise ValueError(f"grid point {coords} -> {eff}: needs {len(axes)} positive axis values "
                             f"and a positive efficiency")
    return EfficiencyGrid(tuple(axes), _build_level(listed, to_value), log_efficiency)


def _build_level(points: list[tuple[tuple[float, ...], float]], to_value: Callable[[float], float]) -> GridNode:
    if not points:
        raise ValueError("a grid needs at least one point")
    groups: dict[float, list[tuple[tuple[float, ...], float]]] = {}
    raw: dict[float, float] = {}
    for coords, eff in points:
        key = round(math.log2(coords[0]) / _COORD_TOLERANCE) * _COORD_TOLERANCE
        groups.setdefault(key, []).append((coords[1:], eff))
        raw.setdefault(key, coords[0])
    coords_sorted = sorted(groups)
    children: list[GridNode | float] = []
    for key in coords_sorted:
        members = groups[key]
        if members[0][0]:
            children.append(_build_level(members, to_value))
        else:
            children.append(sum(to_value(e) for _, e in members) / len(members))
    return GridNode(tuple(coords_sorted), tuple(raw[k] for k in coords_sorted), tuple(children))


def _evaluate(node: GridNode, logq: tuple[float, ...], rawq: tuple[float, ...],
              names: tuple[str, ...]) -> tuple[float, bool, tuple[Clamp, ...]]:
    x = logq[0]
    coords = node.coords
    clamps: tuple[Clamp, ...] = ()
    if x < coords[0] - _COORD_TOLERANCE or x > coords[-1] + _COORD_TOLERANCE:
        clamps = (Clamp(names[0], rawq[0], node.values[0], node.values[-1]),)
        x = min(max(x, coords[0]), coords[-1])
    i = bisect.bisect_left(coords, x - _COORD_TOLERANCE)
    if i < len(coords) and abs(coords[i] - x) <= _COORD_TOLERANCE:
        value, exact, inner = _child_value(node.children[i], logq, rawq, names)
        return value, exact and not clamps, clamps + inner
    lo, hi = i - 1, i
    t = (x - coords[lo]) / (coords[hi] - coords[lo])
    v0, _, c0 = _child_value(node.children[lo], logq, rawq, names)
    v1, _, c1 = _child_value(node.children[hi], logq, rawq, names)
    return (1.0 - t) * v0 + t * v1, False, clamps + c0 + c1


def _child_value(child: GridNode | float, logq: tuple[float, ...], rawq: tuple[float, ...],
                 names: tuple[str, ...]) -> tuple[float, bool, tuple[Clamp, ...]]:
    if isinstance(child, GridNode):
        return _evaluate(child, logq[1:], rawq[1:], names[1:])
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


def shape_grid_key(shape: KernelShape) -> tuple[GridKey, tuple[float, ...]] | None:
    """(grid key, axis values) a shape is looked up under, or None if no table kind covers it."""
    if isinstance(shape, GemmShape):
        if shape.weight_dtype != shape.dtype or shape.m <= 0:
            return None
        return ("gemm", shape.dtype, shape.k, shape.n), (float(shape.m),)
    if isinstance(shape, GroupedGemmShape):
        if shape.weight_dtype != shape.dtype or shape.tokens_per_gpu <= 0 or shape.ep <= 0:
            return None
        key = ("grouped_gemm", shape.dtype, shape.stage, shape.projection, shape.num_experts, shape.topk,
               shape.hidden, shape.intermediate, shape.gated)
        return key, (float(shape.ep), float(shape.tokens_per_gpu))
    if isinstance(shape, AttentionShape):
        if shape.window > 0 or shape.batch <= 0 or shape.kv_len <= 0:
            return None
        kv_heads = 1 if shape.kind == "mla" else shape.num_kv_heads
        layout = (shape.kind, shape.dtype, shape.kv_dtype, shape.num_heads, kv_heads, shape.qk_head_dim,
                  shape.v_head_dim)
        if shape.stage == "decode":
            return ("attention", "decode") + layout + (shape.q_len,), (float(shape.batch), float(shape.kv_len))
        if shape.q_len != shape.kv_len:
            return None  # chunked prefill over a cached prefix: not what the prefill tables measured
        return ("attention", "prefill") + layout + (shape.causal,), (float(shape.kv_len),)
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
class Grid:
    key: GridKey
    efficiency: EfficiencyGrid
    table: str  # "<directory>/<file>" the points came from
    points: int


def grid_points(table_dir: TableDirectory) -> dict[GridKey, tuple[tuple[str, ...], str, list[tuple[tuple[float, ...], float, Row]]]]:
    """Every grid's points: key -> (axis names, table file(s), [(axis values, efficiency, row)])."""
    prov = table_dir.provenance
    grouped: dict[GridKey, tuple[tuple[str, ...], list[str], list[tuple[tuple[float, ...], float, Row]]]] = {}
    for name, rows in table_dir.tables.items():
        for row in rows:
            key, coords, axes = row_grid_key(row)
            eff = efficiency_of(row, prov.peak_flops[row.dtype])
            entry = grouped.setdefault(key, (axes, [], []))
            if name not in entry[1]:
                entry[1].append(name)
            entry[2].append((coords, eff, row))
    return {key: (axes, "+".join(files), pts) for key, (axes, files, pts) in grouped.items()}


class MfuTables:
    """Measured kernel tables of one device directory, indexed for cheap lookups."""

    def __init__(self, directory: Path, table_dir: TableDirectory) -> None:
        self.directory = Path(directory)
        self.provenance = table_dir.provenance
        self.grids: dict[GridKey, Grid] = {}
        label = self.directory.name
        for key, (axes, files, points) in grid_points(table_dir).items():
            grid = build_grid(axes, ((coords, eff) for coords, eff, _ in points))
            self.grids[key] = Grid(key, grid, f"{label}/{files}", len(points))
        self._cache: dict[tuple[KernelShape, float], TableHit | None] = {}

    def lookup(self, shape: KernelShape, peak_flops: float) -> TableHit | None:
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
        key, coords = found
        grid = self.grids.get(key)
        if grid is None:
            return None
        value = grid.efficiency.evaluate(coords)
        seconds = shape.flops / (peak_flops * value.efficiency)
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


def load_tables(directory: Path) -> MfuTables:
    """Load one device's table directory (refused without provenance.yaml) and index it."""
    directory = Path(directory)
    if directory.is_dir() and not (directory / PROVENANCE_FILE).is_file():
        nested = table_directories(directory)
        if nested:
            names = ", ".join(str(p.relative_to(directory)) for p in nested)
            raise InferSimError(f"{directory} holds several device table directories ({names}): "
                                f"name one of them")
    return MfuTables(directory, read_table_dir(directory))
