"""Compare two kernel-table directories row by row: find the slices that disagree with the rest.

Two devices that share a GPU die (B200 and GB200), or two measurements of one device, should time
the same kernel alike up to one device-wide factor (clocks, power limit, software version). A slice
of a table whose times differ from the other directory's by much more than that factor is an
outlier in one of the two: a prediction that rests on it inherits the error. This module finds such
slices; it changes nothing (the tables are kept as measured).

For every CSV file name present in both directories, rows of identical shape (every column but the
measured ones: latency_us, the efficiency derived from it, the published source_mfu) are matched
and their ratio latency_b / latency_a taken. A **slice** is one measured sweep: the row's grid key
(the layout the lookup interpolates within, `lookup.row_grid_key`) plus the values of every grid axis
but the innermost one, so a grouped GEMM's slice is one expert configuration at one EP size swept
over tokens, a decode attention's one head layout at one batch swept over KV length. Slicing finer
than the grid key keeps an outlier at one EP size from being averaged away by the others of its grid
(the bundled B200/GB200 DeepSeek MoE rows are 1.8x apart at EP 1, 4, 8 and 16 but agree at EP 2 and
32-128). A slice is flagged when its median ratio differs from its file's median ratio by more than
the factor `threshold`, in either direction.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Hashable

from infersim.cards.registry import display_path
from infersim.base.errors import InferSimError
from infersim.tables.format import PROVENANCE_FILE, CollectiveRow, ElementwiseRow, Row, TableDirectory
from infersim.tables.table_files import read_table_dir
from infersim.tables.grid_keys import describe_key, row_grid_key
from infersim.base.stats import percentile

#: row fields that are measurements, not shape: never part of the matching key (`efficiency` is not
#: a row field; it is derived from latency_us on load)
MEASURED_FIELDS: frozenset[str] = frozenset({"latency_us", "source_mfu"})
#: default factor by which a slice's median ratio may differ from its file's before it is flagged:
#: the same die under another clock, power limit or driver differs by a few percent, a bad slice by 1.5x+
DEFAULT_THRESHOLD = 1.25

SliceKey = tuple[Hashable, ...]


@dataclass(frozen=True)
class RatioSummary:
    """Distribution of latency_b / latency_a over a set of matched rows (dimensionless)."""

    rows: int
    median: float
    p10: float
    p90: float
    minimum: float
    maximum: float


@dataclass(frozen=True)
class SliceComparison:
    """One flagged slice: a measured sweep whose ratio stands apart from its file's."""

    description: str  # the layout, as the lookup names it, plus the fixed outer axis values
    sweep_axis: str  # the axis its rows run over (tokens_per_gpu, m, kv_len, ...)
    sweep_low: float
    sweep_high: float
    ratios: RatioSummary
    deviation: float  # slice median ratio / file median ratio


@dataclass(frozen=True)
class FileComparison:
    """One CSV present in both directories."""

    name: str
    family: str
    rows_a: int
    rows_b: int
    ratios: RatioSummary | None  # None: no row of identical shape in both
    slices: int  # slices with at least one matched row
    flagged: tuple[SliceComparison, ...]  # furthest from the file's median first
    note: str = ""  # what differs between the two files beyond the kernel (e.g. the MoE routing they were timed under)

    @property
    def matched_rows(self) -> int:
        return self.ratios.rows if self.ratios else 0


@dataclass(frozen=True)
class TableComparison:
    """Everything `infersim mfu compare DIR_A DIR_B` reports. Ratios are latency_b / latency_a."""

    dir_a: str
    dir_b: str
    device_a: str
    device_b: str
    threshold: float
    files: tuple[FileComparison, ...]
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    ratios: RatioSummary | None  # over every matched row of every shared file

    @property
    def flagged(self) -> tuple[tuple[str, SliceComparison], ...]:
        """(file name, slice) of every flagged slice, in file order."""
        return tuple((f.name, s) for f in self.files for s in f.flagged)


def summarise(ratios: list[float]) -> RatioSummary:
    ordered = sorted(ratios)
    return RatioSummary(rows=len(ordered), median=statistics.median(ordered), p10=percentile(ordered, 10),
                        p90=percentile(ordered, 90), minimum=ordered[0], maximum=ordered[-1])


