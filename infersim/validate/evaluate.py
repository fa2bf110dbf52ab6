"""Runs the reference points through the simulator and compares.

Every point of the reference file is either compared (one number per point, or one per sub-metric
when the point's value is a mapping: id "<point id>/<key>") or listed as not expressed with the
reason: no entry in the mapping, the entry's own `not_expressed`, the run config refused by this
build (the loader's message), or the request-level simulator missing for serving points.
Error = (predicted - measured) / measured, signed.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infersim.cards.schema import build, check_number, load_yaml
from infersim.base.errors import MISSING, ConfigError, InferSimError
from infersim.shapes.comm_shapes import TokenExchangeShape
from infersim.shapes.kernels import GemmShape, GroupedGemmShape, KernelTables, NoTables
from infersim.cards import categories as cat
from infersim.run.confidence import ROOFLINE, kernel_grade, run_grade, stage_confidence, table_origin
from infersim.validate.units import check_units
from infersim.validate.mapping import (ENERGY_FROM, ENERGY_KINDS, KERNEL_KINDS, MEMORY_KINDS, SERVING_KINDS,
                                       STAGE_FROM, STAGE_KINDS, Conversion, PointMapping, fit_run_to_spec)

WITHIN = 0.15  # the share of points within this |error| is reported
ENERGY_FAMILY = "energy"
MEMORY_FAMILY = "memory"
#: quantities other than times and throughputs: each has its own overall, out of the overall of times
APART = (ENERGY_FAMILY, MEMORY_FAMILY)
NEEDS_SERVE = "needs the request-level simulator: infersim.serve.api is not part of this build"

SHAPES = {"kernel_gemm": GemmShape, "kernel_grouped_gemm": GroupedGemmShape, "deepep": TokenExchangeShape}


@dataclass(frozen=True)
class ReferencePoint:
    id: str
    source: str
    value: float | dict[str, float]
    unit: str
    metric: str


@dataclass(frozen=True)
class Comparison:
    id: str  # point id, or "<point id>/<sub-metric>"
    point_id: str
    source: str
    kind: str
    family: str
    measured: float
    predicted: float
    unit: str
    dominant_module: str  # module category (stages: the largest share of kernel time; kernels: the kernel's)
    dominant_detail: str = ""  # stages: that module's share of the step; kernels: its bound
    note: str = ""
    accepted_outlier: str = ""  # listed but out of the statistics, with the reason (points.yaml)
    grade: str = ""  # how the prediction was priced (infersim.run.confidence: measured, transferred, roofline)

    @property
    def error(self) -> float:
        """Signed relative error (predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured


@dataclass(frozen=True)
class NotExpressed:
    id: str
    source: str
    kind: str
    reason: str


@dataclass(frozen=True)
class Stats:
    n: int
    median_abs_error: float
    mean_abs_error: float
    signed_mean_error: float
    within_share: float  # share of points with |error| <= WITHIN


@dataclass
class Validation:
    reference: str
    points_file: str
    mfu_tables: str
    comparisons: list[Comparison] = field(default_factory=list)
    not_expressed: list[NotExpressed] = field(default_factory=list)

    @property
    def counted(self) -> list[Comparison]:
        """The comparisons the statistics count: all but the accepted outliers."""
        return [c for c in self.comparisons if not c.accepted_outlier]

    def stats(self) -> dict[str, Any]:
        """Overall (times and throughputs: kernel / stage / serving), energy and memory overall, by
        source, by kind family, by the grade of the prediction (measured, transferred, roofline) and,
        for serving points with sub-metrics, by sub-metric (ttft_mean, itl_mean, ...), accepted
        outliers left out. Energy and memory are quantities of their own: each is kept out of the
        overall time statistics and has its own overall; memory (no kernel priced) is kept out of the
        sources and grades too."""
        by_source: dict[str, list[float]] = {}
        by_kind: dict[str, list[float]] = {}
        by_grade: dict[str, list[float]] = {}
        by_metric: dict[str, list[float]] = {}
        for c in self.counted:
            by_kind.setdefault(c.family, []).append(c.error)
            if c.family == MEMORY_FAMILY:
                continue
            if c.kind in SERVING_KINDS and c.id != c.point_id:
                by_metric.setdefault(c.id.rsplit("/", 1)[1], []).append(c.error)
            by_source.setdefault(c.source, []).append(c.error)
            by_grade.setdefault(c.grade or "-", []).append(c.error)
        return {
            "overall": summarize(c.error for c in self.counted if c.family not in APART),
            **{family: summarize(c.error for c in self.counted if c.family == family) for family in APART},
            "by_source": {k: summarize(v) for k, v in by_source.items()},
            "by_kind": {k: summarize(v) for k, v in by_kind.items()},
            "by_grade": {k: summarize(v) for k, v in by_grade.items()},
            "by_metric": {k: summarize(v) for k, v in by_metric.items()},
        }


def summarize(errors: Iterable[float]) -> Stats | None:
    """Median and mean |error|, signed mean error and the share within 15%; None without points."""
    values = list(errors)
    if not values:
        return None
    absolute = [abs(e) for e in values]
    return Stats(len(values), statistics.median(absolute), sum(absolute) / len(values), sum(values) / len(values),
                 sum(1 for a in absolute if a <= WITHIN + 1e-12) / len(values))


# ---------------------------------------------------------------------------------------------
# Reference file


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_references(paths: Sequence[Path]) -> dict[str, ReferencePoint]:
    """The points of several reference files, by id (an id in two files is an error)."""
    out: dict[str, ReferencePoint] = {}
    seen: dict[str, Path] = {}
    for path in paths:
        for pid, point in load_reference(path).items():
            if pid in out:
                raise ConfigError(str(path), "data_points", pid, f"point id also in {seen[pid]}: ids must differ "
                                  "between reference files")
            out[pid], seen[pid] = point, path
    return out


def load_reference(path: Path) -> dict[str, ReferencePoint]:
    """The points of a reference file (format of ../shared/reference/validation.yaml), by id."""
    source = str(path)
    data = load_yaml(Path(path), "reference file")
    if not isinstance(data, dict) or not isinstance(data.get("data_points"), list):
        raise ConfigError(source, "data_points", MISSING,
                          "expected a mapping with a `data_points` list (the format of validation.yaml), or serving "
                          "runs: an `experiments` list (the format of vllm_serving_trainval.yaml)")
    out: dict[str, ReferencePoint] = {}
    for index, raw in enumerate(data["data_points"]):
        where = f"data_points[{index}]"
        if not isinstance(raw, dict):
            raise ConfigError(source, where, raw, "expected a mapping with id, value, unit and source")
        pid = raw.get("id")
        if not isinstance(pid, str) or not pid:
            raise ConfigError(source, f"{where}.id", pid if pid is not None else MISSING, "every point needs an id")
        where = f"{where} ({pid})"
        if pid in out:
            raise ConfigError(source, f"{where}.id", pid, "a second point with the same id")
        value = raw.get("value")
        if isinstance(value, dict):
            bad = [k for k, v in value.items() if not _number(v) or v <= 0]
            if not value or bad:
                raise ConfigError(source, f"{where}.value", value,
                                  "a mapping value needs a positive number for every sub-metric")
            value = {str(k): float(check_number(v, source, f"{where}.value.{k}", gt=0)) for k, v in value.items()}
        elif _number(value) and value > 0:
            value = float(check_number(value, source, f"{where}.value", gt=0))  # the rule's magnitudes too
        else:
            raise ConfigError(source, f"{where}.value", value if "value" in raw else MISSING,
                              "expected a positive number (or a mapping of sub-metric -> number)")
        src = raw.get("source")
        if not isinstance(src, str) or not src:
            raise ConfigError(source, f"{where}.source", src if src is not None else MISSING,
                              "every point names its source")
        out[pid] = ReferencePoint(pid, src, value, str(raw.get("unit") or ""), str(raw.get("metric") or ""))
    return out


# ---------------------------------------------------------------------------------------------
# Kernel tables per hardware card


def table_dir_for(mfu_tables: str | None, hardware: str) -> str | None:
    """The table directory for a hardware card: DIR/<card> when present, DIR itself when it is
    one device's tables, else None (roofline). DIR may name a bundled table set; none, auto or
    nothing: None here (see _Evaluator.config for what runs then)."""
    if not mfu_tables or mfu_tables in ("none", "auto"):
        return None
    from infersim.cards.registry import resolve_table_dir

    base = resolve_table_dir(mfu_tables)
    if base is None or not base.is_dir():
        raise InferSimError(f"--mfu-tables {mfu_tables}: no such directory (nor a bundled table set of that name)")
    if (base / hardware).is_dir():
        return str(base / hardware)
    from infersim.tables.format import PROVENANCE_FILE

    return str(base) if (base / PROVENANCE_FILE).is_file() else None


# ---------------------------------------------------------------------------------------------
# Evaluation


class _Refused(Exception):
    """A point the simulator cannot express, with the reason."""


def _kernel_value(conv: Conversion, shape: Any, seconds: float) -> float:
    if conv.source == "time_us":
        value = seconds * 1e6
    elif conv.source == "tflops":
        value = shape.flops / seconds / 1e12
    else:
        value = (conv.bytes if conv.bytes is not None else shape.bytes) / seconds / 1e9
    return value * conv.multiply


def _kernel_module(kind: str, shape: Any) -> str:
    if kind == "deepep":
        return cat.DISPATCH if shape.direction == "dispatch" else cat.COMBINE
    return cat.MOE_EXPERTS if kind == "kernel_grouped_gemm" else "gemm"


class _Evaluator:
    def __init__(self, points_file: str, mfu_tables: str | None, calibration: str | None = None) -> None:
        from infersim.cards.calibration import load_profile

        self.points_file = points_file
        self.mfu_tables = mfu_tables
        # a profile applies to the points on its GPU and engine; the others run on the cards as they are
        self.calibration = str(Path(calibration).resolve()) if calibration else None
        self.profile = load_profile(self.calibration) if self.calibration else None
        self._tables: dict[str, KernelTables] = {}
        self._serving: dict[str, tuple[dict[str, Any], str, list[str]]] = {}
        # the serving runs' shared step prices (infersim.serve.cost's StepPriceBook), made with the first
        # serving point: infersim.serve may be absent (NEEDS_SERVE)
        self._step_prices: Any = None

    def tables(self, hardware: str) -> KernelTables:
        if hardware not in self._tables:
            directory = table_dir_for(self.mfu_tables, hardware)
            if directory is None:
                self._tables[hardware] = NoTables()
            else:
                from infersim.tables.lookup import load_tables

                self._tables[hardware] = load_tables(Path(directory))
        return self._tables[hardware]

    def kernel(self, entry: PointMapping, key: str, conv: Conversion) -> tuple[float, tuple[str, str, str], str]:
        from infersim.run.config import load_hardware_card
        from infersim.costing.timing import kernel_cost

        hw, _ = load_hardware_card(entry.hardware)
        fields = {**entry.kernel, **conv.kernel}
        where = f"{self.points_file}: {entry.id}" + (f"/{key}" if key else "")
        shape = build(SHAPES[entry.kind], fields, where, "kernel")
        tables = self.tables(hw.name)
        cost = kernel_cost(shape, hw, tables)
        note = f"{cost.source.value}" + (f": {cost.detail}" if cost.detail else "")
        grade = kernel_grade(cost.source, tables, hw)
        return _kernel_value(conv, shape, cost.seconds), (_kernel_module(entry.kind, shape), cost.bound.value, grade), note

    def config(self, entry: PointMapping) -> tuple[Any, list[str]]:
        from infersim.run.config import config_from_mapping

        run, dropped = fit_run_to_spec(entry.run)
        notes = []
        if dropped:
            notes.append(f"dropped {', '.join(dropped)} (not a run-config field in this build)")
        hardware = run.get("hardware")
        if self.mfu_tables in (None, "auto", "none"):
            # auto: the tables the point's run names, else the run's own default (bundled tables of
            # its device and engine); none: roofline
            named = run.get("mfu_tables") if self.mfu_tables != "none" else None
            tables = named if isinstance(named, str) else self.mfu_tables or "auto"
        else:
            tables = (table_dir_for(self.mfu_tables, hardware) if isinstance(hardware, str) else None) or "none"
        try:
            config = config_from_mapping(run, f"{self.points_file}: {entry.id}: run", entry.overrides, mfu_tables=tables)
        except InferSimError as exc:
            raise _Refused("; ".join([f"refused: {exc}", *notes])) from None
        if self.mfu_tables not in (None, "auto", "none") and tables == "none":
            notes.append(f"no kernel tables for {hardware} under {self.mfu_tables}: roofline")
        if self.profile is not None:
            from infersim.cards.calibration import applies

            if not applies(self.profile, config.hardware, config.engine):
                config = config_from_mapping({**run, "calibration": self.calibration},
                                             f"{self.points_file}: {entry.id}: run", entry.overrides, mfu_tables=tables)
                notes.append(f"calibrated: {self.profile.describe()}")
        return config, notes

    def simulated(self, entry: PointMapping) -> tuple[Any, Any, list[str]]:
        """(the point's run simulated, its config, its notes); a run the simulator refuses is the point's refusal."""
        from infersim.run.simulate import simulate

        config, notes = self.config(entry)
        try:
            return simulate(config), config, notes
        except InferSimError as exc:
            raise _Refused("; ".join([f"refused: {exc}", *notes])) from None

    def stage(self, entry: PointMapping, conv: Conversion) -> tuple[float, tuple[str, str, str], str]:
        result, config, notes = self.simulated(entry)
        stage_name, quantity = STAGE_FROM[conv.source]
        stage = result.prefill if stage_name == "prefill" else result.decode
        if quantity == "tgs":
            value = stage.tgs
        elif quantity == "ttft_ms":
            value = stage.step_time_s * 1e3
        else:
            value = stage.tpot_s * 1e3
        times = stage.module_times()
        module = max(times, key=times.__getitem__)
        share = times[module] / sum(times.values())
        notes += [f"does not fit: {limit}" for limit in result.unfit]  # priced anyway: say so beside it
        grade = stage_confidence(stage, config).grade
        return value * conv.multiply, (module, f"{100 * share:.0f}%", grade), "; ".join(notes)

    def serving(self, entry: PointMapping, conv: Conversion) -> tuple[float, tuple[str, str, str], str]:
        out, grade, notes = self._serving_result(entry)
        stage = entry.serving.get("stage")
        if stage is not None:
            out = _stage_row(out, stage, entry.id)
            if out.get("overloaded"):
                notes = [*notes, f"simulated stage overloaded: its queue grows at {out['rate']:g} req/s offered"]
        if conv.source not in out:
            raise InferSimError(f"{self.points_file}: {entry.id}: metric.from '{conv.source}' is not a key of the "
                                f"serving result (keys: {', '.join(sorted(out))})")
        module = (str(out.get("dominant_module", "-")), "", grade)
        workload = entry.serving.get("workload")
        notes = notes + list(workload.get("notes") or []) if isinstance(workload, dict) else notes
        return float(out[conv.source]) * conv.multiply, module, "; ".join(notes)

    def _serving_result(self, entry: PointMapping) -> tuple[dict[str, Any], str, list[str]]:
        """The serving simulation of an entry (its result, grade and notes), run once for every
        sub-metric and every entry with the same run and options (the stages of one run)."""
        options = {k: v for k, v in entry.serving.items() if k != "stage"}
        key = json.dumps([entry.run, options, entry.overrides], sort_keys=True, default=str)
        if key in self._serving:
            return self._serving[key]
        config, notes = self.config(entry)
        try:
            from infersim.serve.api import simulate_serving  # the request-level simulator
            from infersim.serve.cost import StepPriceBook
        except ModuleNotFoundError as exc:
            if exc.name and "infersim.serve.api".startswith(exc.name):
                raise _Refused(NEEDS_SERVE) from None
            raise
        if self._step_prices is None:
            self._step_prices = StepPriceBook()
        try:
            out = simulate_serving(config, options, self._step_prices)
        except InferSimError as exc:
            raise _Refused("; ".join([f"refused by the serving simulator: {exc}", *notes])) from None
        self._serving[key] = (out, _serving_grade(config), notes)
        return self._serving[key]

    def overload(self, entry: PointMapping, key: str, measured: dict[str, float] | float) -> str:
        """Why a staged serving point's TTFT or E2E stays out of the statistics: the simulated stage
        is overloaded (its queue grows without bound) while the measured one shows no queue (its
        mean TTFT is below its mean time after the first token), so the error is the queue's
        growth over the simulated stage, not a latency; empty otherwise."""
        stage = entry.serving.get("stage")
        if entry.kind not in SERVING_KINDS or stage is None or not isinstance(measured, dict) or \
                not key.startswith(("ttft", "e2e")):
            return ""
        out, _, _ = self._serving_result(entry)
        row = _stage_row(out, stage, entry.id)
        ttft, e2e = measured.get("ttft_mean"), measured.get("e2e_mean")
        if not row.get("overloaded") or ttft is None or e2e is None or ttft >= e2e - ttft:
            return ""
        capacity = row.get("saturated_capacity_rps")
        return (f"simulated stage overloaded at {row['rate']:g} req/s"
                + (f" (served {capacity:.2f} req/s)" if capacity is not None else "")
                + f"; the measured stage is not (mean TTFT {ttft:.0f} ms, below its {e2e - ttft:.0f} ms after "
                  "the first token): a queue's growth, not a latency, kept out of the statistics")

    def energy(self, entry: PointMapping, conv: Conversion) -> tuple[float, tuple[str, str, str], str]:
        from infersim.run.energy import EnergyUnavailable, run_energy

        result, config, notes = self.simulated(entry)
        energy = run_energy(result)
        if isinstance(energy, EnergyUnavailable):
            raise _Refused(energy.reason)
        step = energy.decode
        kind = max(step.seconds_by_kind, key=step.seconds_by_kind.__getitem__)
        share = step.seconds_by_kind[kind] / sum(step.seconds_by_kind.values())
        notes += [f"does not fit: {limit}" for limit in result.unfit]
        return (float(getattr(energy, ENERGY_FROM[conv.source])) * conv.multiply,
                (f"decode {kind}-bound", f"{100 * share:.0f}%", stage_confidence(result.decode, config).grade),
                "; ".join(notes))

    def memory(self, entry: PointMapping, conv: Conversion) -> tuple[float, tuple[str, str, str], str]:
        """The server's KV pool as it reports it at start (infersim.run.memory.reported_pool_tokens)."""
        from infersim.run.memory import logged_pool_tokens, memory_budget
        from infersim.run.simulate import prefill_step_tokens
        from infersim.run.speculative import drafter_memory

        config, notes = self.config(entry)
        if config.engine.memory.logged_kv_cache_size != "pool":
            raise _Refused(f"the KV pool as the server reports it is vLLM's count; {config.engine.name} counts its own")
        model, hw, dep, work = config.model, config.hardware, config.deployment, config.workload
        memory = memory_budget(model, hw, dep, work, drafter_memory(config), config.engine,
                               prefill_step_tokens(work, config.engine, hw, dep))
        tokens = logged_pool_tokens(memory, model, dep, config.engine, hw)
        if tokens is None:
            raise _Refused(f"{model.name} keeps recurrent states, which vLLM does not count in tokens")
        share = memory.kv_capacity_bytes / memory.hbm_bytes
        return (tokens * conv.multiply, ("kv cache", f"{100 * share:.0f}% of HBM", ""),
                "; ".join([*notes, f"KV space {memory.kv_capacity_bytes / 1e9:.2f} GB per GPU beside "
                                   f"{memory.weights_bytes / 1e9:.2f} GB of weights and "
                                   f"{memory.reserved_bytes / 1e9:.2f} GB the engine keeps"]))

    def value(self, entry: PointMapping, key: str, conv: Conversion) -> tuple[float, tuple[str, str, str], str]:
        if entry.kind in MEMORY_KINDS:
            return self.memory(entry, conv)
        if entry.kind in KERNEL_KINDS:
            return self.kernel(entry, key, conv)
        if entry.kind in STAGE_KINDS:
            return self.stage(entry, conv)
        if entry.kind in ENERGY_KINDS:
            return self.energy(entry, conv)
        return self.serving(entry, conv)


def _stage_row(out: dict[str, Any], stage: int, pid: str) -> dict[str, Any]:
    """The row of load stage `stage` of a staged serving result."""
    for row in out.get("stages") or []:
        if row.get("stage") == stage:
            return row
    raise InferSimError(f"{pid}: the serving result has no load stage {stage}")


def _serving_grade(config: Any) -> str:
    """The grade of a serving run: that of its prefill and decode steps together, by their shares
    (the serving simulator prices its steps with the same kernels)."""
    from infersim.run.simulate import simulate

    try:
        result = simulate(config)
    except InferSimError:
        origin = table_origin(config)
        return origin.grade if origin is not None else ROOFLINE
    return run_grade(stage_confidence(result.prefill, config), stage_confidence(result.decode, config))


def _unit(point: ReferencePoint, key: str, conv: Conversion) -> str:
    return conv.unit or point.unit


def evaluate(reference: dict[str, ReferencePoint], mapping: dict[str, PointMapping], *,
             reference_path: str = "", points_file: str = "points.yaml", mfu_tables: str | None = None,
             only: Sequence[str] = (), calibration: str | None = None) -> Validation:
    """Compare every reference point (or only the ids in `only`: point ids or '<id>/<sub-metric>');
    with `calibration`, the points on the profile's GPU and engine run calibrated."""
    if only:
        known = set(reference)
        for pid, point in reference.items():
            if isinstance(point.value, dict):
                known.update(f"{pid}/{k}" for k in point.value)
        unknown = [i for i in only if i not in known]
        if unknown:
            raise InferSimError(f"unknown point id(s) {', '.join(unknown)}: not in {reference_path or 'the reference'}")
    wanted = set(only)
    check_units(reference, mapping, reference_path or "the reference", points_file, wanted)
    evaluator = _Evaluator(points_file, mfu_tables, calibration)
    described = {None: "auto: stage and serving runs use the bundled tables of their device and engine; kernel "
                       "points the roofline", "auto": None, "none": "none (roofline)"}
    out = Validation(reference_path, points_file,
                     described.get(mfu_tables) or described[None] if mfu_tables in described else mfu_tables)
    for pid, point in reference.items():
        entry = mapping.get(pid)
        kind = entry.kind if entry else "-"
        keys = list(point.value) if isinstance(point.value, dict) else [""]
        selected = [k for k in keys if not wanted or pid in wanted or f"{pid}/{k}" in wanted]
        if not selected:
            continue
        if entry is None:
            out.not_expressed.append(NotExpressed(pid, point.source, kind, f"no entry for this point in {points_file}"))
            continue
        if entry.not_expressed:
            out.not_expressed.append(NotExpressed(pid, point.source, kind, entry.not_expressed))
            continue
        if isinstance(point.value, dict) == ("" in entry.metrics):
            has = "one number" if not isinstance(point.value, dict) else "sub-metrics " + ", ".join(keys)
            raise InferSimError(f"{points_file}: {pid}: the entry gives "
                                f"{'`metric`' if '' in entry.metrics else '`metrics`'} but the reference point's "
                                f"value is {has}")
        refused = ""
        for key in selected:
            cid = f"{pid}/{key}" if key else pid
            conv = entry.metrics.get(key)
            if conv is None:
                out.not_expressed.append(NotExpressed(cid, point.source, kind,
                                                      f"no conversion for sub-metric '{key}' in {points_file}"))
                continue
            if refused:
                out.not_expressed.append(NotExpressed(cid, point.source, kind, refused))
                continue
            try:
                predicted, module, note = evaluator.value(entry, key, conv)
            except _Refused as exc:
                refused = str(exc)
                out.not_expressed.append(NotExpressed(cid, point.source, kind, refused))
                continue
            measured = point.value[key] if isinstance(point.value, dict) else point.value
            outlier = entry.accepted_outlier or evaluator.overload(entry, key, point.value)
            out.comparisons.append(Comparison(cid, pid, point.source, entry.kind, entry.family, float(measured),
                                              predicted, _unit(point, key, conv), module[0], module[1], note,
                                              outlier, module[2]))
    return out
