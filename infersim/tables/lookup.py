"""Kernel time from measured tables: the `KernelTables` the simulator core asks.

A table directory (mfu_tables/FORMAT.md) is read and indexed once (`load_tables`, kept on disk
between processes: infersim.tables.table_cache) into the table set `MfuTables`, whose `lookup` answers
a kernel shape with a time, its source and a note, or None where no table covers it:

  selection       which grid answers a shape: an exact match of its categorical key (infersim.tables.grid_keys)
  interpolation   the time within that grid, and above a row's last point (infersim.tables.interpolation)
  extrapolation   when the last doubling's slope stands beyond a table's range (infersim.tables.beyond_range,
                  applied by infersim.costing.timing, which knows the hardware card's roofline)
  series          collectives and eager elementwise kernels, by the bytes they move (infersim.tables.series)

A GEMM of a (K, N) the table did not measure is read between the four measured (K, N) around it,
bilinearly, where the table measured a full K x N grid (aiconfigurator's; `_gemm_planes`). Decode
attention with more KV heads per GPU than measured is the measured kernel of the same query-group size
with fewer KV heads at a proportionally larger batch (`_decode_attention_by_heads`); a query-group
size between two measured ones is read between them (`_decode_attention_between_groups`). Shapes no
table covers (another K/N, layout, dtype or window, chunked prefill, decode with several query tokens
unless measured so, fused memory-bound kernels) get None. Times scale from the table's peak FLOP/s
to the caller's: a table's efficiency carries over to another peak of the same GPU.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property, partial
from itertools import accumulate
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from collections.abc import Sequence

from infersim.cards.registry import display_path
from infersim.base.errors import ConfigError, InferSimError
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import AnyShape, AttentionShape, GemmShape, MemoryBoundShape, TableHit, minimum_bytes
from infersim.tables.provenance import PROVENANCE_FILE
from infersim.tables.grid_keys import (
    AttentionNeighbours,
    GridKey,
    attention_neighbours,
    decode_groups,
    decode_kv_heads,
    describe_key,
    row_grid_key,
    shape_grid_key,
    work_limits,
)
from infersim.tables.interpolation import (
    DEFAULT_INTERPOLATION,
    EXTENDED_NOTE,
    Interpolation,
    KernelGrid,
    build_grid,
)
from infersim.tables.series import collective_hit, collective_series, elementwise_hit, elementwise_series
from infersim.tables.table_cache import INTERPOLATIONS_BY_NAME, HbmRow, TableParts, cache_entry, keep, read_kept

if TYPE_CHECKING:  # the row types are defined where tables are indexed: a run from the on-disk cache has none
    from infersim.tables.format import Row, TableDirectory

#: share of the K x N product a GEMM table must measure to interpolate between (K, N) (see _gemm_planes)
PLANE_COVERAGE = 0.9


# ---------------------------------------------------------------------------------------------
# The table set


class _MeasuredGrid(NamedTuple):
    """A grid key's rows while a table set is read: what GridSource holds, its points as build_grid
    takes them, and the rows they came from where asked for."""

    axes: tuple[str, ...]
    tables: list[str]  # CSV file names the points come from, in order met
    peak_flops: float
    points: list[tuple[tuple[float, ...], float, float]]  # (axis values, seconds, efficiency)
    rows: list[Row]  # the points' rows (empty unless asked for: infersim.tables.grid_points)


def grids_and_hbm_rows(table_dir: TableDirectory, directory: Path | None = None, keep_rows: bool = False
              ) -> tuple[dict[GridKey, _MeasuredGrid], tuple[HbmRow, ...]]:
    """Every grid's measured points by grid key and, where `directory` is given, (dtype, latency_us,
    minimum bytes moved, "file:line") of every row check_hardware checks, in one pass over the rows
    (each row's kernel shape read once, for its efficiency and its bytes). The bytes are computed
    when the tables are indexed, and so kept in the on-disk cache with them: they do not depend on
    the hardware card, and computing them for each row was most of the check's ~10 ms in every
    process."""
    from infersim.tables.format import CollectiveRow, ElementwiseRow

    peaks = table_dir.provenance.peak_flops
    collected: dict[GridKey, _MeasuredGrid] = {}
    hbm: list[HbmRow] = []
    for name, rows in table_dir.tables.items():
        lines = table_dir.row_lines.get(name, ())
        table = str(directory / name) if directory is not None else ""
        for i, row in enumerate(rows):
            shape = row.kernel_shape
            if directory is not None:
                hbm.append((row.dtype, row.latency_us, minimum_bytes(shape),
                            f"{table}:{lines[i]}" if i < len(lines) else table))
            if isinstance(row, (CollectiveRow, ElementwiseRow)):
                continue  # no FLOPs, no efficiency: indexed by MfuTables (collective_series, elementwise_series)
            key, coords, axes = row_grid_key(row)
            grid = collected.get(key)
            peak = peaks[row.dtype]
            if grid is None:
                grid = collected[key] = _MeasuredGrid(axes, [name], peak, [], [])
            elif grid.tables[-1] != name and name not in grid.tables:
                grid.tables.append(name)
            seconds = row.latency_us * 1e-6
            # efficiency_of(row, peak), with the row's shape read once
            grid.points.append((coords, seconds, shape.flops / (seconds * peak)))
            if keep_rows:
                grid.rows.append(row)
    return collected, tuple(hbm)


def _routing_skew(table_dir: TableDirectory, files: Sequence[str]) -> float:
    """The power-law exponent of the routing a grid's grouped-GEMM rows were timed under (provenance
    moe_routing 'power_law_<alpha>'), 0 for balanced routing or other families."""
    for name in files:
        info = table_dir.provenance.tables.get(name)
        if info is not None and info.includes_imbalance and info.moe_routing.startswith("power_law_"):
            return float(info.moe_routing.removeprefix("power_law_"))
    return 0.0


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
        measured, hbm_rows = grids_and_hbm_rows(table_dir, self.directory)
        grids: dict[GridKey, Grid] = {}
        for key, grid in measured.items():
            kernel_grid = build_grid(grid.axes, grid.points, grid.peak_flops, interpolation, work_limits(key, grid.axes))
            grids[key] = Grid(key, kernel_grid, f"{label}/{'+'.join(grid.tables)}", len(grid.points),
                              _routing_skew(table_dir, grid.tables))
        self.grids: Mapping[GridKey, Grid] = grids  # a KeptGrids where read from the on-disk cache
        self._gemm_planes = _gemm_planes(self.grids)
        self._decode_kv_heads = decode_kv_heads(self.grids)
        self._decode_groups = decode_groups(self._decode_kv_heads)
        self._attention_neighbours: dict[GridKey, AttentionNeighbours] = {}  # kept per key asked (few layouts)
        self.collectives = collective_series(table_dir, label)
        self.elementwise = elementwise_series(table_dir, label)
        self._hbm_rows: Iterable[HbmRow] = hbm_rows
        self._hbm_fastest = _fastest_rows(self._hbm_rows)
        self._checked: set[tuple[str, float, float, tuple[tuple[str, float], ...]]] = set()

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
    def elementwise_latency(self) -> float | None:
        """Seconds the tables' elementwise rule adds per kernel, or None (the card's launch overhead)."""
        return self.provenance.elementwise_latency if self.elementwise_memory_efficiency is not None else None

    @property
    def moe_routing(self) -> tuple[str, ...]:
        """The routings the grouped-GEMM tables were timed under ('balanced', 'power_law_1.01', ...)."""
        return tuple(sorted({info.moe_routing for info in self.provenance.tables.values()
                             if info.family == "grouped_gemm"}))

    def check_hardware(self, hw: Any, source: str = "") -> None:
        """Refuse rows that, on the GPU of hardware card `hw`, would move their bytes faster than its
        HBM peak (a latency too small: a unit slip, a cached benchmark); each names file and line.
        Only tables measured on that GPU are checked (on another GPU, lookups are floored at the
        HBM bound instead: see infersim.costing.timing)."""
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
        themselves are decoded only for the full check, which names the failing row)."""
        for dtype, (moved, fastest) in self._hbm_fastest.items():
            peak = self.provenance.peak_flops.get(dtype)
            card_peak = hw.peak.flops.get(dtype)
            if not peak or not card_peak:
                continue
            first = bisect.bisect_right(moved, hw.peak.l2_bytes)  # the step of the first row beyond L2
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
            # a benchmark that repeats a kernel without flushing L2 can find up to L2's bytes of its
            # operands still there from the run before (aiconfigurator's GEMMs do: on an L40S a
            # 105 MB bf16 GEMM at 0.98 TB/s, on the RTX PRO 6000 138 MB at 1.82 TB/s, each above its
            # card's DRAM peak): only the bytes beyond L2 must have crossed HBM
            from_hbm = moved - hw.peak.l2_bytes
            if from_hbm > seconds * hw.peak.hbm_bandwidth:
                raise ConfigError(where, "latency_us", latency_us,
                                  f"moves {moved:.4g} bytes in {seconds * 1e6:.4g} us: at least {from_hbm:.4g} of "
                                  f"them beyond the {hw.peak.l2_bytes:.4g} bytes of L2 = "
                                  f"{from_hbm / seconds / 1e12:.4g} TB/s, more than the "
                                  f"{hw.peak.hbm_bandwidth / 1e12:.4g} TB/s HBM peak of hardware card {hw.name}"
                                  + (f" ({source})" if source else ""))

    def lookup(self, shape: AnyShape, peak_flops: float) -> TableHit | None:
        """Time of `shape` from the tables at the caller's peak FLOP/s, or None (see module doc).
        Not cached here: a caller that prices many steps keeps each kernel's cost in its PricingMemo."""
        if isinstance(shape, CollectiveShape):
            return collective_hit(self.collectives, shape)
        if isinstance(shape, MemoryBoundShape):
            return elementwise_hit(self.elementwise, shape) if shape.op else None
        found = shape_grid_key(shape)
        if found is None or not peak_flops > 0:
            return None
        key, coords, repeats = found
        grid = self.grids.get(key)
        if grid is None:
            if isinstance(shape, GemmShape):
                return self._gemm_between_planes(shape, peak_flops)
            if isinstance(shape, AttentionShape):
                return self._decode_attention_elsewhere(key, shape, peak_flops)
            return None
        value = grid.kernel_grid.evaluate(coords, shape.flops / repeats)
        # the table's efficiency carries over to the caller's peak: time scales with peak ratio
        seconds = repeats * value.seconds * grid.kernel_grid.flops_per_second / peak_flops
        if value.clamps:
            note = f"{describe_key(key)}: " + "; ".join(dict.fromkeys(c.describe() for c in value.clamps))
            if all(c.extrapolated for c in value.clamps):
                from infersim.tables.beyond_range import edge_of  # here: most lookups stay in range

                kernel_grid = grid.kernel_grid
                edge = edge_of(kernel_grid, coords, value.clamps, shape.flops / repeats)
                axis, top, edge_seconds = edge if edge else ("", 0.0, 0.0)
                return TableHit(seconds, grid.table, "extrapolated", value.efficiency,
                                note + EXTENDED_NOTE,
                                axis, top, repeats * edge_seconds * kernel_grid.flops_per_second / peak_flops,
                                kernel_grid.best_efficiency if len(kernel_grid.axes) > 1 else 0.0, grid.routing_skew)
            return TableHit(seconds, grid.table, "edge", value.efficiency,
                            note + f"; roofline at edge efficiency {value.efficiency:.3f}",
                            moe_routing_skew=grid.routing_skew)
        method: Literal["exact", "interpolated"] = "exact" if value.exact else "interpolated"
        return TableHit(seconds, grid.table, method, value.efficiency, moe_routing_skew=grid.routing_skew)

    def _decode_attention_elsewhere(self, key: GridKey, shape: AttentionShape, peak_flops: float) -> TableHit | None:
        """Decode attention of a layout (grid key `key`) no grid holds, from the grids of the same kernel
        with fewer KV heads, else of the query-group sizes around its own. Which of those grids the
        tables hold depends on the layout alone: found once per key (a sweep asks at every point)."""
        neighbours = self._attention_neighbours.get(key)
        if neighbours is None:
            neighbours = self._attention_neighbours[key] = attention_neighbours(
                shape, self.grids, self._decode_kv_heads, self._decode_groups)
        kv_heads, groups = neighbours
        return (self._decode_attention_by_heads(shape, peak_flops, kv_heads) if kv_heads else None) \
            or (self._decode_attention_between_groups(shape, peak_flops, groups) if groups else None)

    def _decode_attention_by_heads(self, shape: AttentionShape, peak_flops: float, kv_heads: int) -> TableHit | None:
        """Decode attention with more KV heads per GPU than the table measured (MHA: Llama-2's 32):
        the measured kernel of the same query-group size (heads per KV head) and head dims with
        `kv_heads` K' KV heads, K' dividing K, at batch x K / K' (the largest such K' with a grid:
        grid_keys.attention_neighbours). Paged decode attention (FlashAttention's split-KV kernel,
        FlashInfer's) splits its work into (sequence, KV head) items of one shape each, so both run
        the same items over the same bytes."""
        group = shape.num_heads // shape.num_kv_heads
        scale = shape.num_kv_heads // kv_heads
        inner = replace(shape, num_heads=group * kv_heads, num_kv_heads=kv_heads, batch=shape.batch * scale)
        hit = self.lookup(inner, peak_flops)
        if hit is None:
            return None
        note = (f"{shape.num_kv_heads} KV heads beyond the table's: its {kv_heads}-KV-head kernel at batch "
                f"{inner.batch} (the same (sequence, KV head) work items)" + (f"; {hit.note}" if hit.note else ""))
        return replace(hit, note=note, efficiency=shape.flops / (hit.seconds * peak_flops))

    def _decode_attention_between_groups(self, shape: AttentionShape, peak_flops: float,
                                         groups: tuple[int, int]) -> TableHit | None:
        """Decode attention of a query-group size (query heads per KV head) the table did not measure,
        between two it did (Qwen2.5-7B's 28 of 4: 7, between 6 and 8): the kernels of the two
        neighbouring sizes with the same KV heads, batch and context, linear in the group size.
        FlashAttention's decode packs a KV head's query heads into the rows of one tile (PackGQA),
        so each (sequence, KV head) item streams the same KV bytes whatever the group: the measured
        times barely move with it (vLLM's H100 table at 4 KV heads, batch 10, 1,750 tokens: 20.9,
        22.5, 21.1, 20.9 us for groups 4, 5, 6, 8). Only in range: both neighbours answered the same
        way, exactly or interpolated (an extended or edge answer is the roofline's business). `groups`:
        the measured sizes below and above (grid_keys.attention_neighbours)."""
        group = shape.num_heads // shape.num_kv_heads
        low, high = groups
        below = self.lookup(replace(shape, num_heads=low * shape.num_kv_heads), peak_flops)
        above = self.lookup(replace(shape, num_heads=high * shape.num_kv_heads), peak_flops)
        if below is None or above is None or {below.method, above.method} - {"exact", "interpolated"}:
            return None
        share = (group - low) / (high - low)
        seconds = below.seconds + share * (above.seconds - below.seconds)
        note = (f"{group} query heads per KV head between the table's {low} and {high}: their kernels at "
                f"{below.seconds * 1e6:.3g} and {above.seconds * 1e6:.3g} us, linear in the group size")
        return TableHit(seconds, below.table, "interpolated", shape.flops / (seconds * peak_flops), note)

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
                found = shape_grid_key(corner)
                if found is None or found[0] not in self.grids:
                    return None  # a (K, N) the plane lacks: a corner is measured or there is no answer (no recursion)
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

    def parts(self) -> TableParts:
        """What the table set is made of, as kept on disk (infersim.tables.table_cache)."""
        return TableParts(self.provenance, self.grids, self.collectives, self.elementwise, self._hbm_rows,
                          self._hbm_fastest)

    @classmethod
    def from_parts(cls, directory: Path, interpolation: Interpolation, parts: TableParts) -> MfuTables:
        """The table set of `directory` rebuilt from its parts (as read back from the on-disk cache)."""
        tables = cls.__new__(cls)
        tables.directory = Path(directory)
        tables.provenance = parts.provenance
        tables.interpolation = interpolation
        tables.grids = parts.grids
        tables._gemm_planes = _gemm_planes(tables.grids)
        tables._decode_kv_heads = decode_kv_heads(tables.grids)
        tables._decode_groups = decode_groups(tables._decode_kv_heads)
        tables._attention_neighbours = {}
        tables.collectives = parts.collectives
        tables.elementwise = parts.elementwise
        tables._hbm_rows = parts.hbm_rows
        tables._hbm_fastest = parts.hbm_fastest
        tables._checked = set()
        return tables

    def describe(self) -> str:
        prov = self.provenance
        families: dict[str, int] = {}
        for key in self.grids:
            family = str(key[0]) if key[0] != "attention" else f"attention {key[1]}"
            families[family] = families.get(family, 0) + 1
        kinds = ", ".join(f"{n} {f}" for f, n in sorted(families.items()))
        origin: str = prov.origin
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
            latency = "" if self.elementwise_latency is None else f" + {self.elementwise_latency * 1e6:g} us each"
            elementwise = (f"; elementwise kernels at {prov.elementwise_memory_efficiency:.2f} of HBM bandwidth"
                           f"{latency} ({source})")
        return (f"{display_path(self.directory)} ({prov.device.name}, {origin}{engine}, measured {prov.measured_on}; "
                f"{len(self.grids)} grids: {kinds}{collectives}{routing}{elementwise})")


