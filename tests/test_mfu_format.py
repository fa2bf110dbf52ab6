"""Table format: write/read round trip, and the refusals that keep every number traceable."""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.base.errors import ConfigError, InferSimError
from infersim.tables.format import (
    AttentionRow,
    DeviceInfo,
    GemmRow,
    GroupedGemmRow,
    PROVENANCE_FILE,
    Provenance,
    TableDirectory,
    TableInfo,
    efficiency_of,
)
from infersim.tables.output import write_table_dir
from infersim.tables.table_files import read_table_dir
from infersim.tables.lookup import load_tables

PEAKS = {"bf16": 989.4e12, "fp8": 1978.9e12}


def sample_directory() -> TableDirectory:
    gemm = (GemmRow("fp8", 16, 7168, 1536, 16.443, 0.010827), GemmRow("fp8", 32, 7168, 1536, 13.457),
            GemmRow("bf16", 4096, 4096, 4096, 175.25))
    grouped = (GroupedGemmRow("fp8", "decode", "up", 256, 64, 8, 7168, 2048, True, 128, 93.832),
               GroupedGemmRow("fp8", "decode", "down", 256, 64, 8, 7168, 2048, True, 128, 50.987))
    attention = (AttentionRow("mla", "decode", "bf16", "bf16", 128, 1, 576, 512, True, 16, 1, 131072, 1085.607),
                 AttentionRow("mha", "prefill", "bf16", "bf16", 32, 8, 128, 128, True, 1, 4096, 4096, 1126.0))
    tables = {"gemm.csv": gemm, "grouped.csv": grouped, "attention.csv": attention}
    infos = {"gemm.csv": TableInfo("gemm", "cuBLAS", "12.4"),
             "grouped.csv": TableInfo("grouped_gemm", "DeepGEMM", notes=("balanced routing",)),
             "attention.csv": TableInfo("attention", "FlashMLA")}
    prov = Provenance(format_version=1, device=DeviceInfo("NVIDIA H800", 132, {"sm_max_mhz": 1980.0}),
                      peak_flops=PEAKS, origin="measured", measured_on="2026-11-20", written_on="2026-11-21",
                      command="infersim mfu bench --out x", software={"torch": "2.11.0", "cuda": "13.0"},
                      notes=("test",), tables=infos)
    return TableDirectory(prov, tables)


def test_round_trip_keeps_every_row_and_the_provenance(tmp_path: Path) -> None:
    original = sample_directory()
    write_table_dir(tmp_path, original)
    loaded = read_table_dir(tmp_path)
    assert loaded.provenance == original.provenance
    assert loaded.tables == original.tables
    assert loaded.tables["gemm.csv"][0].source_mfu == 0.010827
    assert loaded.tables["gemm.csv"][1].source_mfu is None


def test_efficiency_column_is_flops_over_latency_times_peak(tmp_path: Path) -> None:
    write_table_dir(tmp_path, sample_directory())
    lines = (tmp_path / "gemm.csv").read_text().splitlines()
    assert lines[0] == "dtype,m,k,n,latency_us,efficiency,source_mfu"
    # 2*16*7168*1536 FLOPs in 16.443 us against 1978.9e12 FLOP/s
    assert lines[1] == "fp8,16,7168,1536,16.443,0.0108277,0.010827"
    mla = GemmRow("fp8", 16, 7168, 1536, 16.443)
    assert efficiency_of(mla, PEAKS["fp8"]) == pytest.approx(2 * 16 * 7168 * 1536 / 16.443e-6 / 1978.9e12)
    attention = sample_directory().tables["attention.csv"][0]
    # MLA decode: 2 * batch * heads * kv_len * (576 + 512), the published mfu of this row is 0.544
    assert efficiency_of(attention, PEAKS["bf16"]) == pytest.approx(0.54382, abs=1e-5)


def test_directory_without_provenance_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_table_dir(tmp_path, sample_directory())
    (tmp_path / PROVENANCE_FILE).unlink()
    with pytest.raises(ConfigError) as error:
        read_table_dir(tmp_path)
    assert str(tmp_path / PROVENANCE_FILE) in str(error.value)
    assert "without provenance are refused" in str(error.value)
    with pytest.raises(InferSimError, match="provenance"):
        load_tables(tmp_path)


def test_csv_not_listed_in_the_provenance_is_refused(tmp_path: Path) -> None:
    write_table_dir(tmp_path, sample_directory())
    (tmp_path / "extra.csv").write_text("dtype,m,k,n,latency_us,efficiency\n")
    with pytest.raises(ConfigError, match="extra.csv"):
        read_table_dir(tmp_path)


def test_efficiency_that_disagrees_with_latency_and_peak_is_refused(tmp_path: Path) -> None:
    directory = sample_directory()
    write_table_dir(tmp_path, directory)
    text = (tmp_path / "provenance.yaml").read_text().replace("1978900000000000.0", "989400000000000.0")
    (tmp_path / "provenance.yaml").write_text(text)
    with pytest.raises(ConfigError, match="does not match FLOPs/\\(latency\\*peak\\)"):
        read_table_dir(tmp_path)


def test_bad_cells_and_headers_name_file_line_and_column(tmp_path: Path) -> None:
    write_table_dir(tmp_path, sample_directory())
    path = tmp_path / "gemm.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1].replace(",16,", ",sixteen,")] + lines[2:]) + "\n")
    with pytest.raises(ConfigError) as error:
        read_table_dir(tmp_path)
    assert f"{path}:2" in str(error.value) and "'m'" in str(error.value)
    path.write_text("dtype,m,k,latency_us,efficiency\n")
    with pytest.raises(ConfigError, match="missing n"):
        read_table_dir(tmp_path)


def test_missing_provenance_field_is_one_clear_error(tmp_path: Path) -> None:
    write_table_dir(tmp_path, sample_directory())
    text = (tmp_path / PROVENANCE_FILE).read_text()
    (tmp_path / PROVENANCE_FILE).write_text(text.replace("command: infersim mfu bench --out x\n", ""))
    with pytest.raises(ConfigError, match="field 'command'.*required field is missing"):
        read_table_dir(tmp_path)
