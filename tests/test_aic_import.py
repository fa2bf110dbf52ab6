"""`infersim mfu import-aiconfigurator`: aiconfigurator's kernel tables converted number by number.

The fixtures are small tables in aiconfigurator's layout and column schema
(systems/data/<system>/<family>/<framework>/<version>/<table>.csv + collection_meta.yaml), written
as CSV so that neither aiconfigurator-core nor pyarrow is needed; one test writes parquet when
pyarrow is installed.
"""

from __future__ import annotations

from dataclasses import replace

import csv
import sys
from pathlib import Path

import pytest
import yaml

from infersim.cli.main import main
from infersim.base.errors import InferSimError
from infersim.shapes.kernels import GemmShape, GroupedGemmShape
from infersim.tabletools import aiconfigurator as aic
from infersim.tables.format import AttentionRow
from infersim.tables.table_files import read_table_dir
from infersim.tables.lookup import load_tables

H100_BF16 = 989.4e12
H100_FP8 = 1978.9e12
VERSION = "1.3.0rc20"


def write_table(directory: Path, stem: str, rows: list[dict], status: str = "complete") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    meta_path = directory / "collection_meta.yaml"
    meta = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else {
        "schema_version": 1, "provenance": "collected", "runtime": {"framework": "trtllm"}, "tables": {}}
    meta["tables"][stem] = {"status": status}
    meta_path.write_text(yaml.safe_dump(meta))


def gemm(dtype: str, m: int, n: int, k: int, ms: float) -> dict:
    return {"framework": "TRTLLM", "version": VERSION, "device": "NVIDIA H100 80GB HBM3", "op_name": "gemm",
            "kernel_source": "torch_flow", "gemm_dtype": dtype, "m": m, "n": n, "k": k, "latency": ms}


def attention(op: str, batch: int, isl: int, heads: int, kv_heads: int, head_dim: int, step: int, ms: float,
              window: int = 0, kv_dtype: str = "bfloat16") -> dict:
    return {"framework": "TRTLLM", "version": VERSION, "device": "NVIDIA H100 80GB HBM3", "op_name": op,
            "kernel_source": "torch_flow", "batch_size": batch, "isl": isl, "num_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim, "window_size": window, "beam_width": 1,
            "attn_dtype": "bfloat16", "kv_cache_dtype": kv_dtype, "step": step, "latency": ms}


def moe(dtype: str, tokens: int, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int,
        distribution: str, ms: float, source: str = "moe_torch_flow_cutlass") -> dict:
    return {"framework": "TRTLLM", "version": VERSION, "device": "NVIDIA H100 80GB HBM3", "op_name": "moe",
            "kernel_source": source, "moe_dtype": dtype, "num_tokens": tokens, "hidden_size": hidden,
            "inter_size": inter, "topk": topk, "num_experts": experts, "moe_tp_size": tp, "moe_ep_size": ep,
            "distribution": distribution, "latency": ms}


@pytest.fixture()
def package(tmp_path: Path) -> aic.AicSource:
    """A miniature aiconfigurator-core systems/ directory for h100_sxm / trtllm."""
    systems = tmp_path / "systems"
    systems.mkdir()
    (systems / "query_versions.yaml").write_text(yaml.safe_dump({
        "schema_version": 1, "defaults": {"trtllm": {"current": VERSION, "previous": None}}}))
    data = systems / "data" / "h100_sxm"
    gemm_rows = [gemm("bfloat16", m, n, k, 0.2 * m * n * k / 4096 ** 3 + 0.05)
                 for m in (1, 16, 128) for n in (4096, 8192) for k in (4096, 8192)]
    gemm_rows += [gemm("fp8", 16, 4096, 4096, 0.008), gemm("fp8_block", 16, 4096, 4096, 0.009)]
    write_table(data / "gemm" / "trtllm" / VERSION, "gemm_perf", gemm_rows)
    write_table(data / "attention" / "trtllm" / VERSION, "context_attention_perf", [
        attention("context_attention", 1, 1024, 32, 8, 128, 0, 0.0625),
        attention("context_attention", 1, 2048, 32, 8, 128, 0, 0.2),
        attention("context_attention", 4, 1024, 32, 8, 128, 0, 0.21),  # batch 4: not one sequence
        attention("context_attention", 1, 1024, 32, 8, 128, 0, 0.05, window=128),  # sliding window
        attention("context_attention", 1, 1024, 8, 16, 128, 0, 0.05),  # more KV heads than heads
    ])
    write_table(data / "attention" / "trtllm" / VERSION, "generation_attention_perf", [
        attention("generation_attention", 8, 1, 32, 8, 128, 1023, 0.03),
        attention("generation_attention", 8, 1, 32, 8, 128, 4095, 0.09, kv_dtype="fp8"),
    ])
    write_table(data / "moe" / "trtllm" / VERSION, "moe_perf", [
        moe("bfloat16", 64, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.3),
        moe("bfloat16", 128, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.36),
        moe("bfloat16", 256, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.9),  # spike: > 1.5 x the next
        moe("bfloat16", 512, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.5),
        moe("bfloat16", 64, 4096, 1536, 8, 128, 1, 8, "balanced", 0.25),  # not the family's routing
        moe("bfloat16", 64, 4096, 1536, 8, 128, 1, 8, "power_law_1.01", 0.28),
        moe("bfloat16", 4, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.1),  # 4 tokens over EP 8
        moe("bfloat16", 64, 4096, 1536, 8, 128, 2, 4, "power_law_1.2", 0.3),  # expert TP
        moe("fp8_block", 64, 7168, 2048, 8, 256, 1, 8, "power_law_1.01", 0.45),  # DeepSeek: block fp8 only
        moe("fp8_block", 64, 7168, 2048, 8, 256, 1, 8, "power_law_1.2", 0.4),
        moe("fp8", 64, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.2),
        moe("fp8_block", 64, 4096, 1536, 8, 128, 1, 8, "power_law_1.2", 0.21),  # per-tensor fp8 exists
        moe("bfloat16", 64, 4096, 14336, 2, 8, 1, 1, "power_law_1.2", 1.2, source="moe_torch_flow_nongated"),
    ])
    return aic.AicSource(systems, "0.12.0-fixture")