def _fastest_rows(rows: Iterable[tuple[str, float, float, str]]
                  ) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """dtype -> (bytes, rates) for check_hardware: over the rows by bytes moved, the most bytes per us of the rows
    from each on, in its few dozen steps (rates[i] up to the step's last row, which moves bytes[i])."""
    by_dtype: dict[str, list[tuple[float, float]]] = {}
    for dtype, latency_us, moved, _where in rows:
        rate = moved / latency_us if latency_us > 0 else math.inf  # inf: always fully checked
        by_dtype.setdefault(dtype, []).append((moved, rate))
    fastest_rows = {}
    for dtype, pairs in by_dtype.items():
        # by bytes, then rate: two sorts by one float each, which cost less than one by the pair
        pairs.sort(key=itemgetter(1))
        pairs.sort(key=itemgetter(0))
        fastest = list(accumulate([rate for _, rate in reversed(pairs)], max, initial=-math.inf))[1:]
        fastest.reverse()
        steps = [i for i, rate in enumerate(fastest) if i == len(fastest) - 1 or fastest[i + 1] != rate]
        fastest_rows[dtype] = (tuple([pairs[i][0] for i in steps]), tuple([fastest[i] for i in steps]))
    return fastest_rows


def _gemm_planes(grids: Mapping[GridKey, Grid]) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
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
    cache = cache_entry(directory, interpolation, stamp) if stamp else None
    kept = read_kept(*cache, interpolation, Grid, partial(_indexed_parts, directory, interpolation.name)) if cache else None
    if kept is not None:
        tables = MfuTables.from_parts(directory, interpolation, kept)
    else:
        tables = _load_tables(directory, interpolation)
        if cache:
            keep(*cache, tables.parts())
    if stamp:
        _LOADED[key] = tables
    return tables


def _indexed_parts(directory: Path, interpolation_name: str) -> TableParts:
    """The parts of a table directory indexed afresh (a kept table set's part found damaged)."""
    return _load_tables(directory, INTERPOLATIONS_BY_NAME[interpolation_name]).parts()


def _load_tables(directory: Path, interpolation: Interpolation) -> MfuTables:
    # here: a run whose tables come from the on-disk cache (table_cache) reads no CSV
    from infersim.tables.table_files import read_table_dir, table_directories

    if directory.is_dir() and not (directory / PROVENANCE_FILE).is_file():
        nested = table_directories(directory)
        if nested:
            names = ", ".join(str(p.relative_to(directory)) for p in nested)
            raise InferSimError(f"{directory} holds several device table directories ({names}): "
                                f"name one of them")
    return MfuTables(directory, read_table_dir(directory), interpolation)
