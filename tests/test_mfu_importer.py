"""Importer on the real published InferSim files (../shared/reference/infersim_bench_data)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO_ROOT, shared_reference

from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape
from infersim.tabletools.cli import main as mfu_main
from infersim.tables.format import AttentionRow, GemmRow, GroupedGemmRow
from infersim.tables.table_files import read_table_dir
from infersim.tabletools.importer import import_infersim
from infersim.tables.lookup import load_tables


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = shared_reference("infersim_bench_data")
    out = tmp_path_factory.mktemp("imported")
    written = import_infersim(src, out, "pytest import")
    assert [p.name for p in written] == ["h20", "h800"]
    return out


def test_every_importable_file_becomes_a_listed_table(imported: Path) -> None:
    h20 = read_table_dir(imported / "h20")
    h800 = read_table_dir(imported / "h800")
    assert len(h20.tables) == 18  # gemm, 2 grouped, 5 mha prefill, 9 mha decode, 1 mla decode
    assert len(h800.tables) == 12  # gemm, 2 grouped, 7 mha decode, 1 mla decode, 1 mla prefill
    assert h20.provenance.origin == "imported" and h20.provenance.measured_on == "unknown"
    assert h20.provenance.source["project"] == "original InferSim (Alibaba, Apache-2.0)"
    assert h20.provenance.source["path"].endswith("infersim_bench_data")
    assert h20.provenance.tables["gemm.csv"].library == "DeepGEMM"
    assert h20.provenance.tables["gemm.csv"].source_file == "gemm/h20/data.csv"
    assert h800.provenance.peak_flops == {"bf16": 989.4e12, "fp8": 1978.9e12}
    notes = " ".join(h20.provenance.notes)
    assert "gdn/decode/h20/4-16-128-32-128.csv: not imported" in notes


def test_row_counts_and_values_match_the_source(imported: Path) -> None:
    h20 = read_table_dir(imported / "h20").tables
    h800 = read_table_dir(imported / "h800").tables
    # 402 source rows, 22 exact repeats dropped
    assert len(h20["gemm.csv"]) == 380
    assert len(h800["gemm.csv"]) == 110
    first = next(r for r in h800["gemm.csv"] if (r.m, r.k, r.n) == (16, 7168, 1536))
    assert first == GemmRow("fp8", 16, 7168, 1536, 16.443, 0.010827)
    # the headerless file (mha/decode/h20/64-2-128.csv) is read with the decode columns: 41 rows
    assert len(h20["attention_decode_mha_64-2-128.csv"]) == 41
    assert h20["attention_decode_mha_64-2-128.csv"][0] == AttentionRow(
        "mha", "decode", "bf16", "bf16", 64, 2, 128, 128, True, 1, 1, 1024, 25.4893, 0.009)
    # MLA prefill becomes MHA over decompressed K/V: qk = 128 + 64, v = 128
    mla_prefill = h800["attention_prefill_mla_128-128-64.csv"]
    assert mla_prefill[0] == AttentionRow("mha", "prefill", "bf16", "bf16", 128, 128, 192, 128, True, 1, 1024, 1024,
                                          116.88, 0.372)
    # grouped GEMM: each source row gives an up and a down row
    decode = h800["grouped_gemm_decode.csv"]
    assert len(decode) == 2 * 47
    assert GroupedGemmRow("fp8", "decode", "up", 256, 64, 8, 7168, 2048, True, 128, 93.832, 0.290607) in decode


def test_inconsistent_grouped_row_is_skipped_and_said(imported: Path) -> None:
    prov = read_table_dir(imported / "h20").provenance
    notes = " ".join(prov.tables["grouped_gemm_prefill.csv"].notes)
    assert "1 source rows skipped" in notes and "num_gpus=2 num_local_experts=256" in notes
    rows = read_table_dir(imported / "h20").tables["grouped_gemm_prefill.csv"]
    assert len(rows) == 2 * 159
    assert all(r.hidden != 3072 for r in rows)


def test_gemm_peak_is_inferred_fp8_with_evidence(imported: Path) -> None:
    notes = " ".join(read_table_dir(imported / "h20").provenance.tables["gemm.csv"].notes)
    assert "relative to the fp8 peak 2.96e+14" in notes
    assert "exceeds the bf16 peak 1.48e+14, so the kernels ran fp8" in notes
    attention_notes = " ".join(read_table_dir(imported / "h800").provenance.tables[
        "attention_decode_mla_128-512-64.csv"].notes)
    assert "relative to the bf16 peak 9.894e+14" in attention_notes


def test_imported_tables_reproduce_published_latencies(imported: Path) -> None:
    h800 = load_tables(imported / "h800")
    hit = h800.lookup(GemmShape(16, 7168, 1536, "fp8", "fp8"), 1978.9e12)
    assert hit is not None and hit.method == "exact"
    assert hit.seconds == pytest.approx(16.443e-6, rel=1e-12)
    mla = AttentionShape("mla", "decode", 16, 1, 131072, 128, 1, 576, 512, rope_dim=64)
    assert h800.lookup(mla, 989.4e12).seconds == pytest.approx(1085.607e-6, rel=1e-12)
    prefill = AttentionShape("mha", "prefill", 1, 4096, 4096, 128, 128, 192, 128, rope_dim=64)
    assert h800.lookup(prefill, 989.4e12).seconds == pytest.approx(1104.692e-6, rel=1e-12)
    h20 = load_tables(imported / "h20")
    experts = GroupedGemmShape("decode", "down", 128, 4, 8, 2048, 768, 512.0, 32.0, dtype="fp8", weight_dtype="fp8")
    assert h20.lookup(experts, 296e12).seconds == pytest.approx(101.959e-6, rel=1e-12)


def test_committed_tables_are_what_the_importer_writes(imported: Path) -> None:
    for device in ("h20", "h800"):
        committed = read_table_dir(REPO_ROOT / "mfu_tables" / "imported" / device)
        fresh = read_table_dir(imported / device)
        assert committed.tables == fresh.tables
        assert committed.provenance.tables == fresh.provenance.tables
        assert committed.provenance.command.startswith("python -m infersim mfu import-infersim ")


def test_cli_import_writes_directories_and_refuses_a_wrong_source(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    src = shared_reference("infersim_bench_data")
    assert mfu_main(["import-infersim", str(src), "--out", str(tmp_path), "--devices", "h800"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'h800'}"
    assert read_table_dir(tmp_path / "h800").provenance.command == (
        f"python -m infersim.tabletools.cli import-infersim {src} --out {tmp_path} --devices h800")
    assert mfu_main(["import-infersim", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert "InferSim benchmark data not found" in capsys.readouterr().err
