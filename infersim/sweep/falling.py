"""Why a sweep's TPOT falls where the batch grows.

On one layout a larger decode batch never runs fewer kernels, yet its step can be priced faster: a
measured kernel table times some shapes faster than smaller ones (the library picks another kernel
or tiling at another size, and the table holds what it measured), and a CUDA-graph step computes its
batch padded up to a captured size, so the next batch may be priced at a size the table times
better. A sweep says where this happens and, for the largest such fall, which operation makes it and
where its two times come from, so that a reader need not take it for a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infersim.base.errors import InferSimError
from infersim.base.texttable import counted
from infersim.base.units import MS
from infersim.sweep.analysis import layout_key
from infersim.sweep.evaluate import Row, SweepSpec, row_config
from infersim.sweep.variants import problem_text

#: a fall smaller than this share of the TPOT is rounding, not a fall
MIN_FALL = 1e-9


def falling_pairs(spec: SweepSpec, rows: Sequence[Row]) -> list[tuple[Row, Row]]:
    """(smaller batch, next larger batch) on one layout, both fitting, whose TPOT is lower at the
    larger batch."""
    by_layout: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        if row.ok and row.fits and row.tpot_s > 0:
            by_layout.setdefault(layout_key(spec, row), []).append(row)
    pairs = []
    for group in by_layout.values():
        group.sort(key=lambda r: r.batch)
        for low, high in zip(group, group[1:]):
            if high.batch > low.batch and high.tpot_s < low.tpot_s * (1 - MIN_FALL):
                pairs.append((low, high))
    return pairs


def _decode_operations(spec: SweepSpec, row: Row) -> tuple[dict[tuple[str, str], Any], int]:
    """The decode step's operations of a row's configuration, by (group, name), and the batch its
    CUDA graph computes (0: not padded)."""
    from infersim.run.simulate import simulate

    decode = simulate(row_config(spec, row)).decode
    return {(op.group, op.name): op for op in decode.operations}, decode.padded_batch


def _computed(row: Row, padded: int) -> str:
    return f"batch {row.batch:,}" + (f" (computed as {padded:,}, a captured CUDA-graph size)" if padded else "")


def falling_tpot_note(spec: SweepSpec, rows: Sequence[Row]) -> str:
    """Where TPOT falls as the batch grows on one layout, and the operation behind the largest fall
    ('' where it never does)."""
    pairs = falling_pairs(spec, rows)
    if not pairs:
        return ""
    low, high = max(pairs, key=lambda p: (p[0].tpot_s - p[1].tpot_s) / p[0].tpot_s)
    places = counted(len(pairs), 'place')
    fall = (f"TPOT falls as the batch grows at {places} (on one layout, from one batch to the next); the largest: "
            f"{low.tpot_s / MS:,.2f} ms at batch {low.batch:,}, {high.tpot_s / MS:,.2f} ms at {high.batch:,}")
    try:
        before, low_padded = _decode_operations(spec, low)
        after, high_padded = _decode_operations(spec, high)
    except InferSimError as exc:  # the rows were simulated: a plain run of them should not fail
        return f"{fall} (not explained: {problem_text(exc)})"
    shared = [key for key in before if key in after]
    key = min(shared, key=lambda k: after[k].time_s - before[k].time_s)
    op_low, op_high = before[key], after[key]
    return (f"{fall}, mostly {key[1]} ({key[0]}): {op_low.time_s / MS:,.3f} ms per step at {_computed(low, low_padded)}, "
            f"{op_low.detail or op_low.source.value}; {op_high.time_s / MS:,.3f} ms at "
            f"{_computed(high, high_padded)}, {op_high.detail or op_high.source.value} (measured times need not "
            "grow with the size: the library picks another kernel or tiling at another size)")
