"""Import the kernel tables published with the original InferSim into the project's format.

Source layout (SRC_DIR, e.g. ../shared/reference/infersim_bench_data):
  gemm/<dev>/data.csv                      m,k,n,latency_us,mfu
  grouped_gemm/{prefill,decode}/<dev>/data.csv
                                           num_experts,num_gpus,num_local_experts,topk,hidden_size,
                                           intermediate_size,{seq_len,batch_size}_per_gpu,
                                           tokens_per_expert,up_proj_us,up_mfu,down_proj_us,down_mfu
  mha/prefill/<dev>/<heads>-<kv_heads>-<head_dim>.csv      dtype,seq_len,latency_us,mfu
  mha/decode/<dev>/<heads>-<kv_heads>-<head_dim>.csv       dtype,kv_dtype,batch_size,kv_len,latency_us,mfu
  mla/decode/<dev>/<heads>-<kv_lora_rank>-<rope>.csv       as mha decode
  mla/prefill/<dev>/<heads>-<qk_nope>-<rope>.csv           as mha prefill (v dim = qk_nope)
  dsa/, gdn/                               not imported (reasons in _SKIPPED_FAMILIES, repeated in the
                                           provenance notes); the simulator times GDN and DSA by roofline
Some files lack the header row; it is then inferred from the table kind.

The published `mfu` is relative to a dense peak the files do not name. The importer finds it:
for every row it computes the throughput the latency implies (FLOPs of the simulator's kernel
shape / latency) and divides by the published mfu; the median of that implied peak picks the
dtype whose datasheet peak is nearest. Latency is kept as the measurement; efficiency is
recomputed from it; the published mfu stays beside it (column source_mfu).
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from infersim.cards.schema import check_number
from infersim.base.errors import MISSING, ConfigError, InferSimError
from infersim.tables.format import (
    AttentionRow,
    DeviceInfo,
    FORMAT_VERSION,
    GemmRow,
    GroupedGemmRow,
    MAX_EFFICIENCY,
    Provenance,
    Row,
    TableDirectory,
    TableInfo,
    efficiency_of,
)
from infersim.tables.output import check_output_dir, write_table_dir

PROJECT = "original InferSim (Alibaba, Apache-2.0)"

#: what the InferSim technical report says ran each kind of kernel (the files do not record it)
LIBRARY_GEMM = "DeepGEMM"
LIBRARY_ATTENTION = "FlashInfer / FlashAttention-3"
LIBRARY_NOTE = ("library as stated by the InferSim technical report for this kernel kind; the source "
                "file does not record which library or version produced it")


@dataclass(frozen=True)
class PublishedDevice:
    name: str
    sm_count: int
    peak_flops: dict[str, float]
    memory_bytes: float
    l2_bytes: float


#: datasheet dense peaks of the devices the published tables cover (same values as hardware/*.yaml)
PUBLISHED_DEVICES: dict[str, PublishedDevice] = {
    "h20": PublishedDevice("NVIDIA H20", 78, {"bf16": 148e12, "fp8": 296e12}, 96e9, 62914560),
    "h800": PublishedDevice("NVIDIA H800 SXM", 132, {"bf16": 989.4e12, "fp8": 1978.9e12}, 80e9, 52428800),
}

_HEADERS = {
    "mha/decode": ["dtype", "kv_dtype", "batch_size", "kv_len", "latency_us", "mfu"],
    "mla/decode": ["dtype", "kv_dtype", "batch_size", "kv_len", "latency_us", "mfu"],
    "mha/prefill": ["dtype", "seq_len", "latency_us", "mfu"],
    "mla/prefill": ["dtype", "seq_len", "latency_us", "mfu"],
    "gemm": ["m", "k", "n", "latency_us", "mfu"],
}
_SKIPPED_FAMILIES = {
    "dsa": "DeepSeek sparse attention (DSA) kernels: the table format has no family for the indexer logits or "
           "for sparse MLA keyed by its top-k; the simulator times both by roofline",
    "gdn": "gated DeltaNet (GDN) kernels: the table format has no GDN family, and the file names' layout fields "
           "are undocumented (the H20 files named ...-32-... and ...-64-... hold identical numbers), so the head "
           "layout measured cannot be established; the simulator times GDN by roofline",
}


@dataclass
class _TableBuild:
    family: str
    rows: list[Row]
    description: str
    source_file: str
    library: str
    notes: list[str]


def _read_rows(path: Path, kind: str) -> tuple[list[dict[str, str]], list[str]]:
    """Rows as dicts, and notes (e.g. a missing header row that was inferred)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            numbered = [(reader.line_num, cells) for cells in reader if cells and any(c.strip() for c in cells)]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InferSimError(f"{path}: not a readable text CSV file ({exc})") from None
    except OSError as exc:
        raise InferSimError(f"{path}: cannot read file: {exc.strerror or exc}") from None
    lines = [cells for _, cells in numbered]
    if not lines:
        return [], [f"{path.name}: empty"]
    first = [c.strip() for c in lines[0]]
    notes: list[str] = []
    expected = _HEADERS.get(kind)
    if expected is not None and not any(c in expected for c in first):
        if len(first) != len(expected):
            raise InferSimError(f"{path}: no header row and {len(first)} columns; expected {','.join(expected)}")
        header, body = expected, lines
        notes.append(f"source file has no header row; columns taken as {','.join(expected)}")
    else:
        header, body = first, lines[1:]
    numbers = [n for n, _ in numbered][len(lines) - len(body):]
    return [{**dict(zip(header, (c.strip() for c in cells))), _WHERE: f"{path}:{n}"}
            for n, cells in zip(numbers, body)], notes


