"""`infersim mfu compare`: rows of identical shape in two table directories, their latency ratio per
file, and the slices (one measured sweep each) whose ratio stands apart from their file's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infersim.cards.registry import bundled_dir
from infersim.cli.main import main
from infersim.base.errors import InferSimError
from infersim.tabletools.compare import compare_tables
from infersim.tables.format import DeviceInfo, GemmRow, Provenance, TableDirectory, TableInfo
from infersim.tables.output import write_table_dir

PEAKS = {"bf16": 989.4e12}
#: (k, n) of the synthetic GEMM slices; each is swept over M_VALUES
SLICES = ((4096, 4096), (4096, 8192), (8192, 4096), (8192, 8192))
M_VALUES = (16, 64, 256)
OUTLIER = (8192, 4096)


def _latency_us(m: int, k: int, n: int) -> float:
    # 10% of the bf16 peak: well inside the efficiency the reader accepts
    return 2.0 * m * k * n / (0.1 * PEAKS["bf16"]) * 1e6


def _write(directory: Path, device: str, scale_of: dict[tuple[int, int], float], extra_file: bool) -> Path:
    gemm = tuple(GemmRow("bf16", m, k, n, _latency_us(m, k, n) * scale_of.get((k, n), 1.0))
                 for k, n in SLICES for m in M_VALUES)
    tables: dict[str, tuple] = {"gemm_bf16.csv": gemm}
    infos = {"gemm_bf16.csv": TableInfo("gemm", "cuBLAS")}
    if extra_file:
        tables["gemm_extra.csv"] = (GemmRow("bf16", 16, 1024, 1024, _latency_us(16, 1024, 1024)),)
        infos["gemm_extra.csv"] = TableInfo("gemm", "cuBLAS")
    prov = Provenance(format_version=1, device=DeviceInfo(device), peak_flops=PEAKS, origin="measured",
                      measured_on="2026-01-01", written_on="2026-01-01", command="test", tables=infos)
    write_table_dir(directory, TableDirectory(prov, tables))
    return directory


@pytest.fixture
def table_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A: the reference; B: every row 1.1x A's, except the OUTLIER slice at 2.2x. A has one more file."""
    a = _write(tmp_path / "a", "GPU A", {}, extra_file=True)
    b = _write(tmp_path / "b", "GPU B", {key: (2.2 if key == OUTLIER else 1.1) for key in SLICES}, extra_file=False)
    return a, b


def test_the_one_slice_at_twice_the_ratio_is_flagged(table_pair: tuple[Path, Path]) -> None:
    comparison = compare_tables(*table_pair)
    (gemm,) = comparison.files
    assert gemm.name == "gemm_bf16.csv" and gemm.matched_rows == 12 and gemm.slices == 4
    assert gemm.ratios.median == pytest.approx(1.1)
    assert gemm.ratios.p10 == pytest.approx(1.1) and gemm.ratios.maximum == pytest.approx(2.2)
    (flagged,) = gemm.flagged
    assert flagged.description == "bf16 k=8192 n=4096"
    assert flagged.ratios.rows == 3 and flagged.ratios.median == pytest.approx(2.2)
    assert flagged.ratios.minimum == pytest.approx(2.2) and flagged.ratios.maximum == pytest.approx(2.2)
    assert flagged.deviation == pytest.approx(2.0)
    assert (flagged.sweep_axis, flagged.sweep_low, flagged.sweep_high) == ("m", 16, 256)
    assert comparison.only_in_a == ("gemm_extra.csv",) and comparison.only_in_b == ()
    assert (comparison.device_a, comparison.device_b) == ("GPU A", "GPU B")


def test_a_slice_below_the_file_is_flagged_too(table_pair: tuple[Path, Path]) -> None:
    a, b = table_pair
    (flagged,) = compare_tables(b, a).files[0].flagged  # reversed: the outlier's ratio is 1/2.2 against 1/1.1
    assert flagged.ratios.median == pytest.approx(1 / 2.2) and flagged.deviation == pytest.approx(0.5)


def test_a_threshold_above_the_outliers_factor_flags_nothing(table_pair: tuple[Path, Path]) -> None:
    comparison = compare_tables(*table_pair, threshold=2.5)
    assert comparison.flagged == () and comparison.files[0].ratios.median == pytest.approx(1.1)
    assert len(compare_tables(*table_pair, threshold=1.9).flagged) == 1


