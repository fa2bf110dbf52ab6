"""Import NVIDIA aiconfigurator's collected kernel database into the project's table format.

aiconfigurator (https://github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships measured kernel
times per GPU ("system"), serving engine ("framework": trtllm, sglang, vllm) and engine version in
the package `aiconfigurator-core`, under `aiconfigurator_core/systems/data/`:

    <system>/<family>/<framework>/<version>/<table>_perf.parquet    one row per measured kernel
    <system>/<family>/<framework>/<version>/collection_meta.yaml    status of each table
    aiconfigurator_core/systems/query_versions.yaml                 each engine's current version

What each table becomes, and the conversion: infersim.tabletools.aiconfigurator_convert (pure functions of
the records). Latencies there are in milliseconds; the output is one directory per device and engine
version, `<out>/<device>/<framework>-<version>/`.

Not imported (listed in the provenance notes): MLA module tables, DSA/MSA, linear attention, DeepEP / NCCL
all-to-all (EP token exchange stays with the hardware card's model), WideEP tables.

Reading parquet needs pyarrow (the optional extra `aic`: pip install '.[aic]' in a clone). A table may
also be given as a CSV with the same columns (tests do so, needing neither package).
"""

from __future__ import annotations

import csv
import datetime as _dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from infersim.base.errors import ConfigError, InferSimError
from infersim.cards.schema import load_yaml
from infersim.tabletools.aiconfigurator_convert import (
    convert_collectives,
    convert_context_attention,
    convert_gemm,
    convert_generation_attention,
    convert_mla,
    convert_moe,
)
from infersim.tables.format import (
    FORMAT_VERSION,
    MAX_EFFICIENCY,
    DeviceInfo,
    Provenance,
    Row,
    TableDirectory,
    TableInfo,
    efficiency_of,
)
from infersim.tables.output import check_output_dir, write_table_dir
from infersim.tables.select import version_key
from infersim.tabletools.thinning import DEFAULT_TOLERANCE, thin_rows

PACKAGE = "aiconfigurator-core"
PROJECT = "NVIDIA aiconfigurator (aiconfigurator-core), Apache-2.0"
URL = "https://github.com/ai-dynamo/aiconfigurator"
LICENSE_NOTICE = ("Apache-2.0: the numbers in this directory are converted from NVIDIA aiconfigurator's collected "
                  "performance database (Copyright (c) NVIDIA CORPORATION & AFFILIATES, licensed under the Apache "
                  "License, Version 2.0, http://www.apache.org/licenses/LICENSE-2.0); converted by InferSim "
                  "(units, layout, FLOP split of MoE times), values otherwise unchanged")
MISSING_EXTRA = ("importing aiconfigurator's tables needs aiconfigurator-core and pyarrow: pip install "
                 "aiconfigurator-core pyarrow (or, in the infersim clone: pip install '.[aic]')")

#: our hardware card -> aiconfigurator system directory
SYSTEMS: dict[str, str] = {
    "h100-sxm": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "gb200": "gb200",
    "b300": "b300_sxm",
    "gb300": "gb300",
    "a100-sxm-80g": "a100_sxm",  # its tables are from an "NVIDIA A100-SXM4-80GB" (the rows' device column)
    "l40s": "l40s",
    "rtx-pro-6000": "rtx_pro_6000_server",
}
#: why a system's tables serve only the card they are mapped to, where a sibling card exists
MAPPING_NOTES: dict[str, str] = {
    "a100-sxm-80g": "measured on an NVIDIA A100-SXM4-80GB (the rows' device column; systems/a100_sxm.yaml "
                    "mem_capacity 80 GiB): mapped to hardware card a100-sxm-80g only; a100-sxm-40g (HBM2 at 1,555 "
                    "GB/s, not 2,039) gets no tables, since its memory-bound kernels would be timed 1.3x too fast",
}
FRAMEWORKS: tuple[str, ...] = ("trtllm", "sglang", "vllm")
LIBRARY = {"trtllm": "TensorRT-LLM", "sglang": "SGLang", "vllm": "vLLM"}
#: how a MoE table's description names its format
MOE_TABLE_FORMATS: dict[str, str] = {"fp4": "fp4 (NVFP4)", "w4a16_mxfp4": "bf16 activations x MXFP4 weights",
                                     "w4a8_mxfp4_mxfp8": "fp8 (MXFP8) activations x MXFP4 weights"}



# ---------------------------------------------------------------------------------------------
# Locating and reading the package data