_WHERE = "\0where"  # key of a row's "file:line" (no CSV header can hold a NUL)


def _cell(row: dict[str, str], column: str, whole: bool) -> Any:
    """A numeric cell through the number rule (finite; whole and positive for counts, positive
    latencies), so a bad source row is one message naming file, line and column."""
    where = row.get(_WHERE, "")
    if column not in row or row[column] == "":
        raise ConfigError(where, column, MISSING, "required column is empty or missing")
    bounds = {"gt": 0} if whole or column.endswith("_us") else {"ge": 0}
    return check_number(row[column], where, column, whole=whole, **bounds)


def _text(row: dict[str, str], column: str) -> str:
    if not row.get(column):
        raise ConfigError(row.get(_WHERE, ""), column, MISSING, "required column is empty or missing")
    return row[column]


def _int(row: dict[str, str], column: str) -> int:
    return int(_cell(row, column, True))


def _float(row: dict[str, str], column: str) -> float:
    return float(_cell(row, column, False))


def _devices_in(src: Path) -> list[str]:
    found = set()
    for pattern in ("gemm/*/data.csv", "grouped_gemm/*/*/data.csv", "mha/*/*/*.csv", "mla/*/*/*.csv"):
        for path in src.glob(pattern):
            found.add(path.parent.name)
    return sorted(found)


def _layout(path: Path) -> tuple[int, int, int]:
    parts = path.stem.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise InferSimError(f"{path}: file name must be <a>-<b>-<c>.csv (head layout), got {path.name}")
    a, b, c = (int(p) for p in parts)
    return a, b, c


