"""A table directory's provenance (provenance.yaml): the device, the peaks, where every number came
from and each table file's facts (format: mfu_tables/FORMAT.md; the rows: infersim.tables.format).
Kept apart from the rows so that a run whose tables come from the on-disk cache reads provenance
without defining every row type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infersim.cards.schema import spec
from infersim.base.errors import ConfigError

FORMAT_VERSION = 1
PROVENANCE_FILE = "provenance.yaml"
#: the first line of every provenance InferSim writes: how a table directory of its own is told apart
PROVENANCE_HEADER = "# Provenance of the kernel tables in this directory (format: mfu_tables/FORMAT.md)."
Family = Literal["gemm", "grouped_gemm", "attention", "collective", "elementwise"]
FAMILIES: tuple[str, ...] = ("gemm", "grouped_gemm", "attention", "collective", "elementwise")


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
