"""Beyond a table's range: when the last doubling's slope stands, and what prices the kernel if not.

A row is extended above its last point at its last doubling's time per unit of work
(infersim.tables.interpolation._extend_above): the shape of a kernel with a fixed cost plus a cost per
unit of work, which predicts the next points of a row best, and (benchmarks/mfu_extrapolation.py --far) goes on predicting points 4-32x beyond a
row's end best while the kernel stays in one regime. Where the shape turns from memory-bound (at
the row's last point, on the hardware card's roofline) to compute-bound (at the query), the slope
describes weight streaming, not the compute-bound kernel: an MoE grouped GEMM measured up to a few
hundred tokens per expert re-reads its weights there, and its slope says nothing of the GEMM at
thousands. If the table measured the kernel elsewhere on its grid (other EP sizes, other batches),
the kernel is then priced by the roofline anchored at the table: its streaming rate at the row's
last point (bytes / time) and the best FLOP efficiency the grid reaches, marked "edge". This holds
for the MoE grouped GEMMs, whose grids span EP sizes (the compute-bound kernel is measured at the
small EP sizes' token counts): on held-out points 4-32x beyond cuts from 256 up it cuts the p90
error of the aiconfigurator grouped-GEMM tables from 59-106% to 51-76% (medians 14-24% -> 19-24%).
Elsewhere the slope stays: grids of one row (a GEMM's m, a prefill's sequence) know nothing else
(anchored at the row's own efficiency they err 108-243% where they cross), and attention decode
crossings were measured worse anchored (median 24-53% against 20-28%).
"""

from __future__ import annotations

import dataclasses
from typing import Literal
from collections.abc import Callable

from infersim.shapes.kernels import GroupedGemmShape, KernelShape, TableHit
from infersim.tables.interpolation import EXTENDED_NOTE, Clamp, KernelGrid


# the shape field each extended work axis sets (prefill seq_len sets q_len and kv_len)
_WORK_FIELDS = {"m": ("m",), "tokens_per_gpu": ("tokens_per_gpu",), "batch": ("batch",), "kv_len": ("kv_len",),
                "seq_len": ("q_len", "kv_len")}


def edge_of(grid: KernelGrid, coords: tuple[float, ...], clamps: tuple[Clamp, ...],
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
    cast = {name: type(getattr(shape, name)) for name in fields}
    return dataclasses.replace(shape, **{name: cast[name](value) for name in fields})


def roofline_floor(shape: KernelShape, edge: KernelShape, hit: TableHit, roofline: Roofline,
                   peak_flops: float) -> TableHit:
    """An extended row's time, at least what the card's roofline allows: the table's time at its last
    point plus the bytes the query reads beyond it at the achievable HBM rate, and all of the query's
    tensor-core FLOPs at the fastest FLOP rate the card or the table shows. The last doubling's slope
    is the kernel's cost per unit of work between two measured times; where those points are short
    enough to be latency- rather than bandwidth-bound (a decode attention row of a large batch
    measured up to a few hundred cached tokens), that slope is shallower than streaming the extra KV
    cache allows, and where two measurements of a compute-bound kernel lie close together (an MoE
    grouped GEMM row whose last two points differ by run-to-run noise), it can be shallower than
    executing the FLOPs allows. The FLOPs bound the whole time, not the time added beyond the edge:
    they overlap the streaming (a GEMM bound by its weights at the edge computes twice the rows in
    about the same time). The FLOP rate is the highest of the card's achievable one, the kernel's own
    at the row's last point and the best its grid measured: the floor never asks the extension to
    run slower than the table shows the kernel can."""
    flops, card_compute, memory = roofline(shape)
    edge_flops = roofline(edge)[0]
    compute = max(card_compute, edge_flops / hit.edge_seconds, hit.best_efficiency * peak_flops)
    extra_bytes = shape.bytes - edge.bytes
    memory_floor = hit.edge_seconds + (extra_bytes / memory if extra_bytes > 0 else 0.0)
    compute_floor = flops / compute if flops > edge_flops else 0.0
    floor = max(memory_floor, compute_floor)
    if hit.seconds >= floor or not floor > hit.edge_seconds:
        return hit
    if memory_floor >= compute_floor:
        said = (f"at least the table's time at its last point plus the {extra_bytes / 1e6:,.3g} MB more it reads, "
                "at the card's achievable HBM rate")
    else:
        said = f"at least its {flops / 1e9:,.3g} GFLOP at the fastest FLOP rate the card or its table shows"
    return dataclasses.replace(hit, seconds=floor, note=f"{hit.note}; {said}")


#: (FLOPs the tensor cores execute, achievable FLOP/s, achievable bytes/s) of a shape on the
#: hardware card's roofline (infersim.costing.timing supplies it)
Roofline = Callable[[KernelShape], tuple[float, float, float]]


def regime(shape: KernelShape, roofline: Roofline) -> Literal["compute", "memory"]:
    """Which bound the card's roofline puts this shape under."""
    flops, compute, memory = roofline(shape)
    return "compute" if flops / compute >= shape.bytes / memory else "memory"


def beyond_range(shape: KernelShape, hit: TableHit, roofline: Roofline, peak_flops: float) -> TableHit:
    """Apply the beyond-range rule to an extrapolated hit of `shape` (see the section comment): the
    hit as it is, unless an MoE grouped GEMM crosses from its row's memory-bound last point into the
    compute regime in a grid of several rows; then the roofline anchored at the table, marked edge.
    Either way the extension cannot do its extra work faster than the card's roofline (roofline_floor)."""
    edge = with_work(shape, hit.edge_axis, hit.edge_value) if hit.edge_axis and hit.edge_seconds > 0 else None
    if edge is not None:
        hit = roofline_floor(shape, edge, hit, roofline, peak_flops)
    if not isinstance(shape, GroupedGemmShape) or not hit.best_efficiency > 0:
        return hit
    if edge is None or not edge.flops > 0:
        return hit
    if regime(edge, roofline) != "memory" or regime(shape, roofline) != "compute":
        return hit
    streaming = edge.bytes / hit.edge_seconds  # the table's streaming rate at the row's last point
    compute = hit.best_efficiency * peak_flops  # the best FLOP rate its grid measured
    seconds = max(shape.flops / compute, shape.bytes / streaming)
    note = (hit.note.replace(EXTENDED_NOTE, "")
            + f"; memory-bound at the table's last point, compute-bound here: roofline anchored at the table "
              f"(its streaming rate there, {streaming / 1e12:.3g} TB/s, and its best efficiency, "
              f"{hit.best_efficiency:.3f} of peak)")
    return TableHit(seconds, hit.table, "edge", shape.flops / (seconds * peak_flops), note)
