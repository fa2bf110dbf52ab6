"""Kernels timed by the bytes they move: collectives by (kind, ranks) and eager elementwise kernels
by (op, dtype), each a series of (bytes, seconds) points read piecewise linearly.

Collectives: inside one node, NCCL-style, by kind and ranks, piecewise linear in the message bytes
(a latency plus bytes over a bandwidth on each segment); below the smallest message the smallest
message's time (the latency floor), above the largest the largest message's time scaled by bytes
(bandwidth-bound), marked edge. Across nodes, or not NCCL-style (DeepEP): no answer.

Elementwise kernels (one eager PyTorch kernel each, `MemoryBoundShape.op`): by (op, dtype), piecewise
linear in the bytes the op moves; below the smallest measured size the smallest size's time (a
kernel is not faster than its launch-bound floor), above the largest extended at the last interval's
time per byte (marked extrapolated).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from infersim.base.errors import InferSimError
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import MemoryBoundShape, TableHit

if TYPE_CHECKING:  # rows are read where tables are indexed, not where they are looked up
    from infersim.tables.format import TableDirectory

#: (kind, ranks) -> ([(message bytes, seconds)] ascending, table name)
CollectiveSeries = dict[tuple[str, int], tuple[list[tuple[float, float]], str]]
#: (op, dtype) -> ([(bytes, seconds)] ascending, table name)
ElementwiseSeries = dict[tuple[str, str], tuple[list[tuple[float, float]], str]]


def collective_series(table_dir: TableDirectory, label: str) -> CollectiveSeries:
    """(kind, ranks) -> ([(message bytes, seconds)] ascending, table name); repeats averaged. One
    library per (kind, ranks): a directory holding two (e.g. NCCL and an engine's custom all-reduce
    for the same kind) is refused, as the lookup could not say which the engine runs."""
    from infersim.tables.format import CollectiveRow

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


def elementwise_series(table_dir: TableDirectory, label: str) -> ElementwiseSeries:
    """(op, dtype) -> ([(bytes, seconds)] ascending, table name); repeats averaged."""
    from infersim.tables.format import ElementwiseRow

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


def collective_hit(series: CollectiveSeries, shape: CollectiveShape) -> TableHit | None:
    """A collective inside one node, by kind and ranks, piecewise linear in the message bytes
    (a latency plus bytes over a bandwidth on each segment). Below the smallest message: the
    smallest message's time (the latency floor). Above the largest: the largest message's time
    scaled by bytes (bandwidth-bound), marked edge. Across nodes, or not NCCL-style (DeepEP): None."""
    if shape.nodes != 1 or shape.implementation != "nccl" or shape.ranks <= 1:
        return None
    found = series.get((shape.kind, shape.ranks))
    if found is None:
        return None
    points, table = found
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


def elementwise_hit(series: ElementwiseSeries, shape: MemoryBoundShape) -> TableHit | None:
    """One eager kernel by (op, dtype), piecewise linear in its bytes (module docstring)."""
    found = series.get((shape.op, shape.dtype))
    if found is None:
        return None
    points, table = found
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