def test_cli_text_names_the_ratio_and_the_flagged_slice(table_pair: tuple[Path, Path], capsys) -> None:
    a, b = table_pair
    assert main(["mfu", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "ratio = latency in B / latency in A for identical shapes" in out
    summary = next(line for line in out.splitlines() if line.startswith("gemm_bf16.csv "))
    # rows A, B, matched; median, p10, p90 (the outlier's 3 of 12 rows reach the p90); slices, flagged
    assert summary.split() == ["gemm_bf16.csv", "gemm", "12", "12", "12", "1.100", "1.100", "2.200", "4", "1"]
    flagged = next(line for line in out.splitlines() if "k=8192 n=4096" in line)
    assert flagged.split()[-5:] == ["3", "2.200", "2.200", "2.200", "2.000"]
    assert "only in A: gemm_extra.csv" in out


def test_cli_json_has_the_same_numbers(table_pair: tuple[Path, Path], capsys) -> None:
    a, b = table_pair
    assert main(["mfu", "compare", str(a), str(b), "--format", "json", "--threshold", "1.5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threshold"] == 1.5 and data["only_in_a"] == ["gemm_extra.csv"]
    (gemm,) = data["files"]
    assert gemm["matched_rows"] == 12 and gemm["ratios"]["median"] == pytest.approx(1.1)
    (flagged,) = gemm["flagged"]
    assert flagged["description"] == "bf16 k=8192 n=4096" and flagged["ratios"]["median"] == pytest.approx(2.2)
    assert main(["mfu", "compare", str(a), str(b), "--format", "json", "--threshold", "2.5"]) == 0
    assert json.loads(capsys.readouterr().out)["files"][0]["flagged"] == []


def test_a_missing_directory_is_named_without_a_traceback(table_pair: tuple[Path, Path], capsys,
                                                          tmp_path: Path) -> None:
    a, _b = table_pair
    assert main(["mfu", "compare", str(a), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "DIR_B" in err and "nowhere" in err and "no such directory" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["mfu", "compare", str(tmp_path), str(a)]) == 2  # a directory without provenance.yaml
    err = capsys.readouterr().err
    assert "DIR_A" in err and "not a kernel table directory" in err and "Traceback" not in err


def test_a_threshold_of_one_is_refused_naming_it(table_pair: tuple[Path, Path], capsys) -> None:
    a, b = table_pair
    with pytest.raises(SystemExit) as exit_info:  # argparse's refusal, as every other bad option value
        main(["mfu", "compare", str(a), str(b), "--threshold", "1.0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--threshold" in err and "'1.0'" in err and "greater than 1" in err and "Traceback" not in err
    with pytest.raises(InferSimError, match=r"threshold 1\.0: must be a finite factor > 1"):
        compare_tables(a, b, threshold=1.0)


@pytest.mark.slow  # indexes two whole bundled table sets; the comparison itself is checked on small pairs above
def test_bundled_b200_and_gb200_disagree_on_the_deepseek_moe_slice() -> None:
    """B200 and GB200 share a die: the tables agree within a few percent, except aiconfigurator's
    NVFP4 MoE rows of DeepSeek's layout at EP 4 (and 1, 8, 16), where GB200's are ~1.8x faster."""
    tables = bundled_dir("mfu_tables") / "aiconfigurator"
    comparison = compare_tables(tables / "b200/trtllm-1.3.0rc20", tables / "gb200/trtllm-1.3.0rc20")
    assert 0.96 <= comparison.ratios.median <= 1.0 and comparison.ratios.rows > 80_000
    fp4 = next(f for f in comparison.files if f.name.startswith("grouped_gemm_fp4_power_law_1.01.csv"))
    assert 0.93 <= fp4.ratios.median <= 0.96
    deepseek_ep4 = [s for s in fp4.flagged
                    if "experts=256 topk=8 hidden=7168 intermediate=2048 ep=4" in s.description]
    assert len(deepseek_ep4) == 4  # prefill and decode, up and down: aiconfigurator times one kernel for all
    for flagged in deepseek_ep4:
        # 13 token counts measured; the thinned tables share the rows interpolation could not reproduce
        assert 0.50 <= flagged.ratios.median <= 0.60 and 8 <= flagged.ratios.rows <= 13
        assert flagged.deviation < 0.65
    # the same layout at EP 2 agrees with the file: the comparison singles out the sweep, not the layout
    assert not any("hidden=7168 intermediate=2048 ep=2" in s.description for s in fp4.flagged)
    # GEMMs and attention of the two devices agree everywhere
    assert all(not f.flagged for f in comparison.files if not f.name.startswith("grouped_gemm"))