def imported(package: aic.AicSource, out: Path) -> Path:
    written = aic.import_aiconfigurator(out, "test command", devices=["h100-sxm"], source=package)
    assert written == [out / "h100-sxm" / f"trtllm-{VERSION}"]
    return written[0]


def test_gemm_rows_number_by_number(package: aic.AicSource, tmp_path: Path) -> None:
    directory = imported(package, tmp_path / "out")
    tables = read_table_dir(directory)
    bf16 = {(r.m, r.n, r.k): r.latency_us for r in tables.tables["gemm_bf16.csv"]}
    assert len(bf16) == 12
    # 0.2 * 16 * 8192 * 4096 / 4096^3 + 0.05 ms = 0.0515625 ms (physical: below the H100 peaks the tables are checked against)
    assert bf16[(16, 8192, 4096)] == pytest.approx(51.5625, rel=1e-9)
    fp8 = tables.tables["gemm_fp8.csv"]
    assert [(r.m, r.n, r.k, r.latency_us) for r in fp8] == [(16, 4096, 4096, pytest.approx(8.0))]
    text = (directory / "gemm_fp8.csv").read_text().splitlines()
    assert text[0] == "dtype,m,k,n,latency_us,efficiency,source_mfu"
    # efficiency = 2 * 16 * 4096 * 4096 / (8e-6 s * 1978.9e12 FLOP/s) = 0.0339122
    assert text[1] == "fp8,16,4096,4096,8,0.0339122,"
    info = tables.provenance.tables["gemm_fp8.csv"]
    assert "1 rows skipped: gemm_dtype fp8_block" in " ".join(info.notes)
    assert info.source_file == f"h100_sxm/gemm/trtllm/{VERSION}/gemm_perf.csv"
    assert "collection status: collected/complete" in info.notes


def test_attention_rows(package: aic.AicSource, tmp_path: Path) -> None:
    tables = read_table_dir(imported(package, tmp_path / "out"))
    prefill = tables.tables["attention_prefill.csv"]
    assert [(r.kind, r.stage, r.num_heads, r.num_kv_heads, r.qk_head_dim, r.batch, r.q_len, r.kv_len,
             r.latency_us, r.window) for r in prefill] == [
        ("mha", "prefill", 32, 8, 128, 1, 1024, 1024, pytest.approx(62.5), 0),
        ("mha", "prefill", 32, 8, 128, 1, 2048, 2048, pytest.approx(200.0), 0),
        ("mha", "prefill", 32, 8, 128, 1, 1024, 1024, pytest.approx(50.0), 128)]  # sliding window: kept
    notes = " ".join(tables.provenance.tables["attention_prefill.csv"].notes)
    assert "1 rows skipped: batch_size > 1" in notes and "window_size > 0 rows kept" in notes
    assert "1 rows skipped: num_key_value_heads not a divisor" in notes
    decode = tables.tables["attention_decode.csv"]
    # kv_len = isl + step: the 1023 cached tokens and the new one
    assert [(r.stage, r.kv_dtype, r.batch, r.q_len, r.kv_len, r.latency_us) for r in decode] == [
        ("decode", "bf16", 8, 1, 1024, pytest.approx(30.0)), ("decode", "fp8", 8, 1, 4096, pytest.approx(90.0))]