def shape_of(row: Row) -> tuple[Hashable, ...]:
    """The row's identity for matching: its type and every field but the measured ones."""
    return (type(row).__name__,) + tuple(getattr(row, f.name) for f in dataclasses.fields(row)
                                         if f.name not in MEASURED_FIELDS)


def slice_of(row: Row) -> tuple[SliceKey, str, str, float]:
    """(slice key, description, sweep axis, sweep value) of a row: see the module docstring."""
    if isinstance(row, ElementwiseRow):
        return ("elementwise", row.op, row.dtype), f"elementwise {row.op} {row.dtype}", "bytes", float(row.bytes)
    if isinstance(row, CollectiveRow):
        # collectives have no grid key (no FLOPs); their lookup series is (kind, ranks) over message size
        key: SliceKey = ("collective", row.kind, row.library, row.dtype, row.ranks)
        return key, f"{row.kind} {row.library} {row.dtype} ranks={row.ranks}", "message_bytes", float(row.message_bytes)
    try:
        grid_key, coords, axes = row_grid_key(row)
    except ValueError:  # a prefill row of several sequences: the lookup indexes none, so no sweep to join
        return ("not indexed", type(row).__name__), "rows the lookup does not index", "row", 0.0
    outer = tuple(zip(axes[:-1], coords[:-1]))
    description = " ".join([describe_key(grid_key)] + [f"{axis}={value:g}" for axis, value in outer])
    return grid_key + tuple(value for _axis, value in outer), description, axes[-1], coords[-1]


def matched_ratios(rows_a: tuple[Row, ...], rows_b: tuple[Row, ...]) -> list[tuple[Row, float]]:
    """(row of B, latency_b / latency_a) for every shape in both. A shape measured twice in one
    file keeps its first row."""
    latency_a: dict[tuple[Hashable, ...], float] = {}
    for row in rows_a:
        latency_a.setdefault(shape_of(row), row.latency_us)
    matched: list[tuple[Row, float]] = []
    seen: set[tuple[Hashable, ...]] = set()
    for row in rows_b:
        shape = shape_of(row)
        if shape in latency_a and shape not in seen:
            seen.add(shape)
            matched.append((row, row.latency_us / latency_a[shape]))
    return matched


def _compare_file(name: str, family: str, rows_a: tuple[Row, ...], rows_b: tuple[Row, ...],
                  matched: list[tuple[Row, float]], threshold: float, note: str = "") -> FileComparison:
    if not matched:
        return FileComparison(name, family, len(rows_a), len(rows_b), None, 0, (), note)
    file_ratios = summarise([ratio for _row, ratio in matched])
    groups: dict[SliceKey, tuple[str, str, list[float], list[float]]] = {}
    for row, ratio in matched:
        key, description, axis, value = slice_of(row)
        entry = groups.setdefault(key, (description, axis, [], []))
        entry[2].append(ratio)
        entry[3].append(value)
    flagged = []
    for description, axis, ratios, values in groups.values():
        summary = summarise(ratios)
        deviation = summary.median / file_ratios.median
        if deviation > threshold or deviation < 1.0 / threshold:
            flagged.append(SliceComparison(description, axis, min(values), max(values), summary, deviation))
    flagged.sort(key=lambda s: (-abs(math.log(s.deviation)), s.description))
    return FileComparison(name, family, len(rows_a), len(rows_b), file_ratios, len(groups), tuple(flagged), note)


def _read(directory: Path, argument: str) -> TableDirectory:
    shown = display_path(directory)  # a bundled set as mfu_tables/..., the same on every machine
    if not directory.is_dir():
        problem = "not a directory" if directory.exists() else "no such directory"
        raise InferSimError(f"{argument} {shown}: {problem}")
    if not (directory / PROVENANCE_FILE).is_file():
        raise InferSimError(f"{argument} {shown}: not a kernel table directory (no {PROVENANCE_FILE}; "
                            "see mfu_tables/FORMAT.md)")
    return read_table_dir(directory)


