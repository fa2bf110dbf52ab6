"""Indexed kernel tables kept on disk between processes, as plain data.

Reading and indexing aiconfigurator's H100 tables takes 1.6 s. An indexed table set
(infersim.tables.lookup.MfuTables) is kept in the on-disk cache (infersim.base.diskcache) as one entry
of plain data, from which the next process rebuilds it (`TableParts`):

  index   one line of JSON: the entry's key; the provenance, as provenance.yaml's fields; the
          collective and elementwise series; each data type's fastest rates (in steps) for the hardware check;
          and where each grid, and the rows the full hardware check reads, lie in the blobs after it
  blobs   one JSON document per grid (its axes, peak, work limits, best efficiency, table, point
          count and the nested levels of its points), and one of the rows (in runs of one file each)

A run looks up a handful of a table set's grids (82 for the H20's, 2,145 for aiconfigurator's H100):
each grid is decoded when first asked for (`KeptGrids`; decoding all of the H20's would cost 5 ms),
the rows only for the full hardware check (`KeptRows`).

The key: this entry format, the package's version, a stamp of the code that shapes indexing
(`code_stamp`: a checksum of the name, size and modification time of every module in
infersim/tables/, infersim/shapes/ and infersim/base/, the folders of the table format and indexing,
the kernel shapes whose bytes the hardware check compares, and the units they count in: a folder's
new module counts without a list to keep up to date), the table directory as named and as resolved
(a table's name in messages is the directory as named), the interpolation, and each table file's
name, size and modification time. An edited table, a new build or a change to that code is a new
entry.

Checks: the entry's header and checksum (diskcache) before anything is decoded; the index's structure
and types before the table set is built (the provenance through the same validation as a
provenance.yaml); a grid's and the rows' when they are decoded. A grid or the rows failing them (an
entry with a valid checksum that this code did not write) make the table set index its files afresh
(`Reindex`) and delete the entry: a damaged entry costs time, never a wrong number.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

from infersim import __version__
from infersim.base import diskcache
from infersim.base.errors import InferSimError
from infersim.cards.schema import build
from infersim.tables.provenance import Provenance
from infersim.tables.grid_keys import GridKey
from infersim.tables.interpolation import (
    INTERPOLATIONS,
    GridNode,
    Interpolation,
    KernelGrid,
)

KIND = "tables"
ENTRY_FORMAT = 2
#: the package's folders whose code shapes what is kept (see the module docstring)
CODE_FOLDERS = ("tables", "shapes", "base")
#: interpolations a kept grid may name (one not registered here is not kept)
INTERPOLATIONS_BY_NAME = {interpolation.name: interpolation for interpolation in INTERPOLATIONS.values()}
_GRID_FAMILIES = ("gemm", "grouped_gemm", "attention")
_INDEX_FIELDS = frozenset({"key", "provenance", "collectives", "elementwise", "hbm_fastest", "grids", "rows"})
_GRID_FIELDS = frozenset({"table", "points", "routing_skew", "axes", "flops_per_second", "work_limits",
                          "best_efficiency", "root"})
#: what decoding a damaged or foreign entry raises
DAMAGE = (ValueError, TypeError, KeyError, IndexError, RecursionError, InferSimError)

HbmRow = tuple[str, float, float, str]  # (dtype, latency_us, minimum bytes moved, "file:line")
Series = dict[Any, tuple[list[tuple[float, float]], str]]


class TableParts(NamedTuple):
    """What an indexed table set is made of, as kept on disk (see MfuTables)."""

    provenance: Provenance
    grids: Mapping[GridKey, Any]  # grid key -> lookup.Grid (a KeptGrids where read back)
    collectives: Series  # (kind, ranks) -> ([(message bytes, seconds)], table)
    elementwise: Series  # (op, dtype) -> ([(bytes, seconds)], table)
    hbm_rows: Iterable[HbmRow]  # a KeptRows where read back
    hbm_fastest: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]


def code_stamp() -> str | None:
    """A checksum of the name, size and modification time of every module in CODE_FOLDERS (the test
    Python itself applies to know a module's bytecode stale; ~0.1 ms, where reading their ~300 KB
    would cost several times that in every process), or None where they cannot be listed."""
    import zlib

    package = Path(__file__).resolve().parent.parent
    found = []
    try:
        for folder in CODE_FOLDERS:
            with os.scandir(package / folder) as it:
                for entry in it:
                    if entry.name.endswith(".py"):
                        st = entry.stat()
                        found.append((folder, entry.name, st.st_size, st.st_mtime_ns))
    except OSError:
        return None
    data = repr(sorted(found)).encode()
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def cache_entry(directory: Path, interpolation: Interpolation,
                stamp: tuple[tuple[str, int, int], ...]) -> tuple[str, str] | None:
    """(entry name, key) of a table directory indexed with `interpolation`, or None where not kept
    (the cache off, an interpolation not registered, the code unreadable)."""
    if diskcache.cache_dir() is None or INTERPOLATIONS_BY_NAME.get(interpolation.name) is not interpolation:
        return None
    code = code_stamp()
    if code is None:
        return None
    key = repr((ENTRY_FORMAT, __version__, code, str(directory), str(directory.resolve()), interpolation.name, stamp))
    return diskcache.checksum_name(KIND, key), key


# ---------------------------------------------------------------------------------------------
# Writing


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _plain_node(node: GridNode) -> list[Any]:
    return [list(node.coords), list(node.values),
            [_plain_node(child) if isinstance(child, GridNode) else list(child) for child in node.children]]


def _plain_grid(grid: Any) -> dict[str, Any]:
    kernel_grid: KernelGrid = grid.kernel_grid
    return {"table": grid.table, "points": grid.points, "routing_skew": grid.routing_skew,
            "axes": list(kernel_grid.axes), "flops_per_second": kernel_grid.flops_per_second,
            "work_limits": list(kernel_grid.work_limits), "best_efficiency": kernel_grid.best_efficiency,
            "root": _plain_node(kernel_grid.root)}


def _grouped_rows(rows: Iterable[HbmRow]) -> list[list[Any]]:
    """The rows as runs of one file: [file part of `where`, [[dtype, latency_us, bytes, line part],
    ...]], in order (a table set's ~90,000 rows name a few dozen files; each row naming its file
    again would be most of the entry)."""
    runs: list[list[Any]] = []
    for dtype, latency_us, moved, where in rows:
        head, sep, tail = where.rpartition(":")
        prefix = head + sep
        line: int | str = int(tail) if tail.isdigit() and str(int(tail)) == tail else tail
        if not runs or runs[-1][0] != prefix:
            runs.append([prefix, []])
        runs[-1][1].append([dtype, latency_us, moved, line])
    return runs


def encode(key: str, parts: TableParts) -> bytes:
    """The entry's payload: the index line, then the blobs (module docstring)."""
    blobs, grids, offset = [], [], 0
    for grid_key, grid in parts.grids.items():
        blob = _dumps(_plain_grid(grid))
        grids.append([list(grid_key), offset, len(blob)])
        blobs.append(blob)
        offset += len(blob)
    rows = _dumps(_grouped_rows(parts.hbm_rows))
    index = {"key": key, "provenance": dataclasses.asdict(parts.provenance),
             "collectives": [[kind, ranks, points, table] for (kind, ranks), (points, table) in parts.collectives.items()],
             "elementwise": [[op, dtype, points, table] for (op, dtype), (points, table) in parts.elementwise.items()],
             "hbm_fastest": [[dtype, list(moved), list(fastest)] for dtype, (moved, fastest) in parts.hbm_fastest.items()],
             "grids": grids, "rows": [offset, len(rows)]}
    return _dumps(index) + b"\n" + b"".join(blobs) + rows