def test_moe_rows_split_by_flops_with_routing_recorded(package: aic.AicSource, tmp_path: Path) -> None:
    directory = imported(package, tmp_path / "out")
    tables = read_table_dir(directory)
    assert sorted(tables.tables) == [
        "attention_decode.csv", "attention_prefill.csv", "gemm_bf16.csv", "gemm_fp8.csv",
        "grouped_gemm_bf16_power_law_1.2.csv", "grouped_gemm_fp8_block_power_law_1.01.csv",
        "grouped_gemm_fp8_power_law_1.2.csv"]
    bf16 = tables.tables["grouped_gemm_bf16_power_law_1.2.csv"]
    gated = {(r.stage, r.projection, r.tokens_per_gpu): r.latency_us for r in bf16 if r.gated}
    # num_tokens 64 over EP 8 -> 8 tokens per GPU; 0.3 ms split 2/3 up, 1/3 down; both stages
    assert gated[("prefill", "up", 8)] == pytest.approx(200.0)
    assert gated[("decode", "down", 8)] == pytest.approx(100.0)
    assert gated[("prefill", "up", 16)] == pytest.approx(240.0)
    assert ("prefill", "up", 32) not in gated  # the spike (0.9 ms between 0.36 and 0.5) is dropped
    assert gated[("prefill", "up", 64)] == pytest.approx(1000.0 / 3.0)
    assert len(gated) == 12  # 3 token counts x 2 stages x 2 projections
    nongated = [r for r in bf16 if not r.gated and r.stage == "prefill"]
    # non-gated: up (n = intermediate) and down have equal FLOPs, 1.2 ms -> 600 us each
    assert sorted((r.projection, r.ep, r.tokens_per_gpu, r.latency_us) for r in nongated) == [
        ("down", 1, 64, pytest.approx(600.0)), ("up", 1, 64, pytest.approx(600.0))]
    notes = " ".join(tables.provenance.tables["grouped_gemm_bf16_power_law_1.2.csv"].notes)
    assert "1 measurements dropped as outliers" in notes
    assert "1 rows skipped: num_tokens not a multiple of moe_ep_size" in notes
    assert "1 rows skipped: moe_tp_size > 1" in notes
    # DeepSeek family (hidden 7168): alpha 1.01, block-scaled fp8 stored as fp8
    deepseek = tables.tables["grouped_gemm_fp8_block_power_law_1.01.csv"]
    assert sorted({(r.dtype, r.hidden, r.num_experts, r.projection, round(r.latency_us, 9)) for r in deepseek}) == [
        ("fp8", 7168, 256, "down", 150.0), ("fp8", 7168, 256, "up", 300.0)]
    fp8 = tables.tables["grouped_gemm_fp8_power_law_1.2.csv"]
    assert [r.latency_us for r in fp8 if r.projection == "up"] == [pytest.approx(2 * 200.0 / 3)] * 2
    info = tables.provenance.tables["grouped_gemm_fp8_block_power_law_1.01.csv"]
    assert info.moe_routing == "power_law_1.01" and info.includes_imbalance
    loaded = load_tables(directory)
    assert loaded.moe_includes_imbalance
    assert loaded.moe_routing == ("power_law_1.01", "power_law_1.2")
    # a lookup on a grid point returns the measurement
    shape = GroupedGemmShape(stage="prefill", projection="up", num_experts=128, ep=8, topk=8, hidden=4096,
                             intermediate=1536, tokens_per_gpu=8.0, active_experts=16.0, dtype="bf16",
                             weight_dtype="bf16")
    hit = loaded.lookup(shape, H100_BF16)
    assert hit is not None and hit.method == "exact" and hit.seconds == pytest.approx(200e-6)


def test_provenance(package: aic.AicSource, tmp_path: Path) -> None:
    prov = read_table_dir(imported(package, tmp_path / "out")).provenance
    assert prov.origin == "imported" and prov.command == "test command"
    assert prov.device.name == "NVIDIA H100 80GB HBM3"
    assert prov.peak_flops == {"bf16": H100_BF16, "fp8": H100_FP8}
    assert prov.software == {"package": "aiconfigurator-core", "package_version": "0.12.0-fixture",
                             "system": "h100_sxm", "framework": "trtllm", "framework_version": VERSION}
    assert prov.source["license"] == "Apache-2.0"
    assert prov.notes[0].startswith("Apache-2.0: the numbers in this directory are converted from NVIDIA")
    assert any("power_law_1.01, power_law_1.2" in n for n in prov.notes)


def test_the_system_files_rule_for_memory_bound_ops_is_carried(package: aic.AicSource, tmp_path: Path) -> None:
    """Its share of HBM bandwidth and its fixed time per op reach the provenance, and the tables price
    an elementwise kernel by them: 8 MB / (3.35 TB/s x 0.8) + 3 us = 5.985 us."""
    from infersim.costing.timing import kernel_cost
    from infersim.run.config import load_hardware_card
    from infersim.shapes.kernels import MemoryBoundShape

    assert read_table_dir(imported(package, tmp_path / "bare")).provenance.elementwise_latency is None
    (package.systems_dir / "h100_sxm.yaml").write_text(
        "gpu:\n  mem_bw: 3350000000000\n  mem_bw_empirical_scaling_factor: 0.8\n"
        "  mem_empirical_constant_latency: 0.000003\n")
    directory = imported(package, tmp_path / "out")
    prov = read_table_dir(directory).provenance
    assert (prov.elementwise_memory_efficiency, prov.elementwise_latency) == (0.8, 3e-6)
    assert "elementwise_latency: 3.0e-06" in (directory / "provenance.yaml").read_text()
    h100 = load_hardware_card("h100-sxm")[0]
    norm = kernel_cost(MemoryBoundShape("add + RMSNorm", bytes_moved=8e6), h100, load_tables(directory))
    assert norm.seconds == pytest.approx(8e6 / (3.35e12 * 0.8) + 3e-6, rel=1e-12)


def test_balanced_tables_do_not_include_imbalance(package: aic.AicSource, tmp_path: Path) -> None:
    loaded = load_tables(Path(__file__).resolve().parent.parent / "mfu_tables" / "imported" / "h800")
    assert not loaded.moe_includes_imbalance and loaded.moe_routing == ("balanced",)


