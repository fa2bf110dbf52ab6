"""The project's kernel-table format: one directory per device, CSV tables plus `provenance.yaml`.

A table directory holds
  - `provenance.yaml`: where every number came from (device, software, command, date, source),
    the dense peak FLOP/s per dtype that the `efficiency` column is relative to, and one entry
    per CSV naming its kernel family and the library that ran the kernel;
  - one CSV per kernel family/layout, every row self-describing (all key columns present).
See mfu_tables/FORMAT.md for the column reference. Latency is the measured quantity; the
`efficiency` column is derived from it (FLOPs of the row's kernel shape / (latency * peak)) and
is checked on load, so a table whose peak or FLOP convention drifted is refused. Writing and
reading a directory: infersim.tables.table_files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from infersim.base.units import DTYPE_BYTES
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape, MemoryBoundShape
from infersim.tables.provenance import FAMILIES as FAMILIES  # the format's names, from the provenance's module
from infersim.tables.provenance import FORMAT_VERSION as FORMAT_VERSION
from infersim.tables.provenance import PROVENANCE_FILE as PROVENANCE_FILE
from infersim.tables.provenance import PROVENANCE_HEADER as PROVENANCE_HEADER
from infersim.tables.provenance import DeviceInfo as DeviceInfo
from infersim.tables.provenance import Family as Family
from infersim.tables.provenance import Provenance as Provenance
from infersim.tables.provenance import TableInfo as TableInfo

#: families whose rows have no FLOPs, hence no `efficiency` column (latency is the whole record)
NO_EFFICIENCY: frozenset[str] = frozenset({"collective", "elementwise"})

#: relative tolerance between a stored `efficiency` and the one recomputed from latency and peak
EFFICIENCY_TOLERANCE = 2e-3
#: largest efficiency a row may imply: above 1 only by what boost clocks above the datasheet peak and
#: timing noise explain (the imported H20 grouped-GEMM rows reach 1.14); a latency off by 1000x is refused
MAX_EFFICIENCY = 1.25



# ---------------------------------------------------------------------------------------------
# Rows: one measured kernel each. `shape()` gives the simulator's kernel shape, whose FLOPs define
# the efficiency; so tables and the simulator can never disagree on what a FLOP count is.


KernelShape = GemmShape | GroupedGemmShape | AttentionShape | CollectiveShape | MemoryBoundShape


class _MeasuredKernel:
    """A row's kernel shape, built once per row: indexing a table set reads it three times a row
    (the efficiency check on read, the grid's efficiency, the bytes the HBM check compares)."""

    def shape(self) -> KernelShape:
        raise NotImplementedError

    @property
    def kernel_shape(self) -> KernelShape:
        # kept in the instance's __dict__, beside the frozen fields it is built from (so never stale)
        kept = self.__dict__.get("_kernel_shape")
        if kept is None:
            kept = self.__dict__["_kernel_shape"] = self.shape()
        return kept


@dataclass(frozen=True)
class GemmRow(_MeasuredKernel):
    """One measured GEMM (m x k x n) of gemm*.csv."""

    dtype: str
    m: int
    k: int
    n: int
    latency_us: float
    source_mfu: float | None = None

    def shape(self) -> GemmShape:
        return GemmShape(m=self.m, k=self.k, n=self.n, dtype=self.dtype, weight_dtype=self.dtype)


@dataclass(frozen=True)
class GroupedGemmRow(_MeasuredKernel):
    """One measured MoE grouped GEMM of grouped_gemm*.csv."""

    dtype: str
    stage: Literal["prefill", "decode"]
    projection: Literal["up", "down"]
    num_experts: int
    ep: int
    topk: int
    hidden: int
    intermediate: int
    gated: bool
    tokens_per_gpu: int
    latency_us: float
    source_mfu: float | None = None
    # storage format of the expert weights where it differs from `dtype` (the activations' tensor-core
    # format): weight-only quantised MoE kernels, e.g. GPT-OSS's MXFP4 experts run as bf16 x fp4 on Hopper
    weight_dtype: str | None = None

    @property
    def stored_weight_dtype(self) -> str:
        return self.weight_dtype or self.dtype

    def shape(self) -> GroupedGemmShape:
        local = self.num_experts // self.ep
        return GroupedGemmShape(
            stage=self.stage, projection=self.projection, num_experts=self.num_experts, ep=self.ep,
            topk=self.topk, hidden=self.hidden, intermediate=self.intermediate,
            tokens_per_gpu=float(self.tokens_per_gpu), active_experts=float(local), gated=self.gated,
            dtype=self.dtype, weight_dtype=self.stored_weight_dtype,
        )


@dataclass(frozen=True)
class AttentionRow(_MeasuredKernel):
    """One measured attention kernel of attention_*.csv."""

    kind: Literal["mha", "mla"]
    stage: Literal["prefill", "decode"]
    dtype: str
    kv_dtype: str
    num_heads: int
    num_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    causal: bool
    batch: int
    q_len: int
    kv_len: int
    latency_us: float
    source_mfu: float | None = None
    # sliding-window attention: each query attends to at most the last `window` positions (0: all of
    # them). Windowed kernels skip the keys outside the window, so they have grids of their own
    window: int = 0

    def shape(self) -> AttentionShape:
        return AttentionShape(
            kind=self.kind, stage=self.stage, batch=self.batch, q_len=self.q_len, kv_len=self.kv_len,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, qk_head_dim=self.qk_head_dim,
            v_head_dim=self.v_head_dim, causal=self.causal, window=self.window, dtype=self.dtype,
            kv_dtype=self.kv_dtype,
        )


@dataclass(frozen=True)
class CollectiveRow(_MeasuredKernel):
    """One collective inside one node: `ranks` GPUs, each holding `message_bytes` (the full buffer
    for all-reduce, the gathered output for all-gather, the input for reduce-scatter), as
    `CollectiveShape.bytes_per_rank`. `library` names the implementation (nccl, trtllm-custom ...)."""

    kind: Literal["all_reduce", "all_gather", "reduce_scatter"]
    library: str
    dtype: str
    ranks: int
    message_bytes: int
    latency_us: float

    def shape(self) -> CollectiveShape:
        return CollectiveShape(kind=self.kind, bytes_per_rank=float(self.message_bytes), ranks=self.ranks,
                               ranks_per_node=self.ranks)


@dataclass(frozen=True)
class ElementwiseRow(_MeasuredKernel):
    """One measured elementwise, reduction or copy kernel of eager PyTorch (elementwise*.csv): `op`
    names the kernel as the simulator's operations do (infersim.shapes.kernels.ELEMENTWISE_OPS), `dtype` its
    input format, `elements` the elements it writes and `bytes` what it reads plus writes by that op's
    byte rule (the same rule the simulator's shape uses), the axis the lookup interpolates over. No
    FLOPs, hence no `efficiency` column: latency is the record."""

    op: str
    dtype: str
    elements: int
    bytes: int
    latency_us: float

    def shape(self) -> MemoryBoundShape:
        return MemoryBoundShape(what=self.op, bytes_moved=float(self.bytes), op=self.op, dtype=self.dtype)


Row = GemmRow | GroupedGemmRow | AttentionRow | CollectiveRow | ElementwiseRow
ROW_TYPES: dict[str, type] = {"gemm": GemmRow, "grouped_gemm": GroupedGemmRow, "attention": AttentionRow,
                              "collective": CollectiveRow, "elementwise": ElementwiseRow}


#: storage formats a weight_dtype cell may name (units.DTYPE_BYTES' formats below 32 bits)
WEIGHT_FORMATS: tuple[str, ...] = tuple(name for name, size in DTYPE_BYTES.items() if size < 4)

#: columns a table may leave out: source_mfu (imported tables only), weight_dtype (only weight-only MoE tables),
#: window (only tables with sliding-window attention rows)
OPTIONAL_COLUMNS: tuple[str, ...] = ("source_mfu", "weight_dtype", "window")
#: optional columns whose empty cell (or absence) means 0 rather than None
ZERO_WHEN_EMPTY: frozenset[str] = frozenset({"window"})


def row_columns(family: str) -> list[str]:
    """CSV header of a family: the row fields in order, `efficiency` after `latency_us`."""
    names = [f.name for f in dataclasses.fields(ROW_TYPES[family])]
    if family in NO_EFFICIENCY:
        return names
    at = names.index("latency_us") + 1
    return names[:at] + ["efficiency"] + names[at:]


def efficiency_of(row: Row, peak_flops: float) -> float:
    """Achieved FLOP/s over peak: the row's kernel FLOPs / (latency * peak)."""
    return row.kernel_shape.flops / (row.latency_us * 1e-6 * peak_flops)


@dataclass(frozen=True)
class TableDirectory:
    """A loaded (or to-be-written) table directory: provenance and the rows of each CSV."""

    provenance: Provenance
    tables: dict[str, tuple[Row, ...]] = field(default_factory=dict)
    row_lines: dict[str, tuple[int, ...]] = field(default_factory=dict)  # CSV line of each row (when read)

    def rows_of(self, family: str) -> list[tuple[str, Row]]:
        return [(name, row) for name, rows in self.tables.items()
                if self.provenance.tables[name].family == family for row in rows]