@dataclass(frozen=True)
class AicSource:
    """Where aiconfigurator's data are: `systems/` (with query_versions.yaml and data/) and the package version."""

    systems_dir: Path
    package_version: str

    @property
    def data_dir(self) -> Path:
        return self.systems_dir / "data"


def installed_source() -> AicSource:
    """The installed aiconfigurator-core's data, or one clear error naming the extra to install."""
    try:
        import aiconfigurator_core  # type: ignore[import-not-found]
    except ImportError:
        raise InferSimError(MISSING_EXTRA) from None
    try:
        from importlib.metadata import version

        package_version = version(PACKAGE)
    except Exception:  # noqa: BLE001 - metadata missing in an odd install: say so in the provenance
        package_version = "unknown"
    systems = Path(aiconfigurator_core.__file__).parent / "systems"
    if not (systems / "data").is_dir():
        raise InferSimError(f"{systems / 'data'}: not found; this aiconfigurator-core ({package_version}) does not "
                            f"ship its performance data where the importer expects it")
    return AicSource(systems, package_version)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Rows of one aiconfigurator table: parquet (needs pyarrow) or CSV with the same columns."""
    if path.suffix == ".csv":
        with path.open(newline="") as handle:
            return [dict(row) for row in csv.DictReader(handle)]
    try:
        import pyarrow.parquet as pq  # type: ignore[import-not-found]
    except ImportError:
        raise InferSimError(f"{path}: reading parquet needs pyarrow; {MISSING_EXTRA}") from None
    return pq.read_table(path).to_pylist()


def _read_yaml(path: Path) -> dict[str, Any]:
    """One of aiconfigurator's YAML files as a mapping ({} where empty), read as InferSim reads its
    own: text that is not UTF-8, a key given twice or nesting too deep is one message naming the file."""
    data = load_yaml(path, "aiconfigurator file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", data, "expected a mapping")
    return data


def _section(mapping: dict[str, Any], key: str, path: Path, field_: str) -> dict[str, Any]:
    """`mapping[key]`, a mapping ({} where absent or empty); anything else is refused naming `field_`."""
    value = mapping.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(str(path), field_, value, "expected a mapping")
    return value


def current_versions(systems_dir: Path) -> dict[tuple[str, str], str]:
    """(system, framework) -> the engine version aiconfigurator calls `current` (query_versions.yaml)."""
    path = systems_dir / "query_versions.yaml"
    if not path.is_file():
        return {}
    data = _read_yaml(path)
    defaults = _section(data, "defaults", path, "defaults")
    overrides = _section(data, "overrides", path, "overrides")
    result: dict[tuple[str, str], str] = {}
    for system in SYSTEMS.values():
        for framework in FRAMEWORKS:
            slot = (_section(_section(overrides, system, path, f"overrides.{system}"), framework, path,
                             f"overrides.{system}.{framework}")
                    or _section(defaults, framework, path, f"defaults.{framework}"))
            if slot.get("current"):
                result[(system, framework)] = str(slot["current"])
    return result


def elementwise_rule(systems_dir: Path, system: str) -> tuple[float | None, float | None, str]:
    """(share of HBM bandwidth, seconds per kernel, source) of aiconfigurator's rule for memory-bound
    ops on `system`: its estimates price norms, activations and other elementwise kernels
    analytically, bytes / (gpu.mem_bw x mem_bw_empirical_scaling_factor) + mem_empirical_constant_latency
    (systems/<system>.yaml; its estimator's memory-op latency), not from measurements.
    (None, None, "") where the system file or the factor is missing; the latency is None where the
    file has none."""
    path = systems_dir / f"{system}.yaml"
    if not path.is_file():
        return None, None, ""
    gpu = _section(_read_yaml(path), "gpu", path, "gpu")
    factor = gpu.get("mem_bw_empirical_scaling_factor")
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        return None, None, ""
    latency = gpu.get("mem_empirical_constant_latency")
    if not isinstance(latency, (int, float)) or isinstance(latency, bool) or not 0 <= latency <= 1e-3:
        latency = None
    constant = "" if latency is None else f" + mem_empirical_constant_latency {latency:g} s per op"
    return float(factor), None if latency is None else float(latency), (
        f"aiconfigurator's rule for memory-bound ops: systems/{system}.yaml mem_bw_empirical_scaling_factor "
        f"{factor:g}{constant}, 'nonofficial correction based on observations'")


def family_version_dir(data_dir: Path, system: str, family: str, framework: str, version: str) -> Path | None:
    """The directory serving `version` for one table family: the version itself, or else the newest
    older one (aiconfigurator fills missing families backward from older collections, never forward)."""
    base = data_dir / system / family / framework
    if (base / version).is_dir():
        return base / version
    if not base.is_dir():
        return None
    older = [p for p in base.iterdir() if p.is_dir() and version_key(p.name) < version_key(version)]
    return max(older, key=lambda p: version_key(p.name)) if older else None


def _table_file(directory: Path, stem: str) -> Path | None:
    for suffix in (".parquet", ".csv"):
        if (directory / f"{stem}{suffix}").is_file():
            return directory / f"{stem}{suffix}"
    return None


def collection_status(directory: Path, stem: str) -> str:
    """`<provenance>/<status>` of one table from collection_meta.yaml, e.g. 'collected/complete'."""
    path = directory / "collection_meta.yaml"
    if not path.is_file():
        return "no collection_meta.yaml"
    meta = _read_yaml(path)
    table = _section(_section(meta, "tables", path, "tables"), stem, path, f"tables.{stem}")
    return f"{meta.get('provenance', 'unstated')}/{table.get('status', 'unstated')}"


# ---------------------------------------------------------------------------------------------
# One device and engine version


NOT_IMPORTED = (
    "not imported: MLA module tables and mla_bmm (the MLA attention kernels are: context_mla, generation_mla), DSA/MSA (sparse_attention/, msa/), linear attention, mhc, quantize, "
    "encoder attention, WideEP MoE tables, MoE all-to-all (DeepEP) and NCCL all-to-all (the simulator times EP "
    "token exchange from the hardware card); collectives are one node only (the tables measure 2-8 GPUs)",
)


@dataclass(frozen=True)
class ImportPlan:
    device: str  # our hardware card name
    system: str  # aiconfigurator system
    framework: str
    version: str


def _card_of(device: str) -> Any:
    from infersim.run.config import load_hardware_card

    return load_hardware_card(device)[0]


def _peaks_of(device: str) -> dict[str, float]:
    """Dense bf16/fp8 (and fp4, where the card has it) peaks of our hardware card for the device
    (efficiency is relative to them)."""
    card = _card_of(device)
    return {d: card.peak_flops(d) for d in ("bf16", "fp8", "fp4") if d in card.peak.flops}


def _hbm_share(row: Row, card: Any) -> float:
    """The bytes a row's shape must read beyond L2, per second of its time, over the card's HBM peak:
    above 1 the loader refuses the row (MfuTables.check_hardware)."""
    from infersim.shapes.kernels import minimum_bytes

    beyond_l2 = minimum_bytes(row.shape()) - card.peak.l2_bytes
    return beyond_l2 / (row.latency_us * 1e-6 * card.peak.hbm_bandwidth)


#: a table with a row this far above the HBM peak disagrees with the bytes its shapes read (not a
#: boost clock or noise, a few percent): it is left out whole
HBM_IMPLAUSIBLE = 1.1


def convert_one(source: AicSource, plan: ImportPlan, compact: bool = False, tolerance: float = DEFAULT_TOLERANCE
                ) -> tuple[TableDirectory, list[str]] | None:
    """The table directory for one device and engine version, or None if the package has no data for it.
    `compact`: thinned where interpolating the kept points reproduces each left-out one within
    `tolerance` (infersim.tabletools.thinning)."""
    c = _Collection(source.data_dir, plan)
    _collect_compute_tables(c)
    _collect_collective_tables(c)
    peaks = _peaks_of(plan.device)
    _drop_tables_without_peak(c.tables, c.infos, peaks, plan.device, c.notes)
    if not c.tables:
        return None
    if compact:
        _thin(c.tables, c.infos, tolerance)
    return TableDirectory(provenance=_provenance(source, plan, c, peaks), tables=c.tables), c.notes


@dataclass
class _Collection:
    """The tables read so far from one aiconfigurator system and engine version, their descriptions,
    the notes on what was not found, and the device names the records give."""

    data: Path
    plan: ImportPlan
    tables: dict[str, tuple[Row, ...]] = field(default_factory=dict)
    infos: dict[str, TableInfo] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    device_names: set[str] = field(default_factory=set)

    def add(self, name: str, family: str, rows: list[Row], description: str, src: Path, status: str,
            table_notes: list[str], routing: str = "balanced", served: str = "") -> None:
        if not rows:
            return
        library = LIBRARY[self.plan.framework]
        self.tables[name] = tuple(rows)
        self.infos[name] = TableInfo(family=family, library=f"{library} (aiconfigurator collector)",  # type: ignore[arg-type]
                                     library_version=served or self.plan.version, description=description,
                                     source_file=str(src.relative_to(self.data)),
                                     notes=(f"collection status: {status}",) + tuple(table_notes), moe_routing=routing)

    def load(self, family: str, stem: str) -> tuple[list[dict[str, Any]], Path, str, str] | None:
        plan, data = self.plan, self.data
        directory = family_version_dir(data, plan.system, family, plan.framework, plan.version)
        if directory is None:
            self.notes.append(f"{family}/{stem}: no collection for {plan.framework} {plan.version} or older")
            return None
        path = _table_file(directory, stem)
        if path is None:
            self.notes.append(f"{family}/{stem}: not in {directory.relative_to(data)}")
            return None
        if directory.name != plan.version:
            self.notes.append(f"{stem}: taken from version {directory.name} (no {plan.version} collection; "
                              f"aiconfigurator serves it the same way, by backward fill)")
        records = read_records(path)
        self.device_names.update(str(r["device"]) for r in records[:1] if r.get("device"))
        return records, path, collection_status(directory, stem), directory.name


def _collect_compute_tables(c: _Collection) -> None:
    """GEMM, attention (MHA/GQA and MLA) and MoE tables."""
    found = c.load("gemm", "gemm_perf")
    if found:
        records, path, status, served = found
        for dtype, conv in sorted(convert_gemm(records, str(path)).items()):
            what = "fp4 (NVFP4)" if dtype == "fp4" else dtype
            c.add(f"gemm_{dtype}.csv", "gemm", conv.rows, f"dense GEMM, {what} inputs and weights, bf16 output",
                  path, status, conv.notes, served=served)
    found = c.load("attention", "context_attention_perf")
    if found:
        records, path, status, served = found
        conv = convert_context_attention(records, str(path))
        c.add("attention_prefill.csv", "attention", conv.rows,
              "causal prefill attention (MHA/GQA, full and sliding-window), one sequence",
              path, status, conv.notes, served=served)
    found = c.load("attention", "generation_attention_perf")
    if found:
        records, path, status, served = found
        conv = convert_generation_attention(records, str(path))
        c.add("attention_decode.csv", "attention", conv.rows,
              "decode attention (MHA/GQA, full and sliding-window), one query token",
              path, status, conv.notes, served=served)
    for stem, stage, name, what in (
            ("context_mla_perf", "prefill", "attention_prefill_mla.csv",
             "MLA prefill (no absorption) as MHA 192/128, one sequence"),
            ("generation_mla_perf", "decode", "attention_decode_mla.csv", "absorbed MLA decode, one query token")):
        found = c.load("mla", stem)
        if found:
            records, path, status, served = found
            conv = convert_mla(records, str(path), stage)
            c.add(name, "attention", conv.rows, what, path, status, conv.notes, served=served)
    found = c.load("moe", "moe_perf")
    if found:
        records, path, status, served = found
        for (label, routing), conv in sorted(convert_moe(records, str(path)).items()):
            c.add(f"grouped_gemm_{label}_{routing}.csv", "grouped_gemm", conv.rows,
                  f"routed experts of one MoE layer on one GPU, {MOE_TABLE_FORMATS.get(label, label)}, "
                  f"routing {routing}", path, status,
                  conv.notes, routing=routing, served=served)


def _collect_collective_tables(c: _Collection) -> None:
    """The engine's custom all-reduce and the newest NCCL collection (its all-reduce only where the
    engine has no custom one)."""
    plan, data = c.plan, c.data
    found = c.load("comm", "custom_allreduce_perf")
    custom = False
    if found:
        records, path, status, served = found
        conv = convert_collectives(records, str(path), f"{plan.framework}-custom-allreduce", ("all_reduce",))
        c.add("collective_allreduce.csv", "collective", conv.rows,
              f"{LIBRARY[plan.framework]} custom all-reduce (the engine's TP all-reduce), one node", path, status,
              conv.notes, served=served)
        custom = bool(conv.rows)
    nccl_base = data / plan.system / "comm" / "nccl"
    nccl_dirs = sorted((p for p in nccl_base.iterdir() if p.is_dir()), key=lambda p: version_key(p.name)) \
        if nccl_base.is_dir() else []
    nccl_path = _table_file(nccl_dirs[-1], "nccl_perf") if nccl_dirs else None
    if nccl_path is not None:
        kinds = ("all_gather", "reduce_scatter") + (() if custom else ("all_reduce",))
        conv = convert_collectives(read_records(nccl_path), str(nccl_path), "nccl", kinds)
        if custom:
            conv.notes.append("all_reduce rows not imported: the engine's custom all-reduce table times it")
        c.add("collective_nccl.csv", "collective", conv.rows, "NCCL collectives, one node", nccl_path,
              collection_status(nccl_dirs[-1], "nccl_perf"), conv.notes, served=f"nccl {nccl_dirs[-1].name}")


def _provenance(source: AicSource, plan: ImportPlan, c: _Collection, peaks: dict[str, float]) -> Provenance:
    """Where the imported tables came from, what they cover and what was left out."""
    infos, notes, device_names = c.infos, c.notes, c.device_names
    alphas = sorted({info.moe_routing for info in infos.values() if info.family == "grouped_gemm"})
    elementwise, elementwise_latency, elementwise_source = elementwise_rule(source.systems_dir, plan.system)
    return Provenance(
        format_version=FORMAT_VERSION,
        device=DeviceInfo(name=sorted(device_names)[0] if device_names else plan.device),
        peak_flops=peaks,
        origin="imported",
        measured_on="unknown",
        written_on=_dt.date.today().isoformat(),
        command="",  # set by the caller
        software={"package": PACKAGE, "package_version": source.package_version, "system": plan.system,
                  "framework": plan.framework, "framework_version": plan.version},
        source={"path": f"{PACKAGE} {source.package_version}: aiconfigurator_core/systems/data/{plan.system}",
                "project": PROJECT, "url": URL, "license": "Apache-2.0"},
        notes=(LICENSE_NOTICE,
               f"aiconfigurator system {plan.system}, {LIBRARY[plan.framework]} {plan.version} (the version "
               f"aiconfigurator {source.package_version} calls current unless chosen otherwise); latencies converted "
               f"from ms; efficiency relative to this hardware card's dense datasheet peaks",
               "MoE routing: " + (", ".join(alphas) + " (power-law exponent alpha: 1.01 DeepSeek/Kimi family, "
                                  "1.2 others); grouped-GEMM times already contain the expert-load imbalance"
                                  if alphas else "no MoE tables"),
               "measurement dates, clocks and driver are not in the package: unknown")
        + ((MAPPING_NOTES[plan.device],) if plan.device in MAPPING_NOTES else ())
        + NOT_IMPORTED + tuple(notes),
        elementwise_memory_efficiency=elementwise,
        elementwise_latency=elementwise_latency,
        elementwise_source=elementwise_source,
        tables=infos,
    )


def _drop_tables_without_peak(tables: dict[str, tuple[Row, ...]], infos: dict[str, TableInfo],
                              peaks: dict[str, float], device: str, notes: list[str]) -> None:
    """Tables of a format the hardware card has no peak for are left out (their efficiency would have
    no reference), with a note; so are rows the loader refuses: faster than MAX_EFFICIENCY x the peak
    of their dtype (TensorRT-LLM's MLA decode with an fp8 cache computes in fp8 while its rows name
    bf16, mla_dtype, and at large batch and context outruns the bf16 peak: B200 1.30 x at batch 512,
    kv 32,768), or beyond the card's HBM peak by a few percent (H100 SGLang decode rows at 1.05 x); a
    table with a row beyond HBM_IMPLAUSIBLE x the peak is left out whole (TensorRT-LLM 1.0's A100 decode
    attention: up to 1.68 x, 4.3 GB of KV cache in 1.24 ms)."""
    for name in sorted(tables):
        dtypes = {getattr(row, "dtype", None) for row in tables[name]} - {None}
        if infos[name].family == "collective":
            continue
        if not dtypes <= set(peaks):
            notes.append(f"{name} not written: hardware card {device} has no peak FLOP/s for "
                         f"{', '.join(sorted(dtypes - set(peaks)))}")
            del tables[name], infos[name]
            continue
        card = _card_of(device)
        worst = max((_hbm_share(r, card) for r in tables[name]), default=0.0)
        if worst > HBM_IMPLAUSIBLE:
            notes.append(f"{name} not written: a row reads the bytes its shape needs beyond L2 at {worst:.2f} x the "
                         f"{device} card's HBM peak, so the table's columns do not describe what was timed")
            del tables[name], infos[name]
            continue
        kept = tuple(r for r in tables[name] if efficiency_of(r, peaks[r.dtype]) <= MAX_EFFICIENCY)  # type: ignore[union-attr]
        physical = tuple(r for r in kept if _hbm_share(r, card) <= 1.0)
        dropped = {f"faster than {MAX_EFFICIENCY:g} x the {device} card's peak for their dtype (the kernel computes "
                   f"in a narrower format than the row names, e.g. fp8-cache MLA decode)": len(tables[name]) - len(kept),
                   f"reading the bytes their shape needs beyond L2 up to {HBM_IMPLAUSIBLE - 1:.0%} faster than the "
                   f"{device} card's HBM peak (boost or noise; the loader refuses them)": len(kept) - len(physical)}
        infos[name] = replace(infos[name], notes=infos[name].notes + tuple(
            f"{count} rows not written: {why}" for why, count in dropped.items() if count))
        tables[name] = physical


def _thin(tables: dict[str, tuple[Row, ...]], infos: dict[str, TableInfo], tolerance: float) -> None:
    """Thin every table in place (collectives are kept whole) and say so in its notes."""
    for name, rows in tables.items():
        if infos[name].family == "collective":
            continue
        thinned = thin_rows(rows, tolerance)
        tables[name] = thinned.rows
        infos[name] = replace(infos[name], notes=infos[name].notes + (
            f"thinned: {thinned.kept_points} of {thinned.total_points} grid points kept along each row's innermost "
            f"axis; every point left out is reproduced within {tolerance:.0%} by interpolating the kept ones "
            f"(largest {thinned.worst_error:.1%}); the first point of each row and its last two are kept",))


def compressed(table_dir: TableDirectory) -> TableDirectory:
    """The same tables under gzip-compressed file names (<name>.csv.gz)."""
    def gz(name: str) -> str:
        return name if name.endswith(".gz") else f"{name}.gz"

    prov = replace(table_dir.provenance, tables={gz(n): i for n, i in table_dir.provenance.tables.items()})
    return TableDirectory(provenance=prov, tables={gz(n): rows for n, rows in table_dir.tables.items()})


def plans_for(source: AicSource, devices: Sequence[str] | None, frameworks: Sequence[str] | None,
              version: str | None) -> list[ImportPlan]:
    devices = list(devices) if devices else list(SYSTEMS)
    unknown = [d for d in devices if d not in SYSTEMS]
    if unknown:
        raise InferSimError(f"--devices: no aiconfigurator system known for {unknown[0]} "
                            f"(known: {', '.join(SYSTEMS)})")
    frameworks = list(frameworks) if frameworks else list(FRAMEWORKS)
    bad = [f for f in frameworks if f not in FRAMEWORKS]
    if bad:
        raise InferSimError(f"--frameworks: {bad[0]} is not one of {', '.join(FRAMEWORKS)}")
    current = current_versions(source.systems_dir)
    plans = []
    for device in devices:
        system = SYSTEMS[device]
        for framework in frameworks:
            chosen = version or current.get((system, framework))
            if chosen is None:
                continue
            plans.append(ImportPlan(device, system, framework, chosen))
    return plans


def import_aiconfigurator(out_root: Path, command: str, devices: Sequence[str] | None = None,
                          frameworks: Sequence[str] | None = None, version: str | None = None,
                          compact: bool = False, source: AicSource | None = None,
                          tolerance: float = DEFAULT_TOLERANCE, force: bool = False) -> list[Path]:
    """Convert and write one directory per device and engine version; returns the directories written.
    A directory already holding anything is refused unless `force` (infersim.tables.output)."""
    source = source or installed_source()
    written: list[Path] = []
    plans = plans_for(source, devices, frameworks, version)
    for plan in plans:  # every output checked before any is written
        check_output_dir(Path(out_root) / plan.device / f"{plan.framework}-{plan.version}", force)
    for plan in plans:
        result = convert_one(source, plan, compact, tolerance)
        if result is None:
            continue
        table_dir, _ = result
        prov = replace(table_dir.provenance, command=command)
        directory = Path(out_root) / plan.device / f"{plan.framework}-{plan.version}"
        if compact:  # bundled: gzip-compressed CSV (mfu_tables/FORMAT.md), a fifth of the bytes
            table_dir = compressed(TableDirectory(provenance=prov, tables=table_dir.tables))
            prov = table_dir.provenance
        write_table_dir(directory, TableDirectory(provenance=prov, tables=table_dir.tables), force)
        written.append(directory)
    if not written:
        raise InferSimError(f"{source.data_dir}: no tables found for devices {devices or list(SYSTEMS)}, "
                            f"frameworks {frameworks or list(FRAMEWORKS)}, version {version or 'current'}")
    return written