def _dedupe(rows: list[Row], key_fields: Sequence[str]) -> tuple[list[Row], list[str]]:
    """Merge rows measured at the same point: identical repeats dropped, differing ones -> median."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        groups.setdefault(tuple(getattr(row, f) for f in key_fields), []).append(row)
    merged: list[Row] = []
    identical = differing = 0
    for members in groups.values():
        if len(members) == 1:
            merged.append(members[0])
            continue
        latencies = [m.latency_us for m in members]
        if len(set(latencies)) == 1:
            identical += len(members) - 1
            merged.append(members[0])
        else:
            differing += len(members) - 1
            merged.append(replace(members[0], latency_us=statistics.median(latencies), source_mfu=None))
    notes = []
    if identical:
        notes.append(f"{identical} repeated rows identical to an earlier row were dropped")
    if differing:
        notes.append(f"{differing} rows repeating a measured point with another latency were merged (median)")
    return merged, notes


def _nonempty(records: list[dict[str, str]], path: Path) -> list[dict[str, str]]:
    if not records:
        raise InferSimError(f"{path}: no data rows (an empty table cannot be imported: remove the file, or its "
                            "device directory)")
    return records


def _check_efficiency(rows: Sequence[Row], wheres: Sequence[str], device: PublishedDevice,
                      dtype: str | None = None) -> None:
    """Every source row's latency must imply at most MAX_EFFICIENCY of the device's peak (what every
    table loader accepts), checked here where the message can name the source file and line."""
    for row, where in zip(rows, wheres):
        fmt = dtype or row.dtype
        if fmt not in device.peak_flops:
            raise ConfigError(where, "dtype", fmt, f"no datasheet peak for {fmt} on {device.name} "
                              f"(known: {', '.join(sorted(device.peak_flops))})")
        efficiency = efficiency_of(replace(row, dtype=fmt), device.peak_flops[fmt])
        if efficiency > MAX_EFFICIENCY:
            column = getattr(row, "projection", "")
            raise ConfigError(where, f"{column}_proj_us" if column else "latency_us", row.latency_us,
                              f"implies efficiency {efficiency:.3g} of the {fmt} peak {device.peak_flops[fmt]:.4g} "
                              f"FLOP/s: faster than the device can run (at most {MAX_EFFICIENCY:g} is accepted, for "
                              "boost clocks and measurement noise); a latency in the wrong unit?")


def _implied_dtype(rows: Sequence[Row], device: PublishedDevice) -> tuple[str, str]:
    """The dtype whose peak the published mfu is relative to, and a note showing the evidence."""
    implied = [r.shape().flops / (r.latency_us * 1e-6) / r.source_mfu for r in rows
               if r.source_mfu and r.source_mfu >= 0.05]
    achieved = max(r.shape().flops / (r.latency_us * 1e-6) for r in rows)
    if not implied:
        raise InferSimError("cannot infer the peak the published mfu refers to: no row with mfu >= 0.05")
    median = statistics.median(implied)
    dtype = min(device.peak_flops, key=lambda d: abs(math.log(device.peak_flops[d] / median)))
    note = (f"published mfu is relative to the {dtype} peak {device.peak_flops[dtype]:.4g} FLOP/s: the median "
            f"peak it implies (FLOPs/latency/mfu over {len(implied)} rows with mfu >= 0.05) is {median:.4g}; "
            f"highest achieved throughput {achieved:.4g} FLOP/s")
    if dtype != "bf16" and achieved > device.peak_flops.get("bf16", math.inf):
        note += f" exceeds the bf16 peak {device.peak_flops['bf16']:.4g}, so the kernels ran {dtype}"
    return dtype, note


def _with_dtype(rows: Sequence[Row], dtype: str) -> list[Row]:
    return [replace(r, dtype=dtype) for r in rows]


def _import_gemm(path: Path, device: PublishedDevice, rel: str) -> _TableBuild:
    records, notes = _read_rows(path, "gemm")
    rows: list[Row] = [GemmRow(dtype="fp8", m=_int(r, "m"), k=_int(r, "k"), n=_int(r, "n"),
                               latency_us=_float(r, "latency_us"), source_mfu=_float(r, "mfu"))
                       for r in _nonempty(records, path)]
    measured = list(rows)
    rows, dedupe_notes = _dedupe(rows, ("m", "k", "n"))
    dtype, dtype_note = _implied_dtype(rows, device)
    _check_efficiency(measured, [r[_WHERE] for r in records], device, dtype)
    rows = _with_dtype(rows, dtype)
    rows.sort(key=lambda r: (r.k, r.n, r.m))
    return _TableBuild("gemm", rows, f"dense GEMM, {dtype} inputs and weights, over M for each (K, N)", rel,
                       LIBRARY_GEMM, notes + dedupe_notes + [dtype_note, LIBRARY_NOTE])


def _import_grouped(path: Path, stage: str, device: PublishedDevice, rel: str) -> _TableBuild:
    records, notes = _read_rows(path, f"grouped_gemm/{stage}")
    tokens_column = "seq_len_per_gpu" if stage == "prefill" else "batch_size_per_gpu"
    rows: list[Row] = []
    wheres: list[str] = []
    skipped = []
    for r in _nonempty(records, path):
        experts, gpus, local = _int(r, "num_experts"), _int(r, "num_gpus"), _int(r, "num_local_experts")
        if experts % gpus or experts // gpus != local:
            skipped.append(f"num_experts={experts} num_gpus={gpus} num_local_experts={local} "
                           f"hidden={r.get('hidden_size')} {tokens_column}={r.get(tokens_column)}")
            continue
        common = dict(dtype="fp8", stage=stage, num_experts=experts, ep=gpus, topk=_int(r, "topk"),
                      hidden=_int(r, "hidden_size"), intermediate=_int(r, "intermediate_size"), gated=True,
                      tokens_per_gpu=_int(r, tokens_column))
        rows.append(GroupedGemmRow(projection="up", latency_us=_float(r, "up_proj_us"),
                                   source_mfu=_float(r, "up_mfu"), **common))  # type: ignore[arg-type]
        rows.append(GroupedGemmRow(projection="down", latency_us=_float(r, "down_proj_us"),
                                   source_mfu=_float(r, "down_mfu"), **common))  # type: ignore[arg-type]
        wheres += [r[_WHERE]] * 2
    if not rows:
        raise InferSimError(f"{path}: no row can be keyed ({len(skipped)} rows with num_local_experts != "
                            "num_experts/num_gpus)")
    measured = list(rows)
    if skipped:
        notes.append(f"{len(skipped)} source rows skipped because num_local_experts != num_experts/num_gpus "
                     f"(inconsistent, cannot be keyed): " + "; ".join(skipped))
    rows, dedupe_notes = _dedupe(rows, ("stage", "projection", "num_experts", "ep", "topk", "hidden",
                                        "intermediate", "tokens_per_gpu"))
    dtype, dtype_note = _implied_dtype(rows, device)
    _check_efficiency(measured, wheres, device, dtype)
    rows = _with_dtype(rows, dtype)
    rows.sort(key=lambda r: (r.num_experts, r.topk, r.hidden, r.intermediate, r.projection, r.ep, r.tokens_per_gpu))
    return _TableBuild(
        "grouped_gemm", rows,
        f"routed-expert grouped GEMM ({stage}), {dtype}: 'up' is gate+up fused (n = 2 x intermediate), "
        f"'down' is the down projection; tokens_per_gpu is the published {tokens_column}; "
        f"experts spread evenly over ep = num_gpus GPUs",
        rel, LIBRARY_GEMM, notes + dedupe_notes + [dtype_note, LIBRARY_NOTE])


def _attention_rows(records: list[dict[str, str]], kind: str, stage: str, heads: int, kv_heads: int,
                    qk: int, v: int) -> list[Row]:
    rows: list[Row] = []
    for r in records:
        dtype = _text(r, "dtype")
        if stage == "decode":
            batch, q_len, kv_len, kv_dtype = _int(r, "batch_size"), 1, _int(r, "kv_len"), _text(r, "kv_dtype")
        else:
            batch, q_len, kv_len, kv_dtype = 1, _int(r, "seq_len"), _int(r, "seq_len"), dtype
        rows.append(AttentionRow(kind=kind, stage=stage, dtype=dtype, kv_dtype=kv_dtype,  # type: ignore[arg-type]
                                 num_heads=heads, num_kv_heads=kv_heads, qk_head_dim=qk, v_head_dim=v,
                                 causal=True, batch=batch, q_len=q_len, kv_len=kv_len,
                                 latency_us=_float(r, "latency_us"), source_mfu=_float(r, "mfu")))
    return rows


def _import_attention(path: Path, family: str, stage: str, device: PublishedDevice, rel: str) -> _TableBuild:
    records, notes = _read_rows(path, f"{family}/{stage}")
    a, b, c = _layout(path)
    if family == "mha":
        kind, heads, kv_heads, qk, v = "mha", a, b, c, c
        layout = f"MHA/GQA {heads} query heads, {kv_heads} KV heads, head dim {qk}"
    elif stage == "decode":
        kind, heads, kv_heads, qk, v = "mla", a, 1, b + c, b
        layout = (f"MLA decode (weights absorbed) {heads} heads over one latent KV head: "
                  f"kv_lora_rank {b} + rope {c} = qk dim {qk}, v dim {v}")
    else:
        # MLA prefill without absorption is plain MHA: K has nope + rope dims, V has the nope dim
        kind, heads, kv_heads, qk, v = "mha", a, a, b + c, b
        layout = (f"MLA prefill (no absorption, i.e. MHA) {heads} heads: qk dim {b} nope + {c} rope = {qk}, "
                  f"v dim {v} (assumed equal to qk_nope, as in DeepSeek-V3)")
    rows = _attention_rows(_nonempty(records, path), kind, stage, heads, kv_heads, qk, v)
    _check_efficiency(rows, [r[_WHERE] for r in records], device)
    key_fields = ("dtype", "kv_dtype", "batch", "q_len", "kv_len")
    rows, dedupe_notes = _dedupe(rows, key_fields)
    peak = device.peak_flops["bf16"]
    implied = [r.shape().flops / (r.latency_us * 1e-6) / r.source_mfu for r in rows
               if r.source_mfu and r.source_mfu >= 0.05]
    check = (f"published mfu is relative to the bf16 peak {peak:.4g} FLOP/s (median implied peak "
             f"{statistics.median(implied):.4g} over {len(implied)} rows with mfu >= 0.05)") if implied else (
             f"published mfu taken relative to the bf16 peak {peak:.4g} FLOP/s (all rows below 0.05 mfu: "
             f"too coarse to check)")
    flops_note = ("FLOPs = 2 x batch x heads x attended query-key pairs x (qk dim + v dim), causal "
                  "(s(s+1)/2 pairs per head for a prefill of s tokens), as infersim.shapes.kernels.AttentionShape")
    rows.sort(key=lambda r: (r.kv_dtype, r.batch, r.kv_len))
    return _TableBuild("attention", rows, f"attention {stage}: {layout}", rel, LIBRARY_ATTENTION,
                       notes + dedupe_notes + [check, flops_note, LIBRARY_NOTE])


def import_device(src: Path, device_key: str) -> tuple[dict[str, _TableBuild], list[str]]:
    """All importable tables of one device under `src`, by output file name; and skipped files."""
    device = PUBLISHED_DEVICES[device_key]
    builds: dict[str, _TableBuild] = {}
    skipped: list[str] = []

    def rel(p: Path) -> str:
        return str(p.relative_to(src))

    gemm = src / "gemm" / device_key / "data.csv"
    if gemm.is_file():
        builds["gemm.csv"] = _import_gemm(gemm, device, rel(gemm))
    for stage in ("prefill", "decode"):
        path = src / "grouped_gemm" / stage / device_key / "data.csv"
        if path.is_file():
            builds[f"grouped_gemm_{stage}.csv"] = _import_grouped(path, stage, device, rel(path))
    for family in ("mha", "mla"):
        for stage in ("prefill", "decode"):
            for path in sorted((src / family / stage / device_key).glob("*.csv")):
                builds[f"attention_{stage}_{family}_{path.stem}.csv"] = _import_attention(
                    path, family, stage, device, rel(path))
    for family, why in _SKIPPED_FAMILIES.items():
        for path in sorted((src / family).glob(f"*/{device_key}/*.csv")):
            skipped.append(f"{rel(path)}: not imported ({why})")
    return builds, skipped


def import_infersim(src: Path, out: Path, command: str, devices: Sequence[str] | None = None,
                    force: bool = False) -> list[Path]:
    """Convert every device found under `src` into `out/<device>/`; returns the directories written.
    A directory already holding anything is refused unless `force` (infersim.tables.output)."""
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise InferSimError(f"InferSim benchmark data not found: {src} is not a directory")
    found = _devices_in(src)
    if not found:
        raise InferSimError(f"{src}: no InferSim kernel tables found (expected gemm/<device>/data.csv, "
                            f"mha/<stage>/<device>/*.csv, ...)")
    chosen = list(devices) if devices else found
    unknown = [d for d in chosen if d not in PUBLISHED_DEVICES]
    if unknown:
        raise InferSimError(f"{src}: no datasheet peaks known for device '{unknown[0]}' "
                            f"(known: {', '.join(sorted(PUBLISHED_DEVICES))})")
    for key in chosen:  # every output checked before any is written
        check_output_dir(out / key, force)
    today = _dt.date.today().isoformat()
    written = []
    for key in chosen:
        builds, skipped = import_device(src, key)
        if not builds:
            raise InferSimError(f"{src}: nothing importable for device '{key}'")
        device = PUBLISHED_DEVICES[key]
        prov = Provenance(
            format_version=FORMAT_VERSION,
            device=DeviceInfo(name=device.name, sm_count=device.sm_count, clocks={},
                              memory_bytes=device.memory_bytes, l2_bytes=device.l2_bytes),
            peak_flops=dict(device.peak_flops),
            origin="imported",
            measured_on="unknown",
            written_on=today,
            command=command,
            software={"torch": "unknown", "cuda": "unknown", "driver": "unknown",
                      "libraries": "DeepGEMM (GEMM, grouped GEMM); FlashInfer / FlashAttention-3 (attention), "
                                   "per the InferSim technical report; versions unknown"},
            source={"path": str(src), "project": PROJECT,
                    "url": "https://github.com/alibaba/InferSim (bench_data)", "license": "Apache-2.0"},
            notes=(
                "measurement date, clocks, driver, CUDA and library versions are not recorded in the "
                "source: unknown",
                "device name and SM count are the datasheet's for the directory name the source uses "
                f"('{key}'); peak_flops are dense datasheet peaks",
                "latency_us is the published latency; efficiency is recomputed from it and peak_flops; "
                "source_mfu is the published mfu (some rows disagree with their latency by up to ~20%: "
                "latency is taken as the measurement)",
            ) + tuple(skipped),
            tables={name: TableInfo(family=b.family, library=b.library,  # type: ignore[arg-type]
                                    library_version="unknown", description=b.description,
                                    source_file=b.source_file, notes=tuple(b.notes))
                    for name, b in builds.items()},
        )
        directory = out / key
        write_table_dir(directory, TableDirectory(prov, {n: tuple(b.rows) for n, b in builds.items()}), force)
        written.append(directory)
    return written