def keep(name: str, key: str, parts: TableParts) -> None:
    """Write `parts` as entry `name` under `key`; a failure only leaves the next process slower."""
    try:
        payload = encode(key, parts)
    except (TypeError, ValueError, RecursionError):  # something JSON cannot hold: not kept
        return
    diskcache.write_entry(name, KIND, payload)


# ---------------------------------------------------------------------------------------------
# Checking what is read


class Damaged(ValueError):
    """A kept entry's structure or types are not what `encode` writes."""


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise Damaged(what)


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    _check(isinstance(value, list) and (length is None or len(value) == length), what)
    return value


def _text(value: Any, what: str) -> str:
    _check(isinstance(value, str), what)
    return value


def _number(value: Any, what: str, finite: bool = True) -> float:
    _check(isinstance(value, (int, float)) and not isinstance(value, bool)
           and (math.isfinite(value) or not finite and not math.isnan(value)), what)
    return value


_NUMBER_TYPES = frozenset({int, float})
_KEY_ITEM_TYPES = frozenset({str, int, float, bool})


def _numbers(value: Any, what: str, finite: bool = True, length: int | None = None) -> tuple[float, ...]:
    """A list of numbers (finite, or at least not NaN), checked at C speed (thousands per table set)."""
    items = _list(value, what, length)
    _check(set(map(type, items)) <= _NUMBER_TYPES, what)
    _check(all(map(math.isfinite, items)) if finite else not any(map(math.isnan, items)), what)
    return tuple(items)


