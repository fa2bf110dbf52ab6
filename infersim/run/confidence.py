"""How much to trust a result: a grade for each operation, each module and each headline number.

Three grades, from where each time came from:

  measured     a kernel table measured on this GPU with the kernels of this engine (the kind of
               kernels: TensorRT-LLM's, SGLang's, vLLM's, or PyTorch's own for HF transformers)
  transferred  a kernel table of another engine's kernels or of another GPU, used for this one
               (bundled tables are per GPU; an engine without its own takes another's, and says so)
  roofline     no table: peak FLOP/s and bandwidth times the efficiencies the hardware card
               assumes (compute_efficiency, memory_efficiency, the elementwise and link
               efficiencies), or a constant of a card (engine overheads)

An operation whose kernels came from several sources (a `mixed` cost) is graded roofline: part of
it is assumed. A module takes the grade that carries most of its time, and a stage (prefill step,
decode step: the headline TTFT/TPOT and throughput) the grade that carries most of the step; the
shares of every grade are kept beside it. `infersim validate` groups its errors by these grades.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infersim.base.errors import InferSimError
from infersim.cards import categories as cat
from infersim.costing.timing import elementwise_rule_text
from infersim.shapes.kernels import Bound, Source

if TYPE_CHECKING:
    from infersim.cards.hardware import HardwareCard
    from infersim.engine.stage import OperationResult, StageResult
    from infersim.run.config import RunConfig

MEASURED = "measured"
TRANSFERRED = "transferred"
ROOFLINE = "roofline"
GRADES = (MEASURED, TRANSFERRED, ROOFLINE)
GRADE_SHORT = {MEASURED: "tables of this GPU and engine", TRANSFERRED: "tables of another engine or GPU",
               ROOFLINE: "efficiencies assumed"}
GRADE_TEXT = {MEASURED: "measured tables of this GPU and engine",
              TRANSFERRED: "tables of another engine or GPU, transferred",
              ROOFLINE: "roofline only, efficiencies assumed"}


@dataclass(frozen=True)
class TableOrigin:
    """What the kernel tables in force are to this run: their grade and, in words, whose they are."""

    grade: str  # MEASURED or TRANSFERRED
    what: str


@dataclass(frozen=True)
class StageConfidence:
    """The grade of a stage (its headline numbers), its modules, and what stands behind each grade."""

    grade: str
    shares: dict[str, float]  # grade -> share of the step's operation time
    modules: dict[str, str]  # module category -> grade
    tables: str  # whose tables the table-graded time is ("" without tables)
    assumed: tuple[str, ...]  # the efficiencies and constants the roofline-graded time rests on

    def describe(self) -> str:
        """One line: each grade with what stands behind it and its share of the step, the headline first."""
        parts = []
        for grade in sorted(self.shares, key=lambda g: (g != self.grade, -self.shares[g])):
            share = self.shares[grade]
            if share <= 0 and grade != self.grade:
                continue
            why = self.tables if grade != ROOFLINE else "; ".join(self.assumed)
            parts.append(f"{grade}, {GRADE_SHORT[grade]}" + (f" ({why})" if why else "") + f": {100 * share:.0f}%")
        return " | ".join(parts)


def _bundled_device(directory: Path) -> str | None:
    """The hardware card a bundled table directory belongs to (mfu_tables/<kind>/<device>/...)."""
    from infersim.cards.registry import bundled_dir

    try:
        inside = directory.resolve().relative_to(bundled_dir("mfu_tables").resolve())
    except (ValueError, OSError):
        return None
    return inside.parts[1] if len(inside.parts) > 1 else None


def tables_device(tables: Any) -> str | None:
    """The hardware card the tables were measured on: the bundled directory's device, else the card
    the provenance's device name resolves to; None when it names no card."""
    directory = getattr(tables, "directory", None)
    if directory is not None:
        device = _bundled_device(Path(directory))
        if device is not None:
            return device
    from infersim.cards.registry import forgiving_name

    try:
        found = forgiving_name(tables.provenance.device.name, "hardware")
    except InferSimError:
        return None
    return found[0] if found else None


def tables_framework(provenance: Any) -> str:
    """The kind of kernels a table directory timed: its engine framework, PyTorch's own kernels for
    tables `mfu bench` measured, SGLang-class kernels for the original InferSim tables."""
    from infersim.tables.select import IMPORTED_FRAMEWORK, MEASURED_FRAMEWORK

    framework = provenance.software.get("framework")
    if framework:
        return str(framework)
    return MEASURED_FRAMEWORK if provenance.origin == "measured" else IMPORTED_FRAMEWORK