def compare_tables(dir_a: Path, dir_b: Path, threshold: float = DEFAULT_THRESHOLD) -> TableComparison:
    """Compare the tables of `dir_b` with those of `dir_a`: ratio = latency_b / latency_a for rows of
    identical shape, per shared file, and the slices whose median ratio differs from their file's
    by more than the factor `threshold` (> 1)."""
    if not (math.isfinite(threshold) and threshold > 1.0):
        raise InferSimError(f"threshold {threshold!r}: must be a finite factor > 1 (e.g. 1.25: flag slices "
                            "more than 25% above or below their file's median ratio)")
    table_a, table_b = _read(Path(dir_a), "DIR_A"), _read(Path(dir_b), "DIR_B")
    # a gzip-compressed file holds the same table as its plain namesake: pairs are made by the CSV name
    by_stem_a, by_stem_b = _by_csv_name(table_a), _by_csv_name(table_b)
    names_a, names_b = set(by_stem_a), set(by_stem_b)
    files = []
    all_ratios: list[float] = []
    for name in sorted(names_a & names_b):
        file_a, file_b = by_stem_a[name], by_stem_b[name]
        family_a = table_a.provenance.tables[file_a].family
        family_b = table_b.provenance.tables[file_b].family
        if family_a != family_b:
            raise InferSimError(f"{name}: a {family_a} table in DIR_A {dir_a} but a {family_b} table in "
                                f"DIR_B {dir_b}; files of one name must hold the same kernel family")
        matched = matched_ratios(table_a.tables[file_a], table_b.tables[file_b])
        all_ratios += [ratio for _row, ratio in matched]
        shown = file_a if file_a == file_b else name
        files.append(_compare_file(shown, family_a, table_a.tables[file_a], table_b.tables[file_b], matched,
                                   threshold, _routing_note(table_a, file_a, table_b, file_b)))
    # a file name is only organisation (every row names its key columns): files without a namesake are
    # paired with the other directory's files of the same family wherever rows of identical shape match
    # (a measured grouped_gemm_bf16.csv against an imported grouped_gemm_bf16_power_law_1.2.csv)
    paired_a: set[str] = set()
    paired_b: set[str] = set()
    for name_a in sorted(names_a - names_b):
        file_a = by_stem_a[name_a]
        family = table_a.provenance.tables[file_a].family
        for name_b in sorted(names_b - names_a):
            file_b = by_stem_b[name_b]
            if table_b.provenance.tables[file_b].family != family:
                continue
            matched = matched_ratios(table_a.tables[file_a], table_b.tables[file_b])
            if not matched:
                continue
            paired_a.add(name_a)
            paired_b.add(name_b)
            all_ratios += [ratio for _row, ratio in matched]
            files.append(_compare_file(f"{name_a} ~ {name_b}", family, table_a.tables[file_a],
                                       table_b.tables[file_b], matched, threshold,
                                       _routing_note(table_a, file_a, table_b, file_b)))
    return TableComparison(
        dir_a=str(dir_a), dir_b=str(dir_b), device_a=table_a.provenance.device.name,
        device_b=table_b.provenance.device.name, threshold=threshold, files=tuple(files),
        only_in_a=tuple(sorted(names_a - names_b - paired_a)), only_in_b=tuple(sorted(names_b - names_a - paired_b)),
        ratios=summarise(all_ratios) if all_ratios else None)


def _by_csv_name(table: TableDirectory) -> dict[str, str]:
    """Each file of the directory by its CSV name (gemm_bf16.csv for gemm_bf16.csv.gz)."""
    return {name.removesuffix(".gz"): name for name in table.tables}


def _routing_note(table_a: TableDirectory, name_a: str, table_b: TableDirectory, name_b: str) -> str:
    """For grouped-GEMM files timed under different MoE routings: say so (the ratio then holds the
    expert-load imbalance of the skewed one, not only the kernels' speed)."""
    info_a, info_b = table_a.provenance.tables[name_a], table_b.provenance.tables[name_b]
    if info_a.family != "grouped_gemm" or info_a.moe_routing == info_b.moe_routing:
        return ""
    return (f"routing differs: A {info_a.moe_routing}, B {info_b.moe_routing} (a skewed routing's time includes "
            f"the most loaded rank's expert-load imbalance)")


def comparison_dict(comparison: TableComparison) -> dict[str, Any]:
    """The comparison as plain data (the JSON output): the same numbers the text report shows."""
    return {
        "ratio": "latency in B / latency in A for identical shapes (dimensionless)",
        **dataclasses.asdict(comparison),
        "files": [{**dataclasses.asdict(f), "matched_rows": f.matched_rows} for f in comparison.files],
    }
