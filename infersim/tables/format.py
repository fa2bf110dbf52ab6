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

from infersim.cards.schema import spec
from infersim.base.errors import ConfigError
from infersim.base.units import DTYPE_BYTES
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape, MemoryBoundShape

FORMAT_VERSION = 1
PROVENANCE_FILE = "provenance.yaml"
#: the first line of every provenance InferSim writes: how a table directory of its own is told apart
PROVENANCE_HEADER = "# Provenance of the kernel tables in this directory (format: mfu_tables/FORMAT.md)."
Family = Literal["gemm", "grouped_gemm", "attention", "collective", "elementwise"]
FAMILIES: tuple[str, ...] = ("gemm", "grouped_gemm", "attention", "collective", "elementwise")
#: families whose rows have no FLOPs, hence no `efficiency` column (latency is the whole record)
NO_EFFICIENCY: frozenset[str] = frozenset({"collective", "elementwise"})

#: relative tolerance between a stored `efficiency` and the one recomputed from latency and peak
EFFICIENCY_TOLERANCE = 2e-3
#: largest efficiency a row may imply: above 1 only by what boost clocks above the datasheet peak and
#: timing noise explain (the imported H20 grouped-GEMM rows reach 1.14); a latency off by 1000x is refused
MAX_EFFICIENCY = 1.25


# ---------------------------------------------------------------------------------------------
# Provenance


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU a table directory's kernels ran on."""

    name: str = spec(doc="device name as the driver reports it (or as the source names it)")
    sm_count: int | None = spec(None, doc="streaming multiprocessors (null = unknown)", gt=0)
    clocks: dict[str, float] = spec(default_factory=dict, doc="clocks in MHz if readable (sm_max, memory_max, ...)")
    memory_bytes: float | None = spec(None, doc="device memory, bytes (null = unknown)", gt=0)
    l2_bytes: float | None = spec(None, doc="L2 cache, bytes (null = unknown)", gt=0)


@dataclass(frozen=True)
class TableInfo:
    """Provenance of one table file: kernel family, library and how it was measured."""

    family: Family = spec(doc="kernel family: gemm, grouped_gemm, attention, collective or elementwise")
    library: str = spec(doc="the library/kernel that ran it (DeepGEMM, FlashInfer, torch SDPA ...)")
    library_version: str = spec("unknown", doc="its version, or 'unknown'")
    description: str = spec("", doc="what the table holds, in words")
    source_file: str = spec("", doc="imported tables: the source file, relative to the source path")
    notes: tuple[str, ...] = spec((), doc="anything a reader must know (assumptions, skipped rows)")
    moe_routing: str = spec("balanced", doc="grouped_gemm tables: how tokens were routed to experts when timed: "
                                            "'balanced' (evenly) or 'power_law_<alpha>' (timed on the most "
                                            "loaded rank, so the time already contains the expert-load imbalance)")

    @property
    def includes_imbalance(self) -> bool:
        """True when the measured time already contains an uneven expert load (power-law routing)."""
        return self.family == "grouped_gemm" and self.moe_routing != "balanced"


@dataclass(frozen=True)
class Provenance:
    """provenance.yaml of a table directory: device, peaks, source and each table's facts."""

    format_version: int = spec(doc="table format version (1)", ge=1)
    device: DeviceInfo = spec(doc="the GPU the kernels ran on")
    peak_flops: dict[str, float] = spec(doc="dense FLOP/s per dtype that `efficiency` is relative to", gt=0)
    origin: Literal["measured", "imported"] = spec(doc="measured by `infersim mfu bench`, or imported")
    measured_on: str = spec(doc="date of the measurement (ISO 8601), or 'unknown'")
    written_on: str = spec(doc="date these files were written (ISO 8601)")
    command: str = spec(doc="the exact command that wrote this directory")
    software: dict[str, str] = spec(default_factory=dict, doc="versions: torch, cuda, driver, ... ('unknown' if so)")
    source: dict[str, str] = spec(default_factory=dict, doc="imported tables: path, project, license")
    notes: tuple[str, ...] = spec((), doc="notes on the whole directory")
    elementwise_memory_efficiency: float | None = spec(
        None, doc="share of HBM bandwidth that elementwise kernels (norms, activations, casts) stream at on this "
                  "device and engine, where the tables come with such a rule (aiconfigurator's do: it prices "
                  "memory-bound ops analytically beside its measured kernels); absent: the hardware card's", gt=0, le=1)
    elementwise_latency: float | None = spec(
        None, doc="seconds the tables' elementwise rule adds to each elementwise kernel beside its bytes' time "
                  "(aiconfigurator's mem_empirical_constant_latency); absent: the hardware card's "
                  "kernel_launch_overhead", ge=0, le=1e-3)
    elementwise_source: str = spec("", doc="where elementwise_memory_efficiency and elementwise_latency come from")
    launch_cpu: float | None = spec(
        None, doc="host (CPU) wall time per kernel that eager PyTorch model code launches on this machine, seconds "
                  "(measured by `mfu bench`'s host probes); where present it replaces the engine card's "
                  "overheads.launch_cpu while these tables are in force, and the report says so", gt=0)
    step_cpu: float | None = spec(
        None, doc="host time per generation step outside the model's forward (HF generate(): logits processing, "
                  "stopping checks, input updates, their host-device syncs), seconds; replaces the engine card's "
                  "overheads.step_cpu while these tables are in force", gt=0)
    host_source: str = spec("", doc="how launch_cpu and step_cpu were measured")
    host_probes: dict[str, float] = spec(
        default_factory=dict, doc="each host probe's result, seconds per call (launch of a small op, a view, a "
                                  "module call, a host-device sync, ...)", ge=0)
    complete: bool = spec(True, doc="false while `mfu bench` is still writing (or was stopped before it finished): "
                                    "the rows present are measured, the grid may lack points")
    tables: dict[str, TableInfo] = spec(default_factory=dict, doc="one entry per CSV file in the directory")

    def peak_for(self, dtype: str, source: str) -> float:
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise ConfigError(source, "peak_flops", dtype,
                              f"no peak FLOP/s recorded for dtype {dtype} (have: {', '.join(sorted(self.peak_flops))})"
                              ) from None


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