def test_gemm_between_measured_k_and_n(package: aic.AicSource, tmp_path: Path) -> None:
    """A table measured on a K x N grid answers an unmeasured (K, N) bilinearly between the four around it."""
    loaded = load_tables(imported(package, tmp_path / "out"))
    hit = loaded.lookup(GemmShape(m=16, k=6144, n=5120, dtype="bf16", weight_dtype="bf16"), H100_BF16)
    assert hit is not None and hit.method == "interpolated"
    corner = {(k, n): (0.2 * 16 * n * k / 4096 ** 3 + 0.05) * 1e-3 for k in (4096, 8192) for n in (4096, 8192)}
    along_k = [(corner[(4096, n)] + corner[(8192, n)]) / 2 for n in (4096, 8192)]
    assert hit.seconds == pytest.approx(0.75 * along_k[0] + 0.25 * along_k[1], rel=1e-9)
    assert "k=6144 between 4096 and 8192" in hit.note
    # above the largest K measured: the time at K = 8192 scaled by the work ratio 16384 / 8192
    above = loaded.lookup(GemmShape(m=16, k=16384, n=4096), H100_BF16)
    assert above is not None and above.method == "extrapolated"
    assert above.seconds == pytest.approx(2 * corner[(8192, 4096)], rel=1e-9)
    assert "k=16384 above the table's largest k=8192" in above.note and "n=" not in above.note.split(":")[0]
    # below the smallest: no table
    assert loaded.lookup(GemmShape(m=16, k=2048, n=4096), H100_BF16) is None
    # the fp8 table holds one (K, N): no grid to interpolate on
    assert loaded.lookup(GemmShape(m=16, k=6144, n=4096, dtype="fp8", weight_dtype="fp8"), H100_FP8) is None


def test_compact_import_is_thinned_and_compressed(package: aic.AicSource, tmp_path: Path) -> None:
    """--compact (the bundled form): every table gzip-compressed, listed under its .csv.gz name, and
    thinned (infersim.tabletools.thinning, tested there): each (K, N) of the fixture's bf16 GEMMs has three m
    (1, 16, 128), the first and the last two a row always keeps, so all stay and read as imported."""
    written = aic.import_aiconfigurator(tmp_path / "out", "test command", devices=["h100-sxm"], source=package,
                                        compact=True)
    plain = read_table_dir(imported(package, tmp_path / "plain"))
    tables = read_table_dir(written[0])
    assert sorted(p.name for p in written[0].iterdir() if p.name != "provenance.yaml") == sorted(
        f"{name}.gz" for name in plain.tables)
    assert tables.tables["gemm_bf16.csv.gz"] == plain.tables["gemm_bf16.csv"]
    notes = " ".join(tables.provenance.tables["gemm_bf16.csv.gz"].notes)
    assert "thinned: 12 of 12 grid points kept" in notes and "within 3%" in notes


def test_versions_fill_backward(tmp_path: Path) -> None:
    base = tmp_path / "data" / "h100_sxm" / "moe" / "trtllm"
    for v in ("1.2.0rc5", "1.3.0rc10", "1.3.0rc23"):
        (base / v).mkdir(parents=True)
    found = aic.family_version_dir(tmp_path / "data", "h100_sxm", "moe", "trtllm", "1.3.0rc20")
    assert found == base / "1.3.0rc10"
    assert aic.family_version_dir(tmp_path / "data", "h100_sxm", "moe", "trtllm", "1.0") is None


