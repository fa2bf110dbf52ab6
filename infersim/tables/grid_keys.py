"""Which grid answers a kernel: the categorical key and axis values of a table row and of a shape.

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
window (a full prefill's s(s+1)/2). Prefill for batch > 1 runs `batch` sequences: `batch` times
the one-sequence time (the shape's `repeats`).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from infersim.shapes.kernels import AnyShape, AttentionShape, GemmShape, GroupedGemmShape
if TYPE_CHECKING:  # rows are read where tables are indexed (row_grid_key), not where they are looked up
    from infersim.tables.format import Row

GridKey = tuple[Hashable, ...]



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
    from infersim.tables.format import AttentionRow, GemmRow, GroupedGemmRow

    if isinstance(row, GemmRow):
        return ("gemm", row.dtype, row.k, row.n), (float(row.m),), GEMM_AXES
    if isinstance(row, GroupedGemmRow):
        key: GridKey = ("grouped_gemm", row.dtype, row.stored_weight_dtype, row.stage, row.projection, row.num_experts,
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


def shape_grid_key(shape: AnyShape) -> tuple[GridKey, tuple[float, ...], int] | None:
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
        key: GridKey = ("grouped_gemm", shape.dtype, shape.weight_dtype, shape.stage, shape.projection, shape.num_experts,
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
        window = cast(int, key[-1])
        return tuple(float(window) if axis == "kv_len" else None for axis in axes)
    return (None,) * len(axes)


def decode_kv_heads(grids: Iterable[GridKey]) -> dict[tuple[Any, ...], frozenset[float]]:
    """(kind, dtype, KV dtype, query heads per KV head, qk dim, v dim, q_len, window) -> the KV-head
    counts measured in decode attention grids of that layout: the grids a lookup of more KV heads
    than measured may answer from (infersim.tables.lookup), found without building a shape per
    candidate count."""
    counts: dict[tuple[Any, ...], set[float]] = {}
    for key in grids:
        if key[0] != "attention" or key[1] != "decode" or len(key) != 11:  # row_grid_key's decode layout
            continue
        _, _, kind, dtype, kv_dtype, heads, kv_heads, qk, v, q_len, window = key
        if isinstance(heads, (int, float)) and isinstance(kv_heads, (int, float)) and kv_heads > 0 \
                and heads % kv_heads == 0:
            counts.setdefault((kind, dtype, kv_dtype, heads // kv_heads, qk, v, q_len, window), set()).add(kv_heads)
    return {layout: frozenset(measured) for layout, measured in counts.items()}


def decode_groups(kv_heads: Mapping[tuple[Any, ...], frozenset[float]]) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """(kind, dtype, KV dtype, qk dim, v dim, q_len, window) -> the query-group sizes measured in
    decode attention grids of that layout, ascending (from decode_kv_heads' index)."""
    groups: dict[tuple[Any, ...], set[int]] = {}
    for kind, dtype, kv_dtype, group, qk, v, q_len, window in kv_heads:
        groups.setdefault((kind, dtype, kv_dtype, qk, v, q_len, window), set()).add(int(group))
    return {layout: tuple(sorted(measured)) for layout, measured in groups.items()}


#: for a decode attention layout no grid holds: (the KV heads of the grid that answers it with fewer KV
#: heads, 0: none; the measured query-group sizes just below and above its own, None: none)
AttentionNeighbours = tuple[int, tuple[int, int] | None]


def attention_neighbours(shape: AttentionShape, grids: Mapping[GridKey, Any],
                         kv_heads: Mapping[tuple[Any, ...], frozenset[float]],
                         groups: Mapping[tuple[Any, ...], tuple[int, ...]]) -> AttentionNeighbours:
    """Which grids may answer a decode attention shape whose own layout no grid holds (`kv_heads`,
    `groups`: decode_kv_heads' and decode_groups' indexes of the grids): the kernel of the same
    query-group size with the most KV heads that are fewer than its own and divide them, and the
    measured query-group sizes around its own with its KV heads (infersim.tables.lookup answers from
    them). The layout alone decides both: not the batch nor the context."""
    if shape.stage != "decode" or shape.kind != "mha" or shape.num_kv_heads < 1 \
            or shape.num_heads % shape.num_kv_heads:
        return 0, None
    group = shape.num_heads // shape.num_kv_heads
    fewer = 0
    measured = kv_heads.get((shape.kind, shape.dtype, shape.kv_dtype, group, shape.qk_head_dim, shape.v_head_dim,
                             shape.q_len, shape.window), frozenset()) if shape.num_kv_heads > 1 else frozenset()
    for count in range(shape.num_kv_heads - 1, 0, -1) if measured else ():
        if shape.num_kv_heads % count == 0 and count in measured:
            found = shape_grid_key(replace(shape, num_heads=group * count, num_kv_heads=count,
                                           batch=shape.batch * (shape.num_kv_heads // count)))
            if found is not None and found[0] in grids:
                fewer = count
                break
    sizes = groups.get((shape.kind, shape.dtype, shape.kv_dtype, shape.qk_head_dim, shape.v_head_dim, shape.q_len,
                        shape.window), ())
    at = bisect.bisect_left(sizes, group)
    if not 0 < at < len(sizes) or sizes[at] == group:
        return fewer, None
    return fewer, (sizes[at - 1], sizes[at])