def _whole(value: Any, what: str) -> int:
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, what)
    return value


def _ascending(values: tuple[float, ...], what: str, strictly: bool = False) -> tuple[float, ...]:
    _check(all(a < b if strictly else a <= b for a, b in pairwise(values)), what)
    return values


def _points(value: Any, what: str) -> list[tuple[float, float]]:
    """A series' [(bytes, seconds)], at least one, ascending in bytes."""
    points = [(_number(b, what), _number(s, what)) for b, s in (_list(p, what, 2) for p in _list(value, what))]
    _check(bool(points), what)
    _ascending(tuple(b for b, _ in points), what)
    return points


def _series(value: Any, what: str, key_types: tuple[type, type]) -> Series:
    series = {}
    for item in _list(value, what):
        first, second, points, table = _list(item, what, 4)
        _check(isinstance(first, key_types[0]) and isinstance(second, key_types[1])
               and not isinstance(second, bool), what)
        series[(first, second)] = (_points(points, what), _text(table, what))
    return series


def _grid_key(value: Any) -> GridKey:
    items = _list(value, "grid key")
    _check(bool(items) and items[0] in _GRID_FAMILIES, "grid key family")
    _check(set(map(type, items)) <= _KEY_ITEM_TYPES, "grid key item")
    if items[0] == "gemm":
        _check(len(items) == 4 and all(isinstance(x, int) and not isinstance(x, bool) for x in items[2:]),
               "gemm grid key")
    return tuple(items)


def _span(value: Any, size: int) -> tuple[int, int]:
    start, length = (_whole(x, "blob span") for x in _list(value, "blob span", 2))
    _check(start + length <= size, "blob span")
    return start, start + length


def _hbm_fastest(value: Any) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    fastest = {}
    for item in _list(value, "fastest rows"):
        dtype, moved, rates = _list(item, "fastest rows", 3)
        moved = _numbers(moved, "bytes moved")
        rates = _numbers(rates, "rates", finite=False, length=len(moved))
        fastest[_text(dtype, "dtype")] = (_ascending(moved, "bytes moved"), rates)
    return fastest