def test_missing_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                          tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails as if not installed
    with pytest.raises(InferSimError, match=r"pip install aiconfigurator-core pyarrow \(or, in the infersim clone: pip install '\.\[aic\]'\)"):
        aic.installed_source()
    assert main(["mfu", "import-aiconfigurator", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["infersim: error: importing aiconfigurator's tables needs aiconfigurator-core and pyarrow: "
                   "pip install aiconfigurator-core pyarrow (or, in the infersim clone: pip install '.[aic]')"]


def test_unknown_device_is_refused(package: aic.AicSource, tmp_path: Path) -> None:
    with pytest.raises(InferSimError, match="no aiconfigurator system known for h20"):
        aic.import_aiconfigurator(tmp_path, "cmd", devices=["h20"], source=package)


def test_parquet_tables(package: aic.AicSource, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="parquet fixtures need pyarrow (the 'aic' extra)")
    import pyarrow.parquet as pq

    directory = package.data_dir / "h100_sxm" / "gemm" / "trtllm" / VERSION
    rows = aic.read_records(directory / "gemm_perf.csv")
    pq.write_table(pa.Table.from_pylist([{**r, "m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]),
                                          "latency": float(r["latency"])} for r in rows]),
                   directory / "gemm_perf.parquet")
    (directory / "gemm_perf.csv").unlink()
    tables = read_table_dir(imported(package, tmp_path / "out"))
    assert len(tables.tables["gemm_bf16.csv"]) == 12


def allreduce(gpus: int, size: int, ms: float, source: str = "TRTLLM") -> dict:
    return {"framework": "TRTLLM", "version": VERSION, "device": "NVIDIA H100 80GB HBM3", "op_name": "all_reduce",
            "kernel_source": source, "allreduce_dtype": "bfloat16", "num_gpus": gpus, "message_size": size,
            "latency": ms, "implementation": "trtllm"}


def nccl(op: str, gpus: int, size: int, ms: float, dtype: str = "half") -> dict:
    return {"framework": "TRTLLM", "version": "2.29.2", "device": "NVIDIA H100 80GB HBM3", "op_name": op,
            "kernel_source": "NCCL", "nccl_dtype": dtype, "num_gpus": gpus, "message_size": size, "latency": ms}


def test_collectives_imported_and_timed(package: aic.AicSource, tmp_path: Path) -> None:
    """The engine's custom all-reduce and NCCL all-gather/reduce-scatter become `collective` tables
    (message bytes = 2 x their 16-bit element count) and time the simulator's collectives in one node."""
    from infersim.run.config import load_hardware_card
    from infersim.shapes.comm_shapes import CollectiveShape
    from infersim.shapes.kernels import NoTables, Source
    from infersim.costing.timing import kernel_cost

    data = package.data_dir / "h100_sxm"
    write_table(data / "comm" / "trtllm" / VERSION, "custom_allreduce_perf",
                [allreduce(8, 1024, 0.01), allreduce(8, 1048576, 0.05), allreduce(4, 1024, 0.008)])
    write_table(data / "comm" / "nccl" / "2.29.2", "nccl_perf",
                [nccl("all_reduce", 8, 1024, 0.02), nccl("all_gather", 8, 1024, 0.012),
                 nccl("all_gather", 8, 1024, 0.5, dtype="int8"), nccl("alltoall", 8, 1024, 0.03)])
    directory = imported(package, tmp_path / "out")
    tables = read_table_dir(directory)
    assert [(r.kind, r.library, r.ranks, r.message_bytes, r.latency_us) for r in tables.tables[
        "collective_allreduce.csv"]] == [("all_reduce", "trtllm-custom-allreduce", 8, 2048, pytest.approx(10.0)),
                                         ("all_reduce", "trtllm-custom-allreduce", 8, 2097152, pytest.approx(50.0)),
                                         ("all_reduce", "trtllm-custom-allreduce", 4, 2048, pytest.approx(8.0))]
    # NCCL's all_reduce stays out: the engine runs its custom all-reduce
    assert [(r.kind, r.library, r.message_bytes) for r in tables.tables["collective_nccl.csv"]] == [
        ("all_gather", "nccl", 2048)]
    assert (directory / "collective_nccl.csv").read_text().splitlines()[0] == \
        "kind,library,dtype,ranks,message_bytes,latency_us"
    loaded = load_tables(directory)
    middle = loaded.lookup(CollectiveShape("all_reduce", (2048 + 2097152) / 2, 8, 8), 1.0)
    assert middle is not None and middle.method == "interpolated" and middle.seconds == pytest.approx(30e-6)
    small = loaded.lookup(CollectiveShape("all_reduce", 100, 8, 8), 1.0)
    assert small.seconds == pytest.approx(10e-6)
    big = loaded.lookup(CollectiveShape("all_reduce", 4 * 2097152, 8, 8), 1.0)
    assert big.method == "edge" and big.seconds == pytest.approx(200e-6)
    assert loaded.lookup(CollectiveShape("all_reduce", 2048, 16, 8), 1.0) is None  # two nodes
    assert loaded.lookup(CollectiveShape("all_reduce", 2048, 2, 8), 1.0) is None  # not measured
    hw, _ = load_hardware_card("h100-sxm")
    cost = kernel_cost(CollectiveShape("all_reduce", 2048, 8, 8), hw, loaded)
    assert cost.source == Source.TABLE and cost.seconds == pytest.approx(10e-6)
    assert cost.detail == f"exact from trtllm-{VERSION}/collective_allreduce.csv"
    assert kernel_cost(CollectiveShape("all_reduce", 2048, 8, 8), hw, NoTables()).source == Source.ROOFLINE


def test_two_libraries_for_one_collective_are_refused(tmp_path: Path) -> None:
    from infersim.tables.format import CollectiveRow, DeviceInfo, Provenance, TableDirectory, TableInfo
    from infersim.tables.output import write_table_dir

    rows = {"a.csv": (CollectiveRow("all_reduce", "nccl", "bf16", 8, 2048, 20.0),),
            "b.csv": (CollectiveRow("all_reduce", "trtllm-custom-allreduce", "bf16", 8, 2048, 10.0),)}
    prov = Provenance(format_version=1, device=DeviceInfo(name="NVIDIA H100 80GB HBM3"), peak_flops={"bf16": H100_BF16},
                      origin="imported", measured_on="unknown", written_on="2026-11-23", command="test",
                      tables={name: TableInfo(family="collective", library="test") for name in rows})
    write_table_dir(tmp_path / "dir", TableDirectory(provenance=prov, tables=rows))
    with pytest.raises(InferSimError, match="all_reduce over 8 GPUs is timed by both nccl"):
        load_tables(tmp_path / "dir")


def mla(op: str, heads: int, tp: int, batch: int, isl: int, step: int, ms: float) -> dict:
    return {"framework": "TRTLLM", "version": VERSION, "device": "NVIDIA H100 80GB HBM3", "op_name": op,
            "kernel_source": "default", "mla_dtype": "bfloat16", "kv_cache_dtype": "fp8", "num_heads": heads,
            "batch_size": batch, "isl": isl, "tp_size": tp, "step": step, "latency": ms}


def test_mla_rows(package: aic.AicSource, tmp_path: Path) -> None:
    """MLA prefill becomes MHA 192/128 with as many KV heads as heads; decode becomes absorbed MLA
    576/512; heads per GPU = num_heads / tp_size (DeepSeek-V3 geometry)."""
    directory = package.data_dir / "h100_sxm" / "mla" / "trtllm" / VERSION
    write_table(directory, "context_mla_perf", [mla("mla_context", 128, 8, 1, 4096, 0, 0.5),
                                                mla("mla_context", 128, 8, 2, 4096, 0, 0.9),
                                                mla("mla_context", 16, 32, 1, 4096, 0, 0.1)])
    write_table(directory, "generation_mla_perf", [mla("mla_generation", 128, 1, 32, 1, 4095, 0.12)])
    tables = read_table_dir(imported(package, tmp_path / "out"))
    (prefill,) = tables.tables["attention_prefill_mla.csv"]
    assert (prefill.kind, prefill.stage, prefill.num_heads, prefill.num_kv_heads, prefill.qk_head_dim,
            prefill.v_head_dim, prefill.kv_dtype, prefill.kv_len, prefill.latency_us) == (
        "mha", "prefill", 16, 16, 192, 128, "fp8", 4096, pytest.approx(500.0))
    (decode,) = tables.tables["attention_decode_mla.csv"]
    assert (decode.kind, decode.num_heads, decode.num_kv_heads, decode.qk_head_dim, decode.v_head_dim,
            decode.batch, decode.q_len, decode.kv_len, decode.latency_us) == (
        "mla", 128, 1, 576, 512, 32, 1, 4096, pytest.approx(120.0))
    notes = " ".join(tables.provenance.tables["attention_prefill_mla.csv"].notes)
    assert "1 rows skipped: batch_size > 1" in notes and "1 rows skipped: fewer than one head per GPU" in notes


# ---------------------------------------------------------------------------------------------
# NVFP4 (Blackwell): gemm_dtype / moe_dtype nvfp4 -> dtype fp4, efficiency relative to the card's fp4 peak

B200_FP4 = 9e15  # hardware/b200.yaml peak_flops.fp4


def b200_gemm(dtype: str, m: int, n: int, k: int, ms: float) -> dict:
    return {**gemm(dtype, m, n, k, ms), "device": "NVIDIA B200"}


def b200_moe(dtype: str, tokens: int, ms: float, source: str = "moe_torch_flow_cutlass", ep: int = 8) -> dict:
    """A DeepSeek-V3/R1 MoE layer (hidden 7168, 256 experts of 2048, top-8), power-law 1.01 routing."""
    return {**moe(dtype, tokens, 7168, 2048, 8, 256, 1, ep, "power_law_1.01", ms, source=source),
            "device": "NVIDIA B200"}


@pytest.fixture(params=["csv", "parquet"])
def b200_package(request: pytest.FixtureRequest, tmp_path: Path) -> aic.AicSource:
    """A miniature b200_sxm / trtllm package with NVFP4 GEMM and MoE rows (and rows that stay out)."""
    systems = tmp_path / "systems"
    systems.mkdir()
    (systems / "query_versions.yaml").write_text(yaml.safe_dump({
        "schema_version": 1, "defaults": {"trtllm": {"current": VERSION, "previous": None}}}))
    data = systems / "data" / "b200_sxm"
    write_table(data / "gemm" / "trtllm" / VERSION, "gemm_perf", [
        b200_gemm("bfloat16", 128, 4096, 7168, 0.02),
        b200_gemm("nvfp4", 128, 4096, 7168, 0.004),
        b200_gemm("nvfp4", 256, 4096, 7168, 0.0056),
        b200_gemm("fp8_block", 128, 4096, 7168, 0.009)])
    write_table(data / "moe" / "trtllm" / VERSION, "moe_perf", [
        b200_moe("nvfp4", 256, 0.3),
        b200_moe("nvfp4", 256, 0.25, source="moe_torch_flow_min_latency"),  # TRT-LLM's opt-in kernel: out
        b200_moe("w4a16_mxfp4", 256, 0.4),  # MXFP4 weights, bf16 activations: dtype bf16, weight_dtype fp4
        b200_moe("w4a8_mxfp4_mxfp8", 256, 0.35),  # MXFP4 weights, MXFP8 activations: dtype fp8, weight_dtype fp4
        b200_moe("fp8_block", 256, 0.5, source="deepgemm")])
    if request.param == "parquet":
        pa = pytest.importorskip("pyarrow", reason="parquet fixtures need pyarrow (the 'aic' extra)")
        import pyarrow.parquet as pq

        for directory, stem in ((data / "gemm" / "trtllm" / VERSION, "gemm_perf"),
                                (data / "moe" / "trtllm" / VERSION, "moe_perf")):
            rows = aic.read_records(directory / f"{stem}.csv")
            typed = [{name: (value if name in {"framework", "version", "device", "op_name", "kernel_source",
                                               "gemm_dtype", "moe_dtype", "distribution"}
                             else float(value) if name == "latency" else int(value))
                      for name, value in row.items()} for row in rows]
            pq.write_table(pa.Table.from_pylist(typed), directory / f"{stem}.parquet")
            (directory / f"{stem}.csv").unlink()
    return aic.AicSource(systems, "0.12.0-fixture")


def b200_imported(package: aic.AicSource, out: Path) -> Path:
    (written,) = aic.import_aiconfigurator(out, "test command", devices=["b200"], source=package)
    assert written == out / "b200" / f"trtllm-{VERSION}"
    return written


def test_nvfp4_gemm_number_by_number(b200_package: aic.AicSource, tmp_path: Path) -> None:
    directory = b200_imported(b200_package, tmp_path / "out")
    tables = read_table_dir(directory)
    assert tables.provenance.peak_flops["fp4"] == B200_FP4
    assert sorted(n for n in tables.tables if n.startswith("gemm")) == ["gemm_bf16.csv", "gemm_fp4.csv"]
    text = (directory / "gemm_fp4.csv").read_text().splitlines()
    assert text[0] == "dtype,m,k,n,latency_us,efficiency,source_mfu"
    # 0.004 ms -> 4 us; efficiency = 2 * 128 * 7168 * 4096 / (4e-6 s * 9e15 FLOP/s) = 0.208783 (fp4 peak, not fp8's)
    assert 2 * 128 * 7168 * 4096 / (4e-6 * B200_FP4) == pytest.approx(0.2087831, rel=1e-6)
    assert text[1:] == ["fp4,128,7168,4096,4,0.208783,", "fp4,256,7168,4096,5.6,0.298262,"]
    info = tables.provenance.tables["gemm_fp4.csv"]
    assert info.description == "dense GEMM, fp4 (NVFP4) inputs and weights, bf16 output"
    notes = " ".join(info.notes)
    assert "gemm_dtype nvfp4: NVFP4 (e2m1 inputs and weights, fp8 scales per 16 elements) stored as dtype fp4" in notes
    assert "1 rows skipped: gemm_dtype fp8_block" in notes and "nvfp4 (not a format" not in notes
    # the simulator's fp4 GEMM (precision gemm: fp4, weights: fp4) is served from it
    loaded = load_tables(directory)
    hit = loaded.lookup(GemmShape(m=128, k=7168, n=4096, dtype="fp4", weight_dtype="fp4"), B200_FP4)
    assert hit is not None and hit.method == "exact" and hit.seconds == pytest.approx(4e-6)
    between = loaded.lookup(GemmShape(m=192, k=7168, n=4096, dtype="fp4", weight_dtype="fp4"), B200_FP4)
    assert between is not None and between.seconds == pytest.approx(4.8e-6)
    # fp8 activations on fp4 weights (w4a8) is not what the table measured
    assert loaded.lookup(GemmShape(m=128, k=7168, n=4096, dtype="fp8", weight_dtype="fp4"), B200_FP4) is None


def test_nvfp4_moe_number_by_number(b200_package: aic.AicSource, tmp_path: Path) -> None:
    from infersim.run.config import load_hardware_card
    from infersim.shapes.kernels import Source
    from infersim.costing.timing import kernel_cost

    directory = b200_imported(b200_package, tmp_path / "out")
    tables = read_table_dir(directory)
    assert sorted(n for n in tables.tables if n.startswith("grouped")) == [
        "grouped_gemm_fp4_power_law_1.01.csv", "grouped_gemm_fp8_block_power_law_1.01.csv",
        "grouped_gemm_w4a16_mxfp4_power_law_1.01.csv", "grouped_gemm_w4a8_mxfp4_mxfp8_power_law_1.01.csv"]
    lines = (directory / "grouped_gemm_fp4_power_law_1.01.csv").read_text().splitlines()
    # num_tokens 256 over EP 8 -> 32 tokens per GPU; 0.3 ms (the CUTLASS row, not the 0.25 ms min-latency one)
    # split 2/3 up, 1/3 down. up: 2 * 32 * 8 * 7168 * 4096 FLOPs / (200e-6 s * 9e15) = 0.00835133; down
    # (n 7168, k 2048) has half the FLOPs in half the time: the same efficiency
    assert 2 * 32 * 8 * 7168 * 4096 / (200e-6 * B200_FP4) == pytest.approx(0.00835133, rel=1e-6)
    assert lines[1:] == ["fp4,prefill,up,256,8,8,7168,2048,true,32,200,0.00835133,",
                         "fp4,prefill,down,256,8,8,7168,2048,true,32,100,0.00835133,",
                         "fp4,decode,up,256,8,8,7168,2048,true,32,200,0.00835133,",
                         "fp4,decode,down,256,8,8,7168,2048,true,32,100,0.00835133,"]
    info = tables.provenance.tables["grouped_gemm_fp4_power_law_1.01.csv"]
    assert info.description == "routed experts of one MoE layer on one GPU, fp4 (NVFP4), routing power_law_1.01"
    assert info.moe_routing == "power_law_1.01" and info.includes_imbalance
    notes = " ".join(info.notes)
    assert "1 rows skipped: kernel_source moe_torch_flow_min_latency" in notes
    assert "moe_dtype not" not in notes  # w4a16_mxfp4 and w4a8_mxfp4_mxfp8 have tables of their own
    assert "moe_dtype nvfp4: NVFP4 (e2m1 inputs and weights, fp8 scales per 16 elements) stored as dtype fp4" in notes
    # DeepSeek-R1 FP4's routed experts (gemm fp4, expert weights fp4) are timed by it
    loaded = load_tables(directory)
    shape = GroupedGemmShape(stage="decode", projection="up", num_experts=256, ep=8, topk=8, hidden=7168,
                             intermediate=2048, tokens_per_gpu=32.0, active_experts=32.0, dtype="fp4",
                             weight_dtype="fp4")
    hit = loaded.lookup(shape, B200_FP4)
    assert hit is not None and hit.method == "exact" and hit.seconds == pytest.approx(200e-6)
    hw, _ = load_hardware_card("b200")
    # a deployment routed as the table was timed (power law 1.01 over the batch): its most loaded
    # rank carries f x 32 tokens, and the table answers with its own time at 32
    from infersim.modules.load_balance import moe_balance

    f = moe_balance("statistical", 256, 8, 8, 32.0, 1.0, routing_skew=1.01, dataset_skew=1.01).token_factor
    skewed = replace(shape, tokens_per_gpu=32.0 * f, load_factor=f)
    cost = kernel_cost(skewed, hw, loaded)
    assert cost.source == Source.TABLE and cost.seconds == pytest.approx(200e-6, rel=1e-3)
    assert cost.detail.startswith(f"interpolated from trtllm-{VERSION}/grouped_gemm_fp4_power_law_1.01.csv") or \
        cost.detail.startswith(f"exact from trtllm-{VERSION}/grouped_gemm_fp4_power_law_1.01.csv")
    # fp4 expert weights under fp8 GEMMs (w4a8) come from the MXFP4 x MXFP8 table, not the NVFP4 one:
    # 0.35 ms, 2/3 up = 233.3 us; efficiency against the fp8 peak 4.5e15 (hardware/b200.yaml)
    w4a8 = GroupedGemmShape(stage="decode", projection="up", num_experts=256, ep=8, topk=8, hidden=7168,
                            intermediate=2048, tokens_per_gpu=32.0, active_experts=32.0, dtype="fp8",
                            weight_dtype="fp4")
    hit = loaded.lookup(w4a8, 4.5e15)
    assert hit is not None and hit.seconds == pytest.approx(350e-6 * 2 / 3)
    assert hit.table.endswith("grouped_gemm_w4a8_mxfp4_mxfp8_power_law_1.01.csv")
    lines = (directory / "grouped_gemm_w4a16_mxfp4_power_law_1.01.csv").read_text().splitlines()
    # bf16 activations x fp4 weights: efficiency 2 * 32 * 8 * 7168 * 4096 / (266.67e-6 s * 2.25e15 bf16 peak)
    assert 2 * 32 * 8 * 7168 * 4096 / (0.4e-3 * 2 / 3 * 2.25e15) == pytest.approx(0.0250540, rel=1e-5)
    assert lines[0].endswith(",source_mfu,weight_dtype")
    assert lines[3] == "bf16,decode,up,256,8,8,7168,2048,true,32,266.6666667,0.025054,,fp4"
    info = tables.provenance.tables["grouped_gemm_w4a16_mxfp4_power_law_1.01.csv"]
    assert info.description == ("routed experts of one MoE layer on one GPU, bf16 activations x MXFP4 weights, "
                                "routing power_law_1.01")
    assert "stored as weight_dtype fp4, bf16 activations" in " ".join(info.notes)
    # the same activations over bf16 weights are a different kernel: no grid answers them
    w16 = GroupedGemmShape(stage="decode", projection="up", num_experts=256, ep=8, topk=8, hidden=7168,
                           intermediate=2048, tokens_per_gpu=32.0, active_experts=32.0, dtype="bf16",
                           weight_dtype="bf16")
    assert loaded.lookup(w16, 2.25e15) is None
    w4a16 = GroupedGemmShape(stage="decode", projection="up", num_experts=256, ep=8, topk=8, hidden=7168,
                             intermediate=2048, tokens_per_gpu=32.0, active_experts=32.0, dtype="bf16",
                             weight_dtype="fp4")
    hit = loaded.lookup(w4a16, 2.25e15)
    assert hit is not None and hit.seconds == pytest.approx(400e-6 * 2 / 3)


def test_nvfp4_needs_the_cards_fp4_peak(b200_package: aic.AicSource, tmp_path: Path) -> None:
    """A card without an fp4 peak (Hopper) gets no fp4 tables: their efficiency would have no reference."""
    plan = aic.ImportPlan(device="h100-sxm", system="b200_sxm", framework="trtllm", version=VERSION)
    result = aic.convert_one(b200_package, plan, compact=True)
    assert result is not None
    table_dir, notes = result
    assert "fp4" not in table_dir.provenance.peak_flops
    assert not [name for name in table_dir.tables if "_fp4" in name]
    # MXFP4 experts with bf16 activations need only the bf16 peak: Hopper gets them
    assert "grouped_gemm_w4a16_mxfp4_power_law_1.01.csv" in table_dir.tables
    assert "gemm_fp4.csv not written: hardware card h100-sxm has no peak FLOP/s for fp4" in notes


def _decode_row(latency_us: float, kv_len: int = 16384) -> AttentionRow:
    return AttentionRow(kind="mha", stage="decode", dtype="bf16", kv_dtype="bf16", num_heads=8, num_kv_heads=8,
                        qk_head_dim=128, v_head_dim=128, causal=True, batch=64, q_len=1, kv_len=kv_len,
                        latency_us=latency_us)


def test_rows_the_loader_would_refuse_are_not_written() -> None:
    """H100: a decode of 64 sequences x 16,384 tokens x 8 KV heads x 128 x 2 (K, V) x 2 bytes reads
    4,294,967,296 bytes of cache (+ 262,144 of queries and outputs); beyond the 52,428,800 bytes of L2
    that is 4,242,800,640 bytes, 1,266.5 us at the 3.35 TB/s HBM peak. A row at 1,240 us (1.021 x the
    peak: a boost, noise) is dropped from its table; a table with a row at 1,000 us (1.27 x) is dropped
    whole: its columns do not describe what was timed."""
    from infersim.tables.format import TableInfo

    info = TableInfo(family="attention", library="fixture")
    peaks = {"bf16": H100_BF16}
    tables = {"near.csv": (_decode_row(1240.0), _decode_row(1300.0), _decode_row(30.0, kv_len=128)),
              "far.csv": (_decode_row(1000.0), _decode_row(1400.0))}
    infos = {"near.csv": info, "far.csv": info}
    notes: list[str] = []
    aic._drop_tables_without_peak(tables, infos, peaks, "h100-sxm", notes)
    assert [r.latency_us for r in tables["near.csv"]] == [1300.0, 30.0]
    assert "1 rows not written: reading the bytes their shape needs beyond L2" in " ".join(infos["near.csv"].notes)
    assert "far.csv" not in tables and "far.csv not written: a row reads the bytes its shape needs beyond L2 " \
                                        "at 1.27 x the h100-sxm card's HBM peak" in " ".join(notes)