def table_origin(config: RunConfig) -> TableOrigin | None:
    """The grade of the time the run's kernel tables give (None: no tables in force)."""
    provenance = getattr(config.tables, "provenance", None)
    if provenance is None:
        return None
    from infersim.tables.select import MEASURED_FRAMEWORK, TORCH_KERNEL_FRAMEWORKS

    device = tables_device(config.tables)
    framework = tables_framework(provenance)
    version = provenance.software.get("framework_version") or provenance.software.get("torch") or ""
    kernels = f"{framework} {version}".strip() if version and version != "unknown" else framework
    engine = config.engine
    runs = MEASURED_FRAMEWORK if engine.framework in TORCH_KERNEL_FRAMEWORKS else engine.framework
    hw = config.hardware.name
    on = device or provenance.device.name
    if device == hw and framework == runs:
        return TableOrigin(MEASURED, f"{kernels} tables of {hw}")
    why = []
    if device != hw:
        why.append(f"measured on {on}, not {hw}")
    if framework != runs:
        why.append(f"{framework} kernels, not {engine.name}'s")
    return TableOrigin(TRANSFERRED, f"{kernels} tables of {on}: {'; '.join(why)}")


def kernel_grade(source: Source, tables: Any, hardware: HardwareCard) -> str:
    """The grade of one kernel's time without an engine (a kernel point): a table of this GPU is
    measured, of another GPU transferred; anything else roofline."""
    if source is not Source.TABLE or getattr(tables, "provenance", None) is None:
        return ROOFLINE
    return MEASURED if tables_device(tables) == hardware.name else TRANSFERRED


def operation_grade(op: OperationResult, origin: TableOrigin | None) -> str:
    if op.source is Source.TABLE and origin is not None:
        return origin.grade
    return ROOFLINE


def _link_efficiency(op: OperationResult, config: RunConfig) -> str:
    hw = config.hardware
    derates = hw.derates
    if " nodes)" in op.detail:
        return f"network_efficiency {derates.network_efficiency:g} (+ the card's collective latencies)"
    if not hw.peak.nvlink_bandwidth > 0 or "PCIe" in op.detail:
        return "the card's PCIe tier efficiencies (+ NCCL's PCI latencies)"
    return f"nvlink_efficiency {derates.nvlink_efficiency:g} (+ the card's collective latencies)"


def assumed_efficiency(op: OperationResult, config: RunConfig) -> str:
    """What a roofline-graded operation's time rests on: the card efficiency or constant it assumes."""
    derates = config.hardware.derates
    if op.source is Source.CARD:
        return f"{config.engine.name} card overheads" if op.bound is Bound.OVERHEAD else \
            f"{config.hardware.name} card constants"
    if op.bound is Bound.COMM:
        return _link_efficiency(op, config)
    if op.bound is Bound.HOST_LINK:
        return f"pcie_efficiency {derates.pcie_efficiency:g}"
    if op.module == cat.ELEMENTWISE or (op.bound is Bound.MEMORY and op.flops == 0):
        if config.tables.elementwise_memory_efficiency is not None:
            return f"elementwise at {elementwise_rule_text(config.tables)} (the tables' rule)"
        return f"elementwise_memory_efficiency {derates.elementwise_memory_efficiency:g}"
    if op.bound is Bound.COMPUTE:
        if op.module == cat.ATTN_CORE:
            return f"attention_compute_efficiency {derates.attention_compute_efficiency:g}"
        gemm = config.deployment.precision.gemm
        return f"compute_efficiency {gemm} {derates.compute_efficiency.get(gemm, 0.0):g}"
    return f"memory_efficiency {derates.memory_efficiency:g}"


def _plurality(times: dict[str, float]) -> str:
    """The grade carrying the most time; ties (and no time) go to the weaker grade."""
    return max(reversed(GRADES), key=lambda g: times.get(g, 0.0))


def stage_confidence(stage: StageResult, config: RunConfig) -> StageConfidence:
    origin = table_origin(config)
    times: dict[str, float] = dict.fromkeys(GRADES, 0.0)
    by_module: dict[str, dict[str, float]] = {}
    assumed: dict[str, float] = {}
    for op in stage.operations:
        grade = operation_grade(op, origin)
        times[grade] += op.time_s
        module = by_module.setdefault(op.module, {})
        module[grade] = module.get(grade, 0.0) + op.time_s
        if grade == ROOFLINE and op.time_s > 0:
            what = assumed_efficiency(op, config)
            assumed[what] = assumed.get(what, 0.0) + op.time_s
    total = sum(times.values())
    shares = {g: (t / total if total else 0.0) for g, t in times.items()}
    return StageConfidence(
        grade=_plurality(times), shares=shares,
        modules={module: _plurality(grades) for module, grades in by_module.items()},
        tables=origin.what if origin is not None else "",
        assumed=tuple(sorted(assumed, key=lambda w: -assumed[w])))


def run_grade(*stages: StageConfidence) -> str:
    """One grade for several stages together (a serving run: prefill and decode), by their shares."""
    times = {g: sum(s.shares.get(g, 0.0) for s in stages) for g in GRADES}
    return _plurality(times)


def confidence_json(confidence: StageConfidence) -> dict[str, Any]:
    return {"grade": confidence.grade, "meaning": GRADE_TEXT[confidence.grade],
            "shares": {g: confidence.shares[g] for g in GRADES}, "modules": confidence.modules,
            "tables": confidence.tables or None, "assumed": list(confidence.assumed)}