def _node(value: Any, depth: int) -> GridNode:
    """A grid level (`depth` axes from here to the leaves), checked: ascending coordinates, one value
    and one child per coordinate, sub-levels down to (time or log efficiency, efficiency) leaves."""
    coords, values, children = _list(value, "grid level", 3)
    children = _list(children, "grid level")
    _check(isinstance(coords, list) and isinstance(values, list) and len(coords) == len(values) == len(children) > 0,
           "grid level sizes")
    if depth > 1:
        kids: tuple[GridNode | tuple[float, float], ...] = tuple(_node(child, depth - 1) for child in children)
    else:
        kids = tuple((_number(a, "grid leaf"), _number(b, "grid leaf"))
                     for a, b in (_list(child, "grid leaf", 2) for child in children))
    return GridNode(_ascending(_numbers(coords, "grid coordinates"), "grid coordinates", strictly=True),
                    _numbers(values, "axis values"), kids)


def decode_grid(key: GridKey, blob: bytes, interpolation_name: str, make_grid: Callable[..., Any]) -> Any:
    """The grid of `key` from its blob, checked (raises one of DAMAGE where it does not hold)."""
    data = json.loads(blob)
    _check(isinstance(data, dict) and set(data) == _GRID_FIELDS, "grid fields")
    axes = tuple(_text(axis, "axis") for axis in _list(data["axes"], "axes"))
    _check(0 < len(axes) <= 4, "axes")
    limits = tuple(None if x is None else _number(x, "work limit") for x in _list(data["work_limits"], "work limits"))
    _check(len(limits) in (0, len(axes)), "work limits")
    kernel_grid = KernelGrid(axes, _node(data["root"], len(axes)), INTERPOLATIONS_BY_NAME[interpolation_name],
                             _number(data["flops_per_second"], "peak"), limits,
                             _number(data["best_efficiency"], "best efficiency"))
    _check(kernel_grid.flops_per_second > 0, "peak")
    return make_grid(key, kernel_grid, _text(data["table"], "table"), _whole(data["points"], "points"),
                     _number(data["routing_skew"], "routing skew"))


def decode_rows(blob: bytes) -> tuple[HbmRow, ...]:
    """The rows the hardware check reads (as _grouped_rows keeps them), checked."""
    rows = []
    for run in _list(json.loads(blob), "rows"):
        prefix, items = _list(run, "run of rows", 2)
        prefix = _text(prefix, "file of rows")
        for dtype, latency, moved, line in (_list(row, "row", 4) for row in _list(items, "rows")):
            _check(isinstance(line, (int, str)) and not isinstance(line, bool), "line")
            rows.append((_text(dtype, "dtype"), _number(latency, "latency"), _number(moved, "bytes"),
                         prefix + str(line)))
    return tuple(rows)


# ---------------------------------------------------------------------------------------------
# Reading


class Reindex:
    """A kept table set's way back to its files, for a part found damaged when first decoded: the
    entry is deleted and the files indexed afresh, once (`index` gives their TableParts)."""

    def __init__(self, entry: str, index: Callable[[], TableParts]) -> None:
        self._entry = entry
        self._index = index
        self._parts: TableParts | None = None

    def parts(self) -> TableParts:
        if self._parts is None:
            diskcache.discard(self._entry)
            self._parts = self._index()
        return self._parts

    def __reduce__(self) -> tuple[type, tuple[str, Callable[[], TableParts]]]:
        return Reindex, (self._entry, self._index)


_UNSEEN = object()  # a key KeptGrids has not looked for yet


