"""Kernel tables restricted to the libraries a run's engine really launches.

A table times one library's kernel (its provenance names it: DeepGEMM, FlashInfer / FlashAttention-3,
TensorRT-LLM ...). When a run says its engine runs another library for a kernel family (the run
config's `kernel_libraries`, e.g. `attention: FlashMLA`), that family's tables describe a different
kernel: they are not used, the roofline times those kernels, and the run's notes say so. Families
the run does not name, and tables whose library matches, are used as usual.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from infersim.cards.schema import spec
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape, KernelShape, KernelTables, TableHit


@dataclass(frozen=True, kw_only=True)
class KernelLibraries:
    """The library the engine runs for each kernel family, where the run says (None: any)."""

    gemm: str | None = spec(None, doc="dense GEMMs (e.g. DeepGEMM, cuBLAS)")
    grouped_gemm: str | None = spec(None, doc="routed-expert grouped GEMMs (e.g. DeepGEMM, CUTLASS, Triton)")
    attention: str | None = spec(None, doc="attention kernels (e.g. FlashMLA, FlashInfer, FlashAttention-3)")
    collective: str | None = spec(None, doc="collectives (e.g. nccl)")

    def named(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


def _family(shape: KernelShape) -> str | None:
    if isinstance(shape, GroupedGemmShape):
        return "grouped_gemm"
    if isinstance(shape, GemmShape):
        return "gemm"
    if isinstance(shape, AttentionShape):
        return "attention"
    if isinstance(shape, CollectiveShape):
        return "collective"
    return None


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def library_matches(table_library: str, wanted: str) -> bool:
    """A table's library matches the run's when it names it (case, spaces and punctuation aside):
    'FlashInfer / FlashAttention-3' matches FlashInfer and FlashAttention3, not FlashMLA."""
    return _words(wanted) in _words(table_library)


class LibraryFilteredTables:
    """Tables with some kernel families left out (their lookups fall to the roofline)."""

    def __init__(self, inner: Any, skipped: dict[str, str]) -> None:
        self.inner = inner
        self.skipped = skipped  # family -> why its tables are not used

    @property
    def moe_includes_imbalance(self) -> bool:
        return "grouped_gemm" not in self.skipped and self.inner.moe_includes_imbalance

    @property
    def elementwise_memory_efficiency(self) -> float | None:
        return self.inner.elementwise_memory_efficiency

    @property
    def elementwise_latency(self) -> float | None:
        return self.inner.elementwise_latency

    def lookup(self, shape: KernelShape, peak_flops: float) -> TableHit | None:
        if _family(shape) in self.skipped:
            return None
        return self.inner.lookup(shape, peak_flops)

    def describe(self) -> str:
        return self.inner.describe() + "; not used for " + ", ".join(sorted(self.skipped))

    def __getattr__(self, name: str) -> Any:  # provenance, check_hardware, ... of the full set
        return getattr(self.inner, name)


def restrict_to_libraries(tables: KernelTables, libraries: KernelLibraries) -> tuple[KernelTables, str]:
    """`tables` without the families whose tables ran another library than `libraries` names, and
    the note that says which (empty when nothing is left out)."""
    provenance = getattr(tables, "provenance", None)
    wanted = libraries.named()
    if provenance is None or not wanted:
        return tables, ""
    skipped: dict[str, str] = {}
    for family, library in wanted.items():
        measured = sorted({info.library for info in provenance.tables.values() if info.family == family})
        other = [lib for lib in measured if not library_matches(lib, library)]
        if other:
            skipped[family] = (f"{family} tables ran {', '.join(other)}, the run's engine runs {library} "
                               f"(kernel_libraries.{family})")
    if not skipped:
        return tables, ""
    note = ("kernel tables not used, roofline instead: " + "; ".join(skipped[f] for f in sorted(skipped)))
    return LibraryFilteredTables(tables, skipped), note