class KeptGrids(Mapping[GridKey, Any]):
    """Grids as kept on disk: each decoded (and checked) when first asked for."""

    def __init__(self, payload: bytes, spans: dict[GridKey, tuple[int, int]],
                 decode: Callable[[GridKey, bytes], Any], reindex: Reindex) -> None:
        self._payload = payload
        self._spans = spans
        self._decode = decode
        self._reindex = reindex
        self._grids: dict[GridKey, Any] = {}

    def __getitem__(self, key: GridKey) -> Any:
        grid = self.get(key)
        if grid is None:
            raise KeyError(key)
        return grid

    def get(self, key: GridKey, default: Any = None) -> Any:
        # a lookup of a kernel no table holds asks for a key that is not there: no KeyError raised
        # and caught for it (Mapping.get's way), which cost more than the lookup; and the answer is
        # kept, so that the next such lookup hashes the key once (a sweep asks again at every point)
        grid = self._grids.get(key, _UNSEEN)
        if grid is _UNSEEN:
            span = self._spans.get(key)
            grid = self._grids[key] = None if span is None else self._decoded(key, span)
        return default if grid is None else grid

    def _decoded(self, key: GridKey, span: tuple[int, int]) -> Any:
        try:
            return self._decode(key, self._payload[span[0]:span[1]])
        except DAMAGE:
            return self._reindex.parts().grids.get(key)

    def __iter__(self) -> Iterator[GridKey]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:  # to a sweep's worker processes: undecoded
        return KeptGrids, (self._payload, self._spans, self._decode, self._reindex)


class KeptRows:
    """The rows check_hardware checks, as kept on disk: decoded only for the full check (which a
    card passing on the rows' fastest rates skips: see MfuTables._may_beat_hbm)."""

    def __init__(self, payload: bytes, span: tuple[int, int], reindex: Reindex) -> None:
        self._payload = payload
        self._span = span
        self._reindex = reindex

    def __iter__(self) -> Iterator[HbmRow]:
        try:
            rows: Iterable[HbmRow] = decode_rows(self._payload[self._span[0]:self._span[1]])
        except DAMAGE:
            rows = self._reindex.parts().hbm_rows
        return iter(rows)


def _decode_index(payload: bytes, key: str) -> tuple[dict[str, Any], int] | None:
    """(the index, where the blobs start), or None for another key's entry (a shared name)."""
    end = payload.find(b"\n")
    _check(end > 0, "index line")
    index = json.loads(payload[:end])
    _check(isinstance(index, dict) and set(index) == _INDEX_FIELDS, "index fields")
    return (index, end + 1) if index["key"] == key else None


def read_kept(name: str, key: str, interpolation: Interpolation, make_grid: Callable[..., Any],
              index: Callable[[], TableParts]) -> TableParts | None:
    """The table set kept as entry `name` under `key`, or None (absent, another key's, or damaged:
    then deleted). `make_grid(key, kernel_grid, table, points, routing_skew)` builds a grid; `index`
    (picklable) indexes the files afresh, should a part be found damaged later."""
    payload = diskcache.read_entry(name, KIND)
    if payload is None:
        return None
    try:
        found = _decode_index(payload, key)
        if found is None:
            return None
        index_data, base = found
        size = len(payload) - base
        spans = {}
        for item in _list(index_data["grids"], "grids"):
            grid_key, start, length = _list(item, "grid", 3)
            checked = _grid_key(grid_key)
            _check(checked not in spans, "grid listed twice")
            begin, stop = _span([start, length], size)
            spans[checked] = (base + begin, base + stop)
        rows_begin, rows_stop = _span(index_data["rows"], size)
        parts = _parts(index_data, name)
    except DAMAGE:
        diskcache.discard(name)
        return None
    reindex = Reindex(name, index)
    decode = partial(decode_grid, interpolation_name=interpolation.name, make_grid=make_grid)
    return parts._replace(grids=KeptGrids(payload, spans, decode, reindex),
                          hbm_rows=KeptRows(payload, (base + rows_begin, base + rows_stop), reindex))


def _parts(index: dict[str, Any], name: str) -> TableParts:
    """The eagerly read parts of a checked index (grids and rows are filled in by read_kept)."""
    provenance = build(Provenance, index["provenance"], f"the cache entry {name}")
    return TableParts(provenance, {}, _series(index["collectives"], "collectives", (str, int)),
                      _series(index["elementwise"], "elementwise series", (str, str)), (),
                      _hbm_fastest(index["hbm_fastest"]))
