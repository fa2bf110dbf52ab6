"""Kernel tables are read column by column when every cell is plain, row by row otherwise: both give
the same rows and line numbers, and a wrong cell is named by file, line and column wherever it is."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infersim.base.errors import ConfigError
from infersim.tables import table_files
from infersim.tables.format import AttentionRow, GemmRow, efficiency_of
from infersim.tables.table_files import read_table_csv, table_csv_text

PEAKS = {"bf16": 989.4e12, "fp8": 1978.9e12}


def peak_for(dtype: str) -> float:
    return PEAKS[dtype]


def both_readers(path: Path, family: str) -> tuple[tuple[object, ...], list[int], tuple[object, ...], list[int]]:
    """Rows and line numbers from read_table_csv and from the row-by-row reader alone."""
    lines: list[int] = []
    rows = read_table_csv(path, family, peak_for, lines)
    row_lines: list[int] = []
    by_row = table_files._read_rows(path, family, peak_for, row_lines)
    return rows, lines, by_row, row_lines


def gemm_text(count: int) -> str:
    rows = [GemmRow("bf16", 16 + i, 4096, 1024, 10.0 + i / 8) for i in range(count)]
    return table_csv_text("gemm", rows, peak_for)


def test_cells_the_column_path_refuses_read_as_the_row_path_reads_them(tmp_path: Path) -> None:
    # " 32" and "4096.0" are whole numbers by the schema's rule, "TRUE" a boolean, "fp8 " a name; the
    # blank line is skipped and the rows after it keep their own line numbers
    path = tmp_path / "attention.csv"
    row = AttentionRow("mha", "prefill", "fp8", "fp8", 32, 8, 128, 128, True, 1, 4096, 4096, 1126.0)
    efficiency = f"{efficiency_of(row, PEAKS['fp8']):.6g}"
    path.write_text("kind,stage,dtype,kv_dtype,num_heads,num_kv_heads,qk_head_dim,v_head_dim,causal,batch,q_len,"
                    "kv_len,latency_us,efficiency,source_mfu,window\n"
                    f"mha,prefill,fp8 ,fp8, 32,8,128,128,TRUE,1,4096.0,4096,1126.0,{efficiency},,\n"
                    "\n"
                    f"mha,prefill,fp8,fp8,32,8,128,128,true,1,4096,4096,1126,{efficiency},0.5, 0\n")
    rows, lines, by_row, row_lines = both_readers(path, "attention")
    assert rows == by_row == (row, AttentionRow("mha", "prefill", "fp8", "fp8", 32, 8, 128, 128, True, 1, 4096,
                                                4096, 1126.0, source_mfu=0.5))
    assert lines == row_lines == [2, 4]


def test_rows_past_the_first_chunk_keep_their_line_numbers(tmp_path: Path) -> None:
    text = gemm_text(3 * table_files._CHUNK_ROWS + 7)
    body = text.splitlines(keepends=True)
    at = table_files._CHUNK_ROWS + 10  # a blank line inside the second chunk
    path = tmp_path / "gemm.csv"
    path.write_text("".join(body[:at] + ["\n"] + body[at:]))
    rows, lines, by_row, row_lines = both_readers(path, "gemm")
    assert rows == by_row and lines == row_lines
    assert len(rows) == 3 * table_files._CHUNK_ROWS + 7
    assert lines[at - 2] == at and lines[at - 1] == at + 2  # line at+1 is the blank one
    assert rows[-1].m == 16 + len(rows) - 1


def test_a_wrong_cell_in_a_later_chunk_is_named_by_its_line(tmp_path: Path) -> None:
    body = gemm_text(2 * table_files._CHUNK_ROWS).splitlines(keepends=True)
    line = table_files._CHUNK_ROWS + 40  # in the second chunk; body[line - 1] is that file line
    body[line - 1] = body[line - 1].replace(",4096,", ",-4096,", 1)
    path = tmp_path / "gemm.csv"
    path.write_text("".join(body))
    with pytest.raises(ConfigError) as err:
        read_table_csv(path, "gemm", peak_for)
    assert str(err.value).startswith(f"{path}:{line}: field 'k' (value: '-4096'): ")


def test_a_wrong_cell_before_a_cut_off_end_is_named_first(tmp_path: Path) -> None:
    body = gemm_text(200).splitlines(keepends=True)
    body[2] = body[2].replace(",4096,", ",x,", 1)  # file line 3
    packed = gzip.compress("".join(body).encode(), mtime=0)
    path = tmp_path / "gemm.csv.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    with pytest.raises(ConfigError) as err:
        read_table_csv(path, "gemm", peak_for)
    assert str(err.value) == f"{path}:3: field 'k' (value: 'x'): expected a whole number"


def test_a_cut_off_file_without_wrong_cells_is_refused_as_unreadable(tmp_path: Path) -> None:
    packed = gzip.compress(gemm_text(200).encode(), mtime=0)
    path = tmp_path / "gemm.csv.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    with pytest.raises(ConfigError, match="cannot read table file"):
        read_table_csv(path, "gemm", peak_for)


cell_spacing = st.sampled_from(["{}", " {}", "{} ", "{}"])
attention_rows = st.builds(
    AttentionRow, kind=st.sampled_from(["mha", "mla"]), stage=st.sampled_from(["prefill", "decode"]),
    dtype=st.sampled_from(["bf16", "fp8"]), kv_dtype=st.sampled_from(["bf16", "fp8"]),
    num_heads=st.integers(1, 128), num_kv_heads=st.integers(1, 16), qk_head_dim=st.integers(1, 576),
    v_head_dim=st.integers(1, 512), causal=st.booleans(), batch=st.integers(1, 512), q_len=st.integers(1, 64),
    kv_len=st.integers(64, 1 << 17), latency_us=st.just(1.0),
    source_mfu=st.none() | st.floats(1e-4, 1.0).map(lambda x: float(f"{x:.10g}")), window=st.sampled_from([0, 0, 128, 4096]),
).flatmap(lambda row: st.floats(1e-4, 1.0).map(  # a latency the kernel could run at: efficiency up to 1
    lambda efficiency: dataclasses.replace(
        row, latency_us=float(f"{efficiency_of(row, PEAKS[row.dtype]) / efficiency:.10g}"))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(attention_rows, min_size=1, max_size=40), spacing=st.lists(cell_spacing, min_size=1))
def test_both_readers_agree_on_any_table(tmp_path: Path, rows: list[AttentionRow], spacing: list[str]) -> None:
    text = table_csv_text("attention", rows, peak_for).splitlines()
    # spaces around some cells: the row path strips them, so the column path must agree or step aside
    spaced = [text[0]] + [",".join(spacing[(i + j) % len(spacing)].format(cell) for j, cell in enumerate(line.split(",")))
                          for i, line in enumerate(text[1:])]
    path = tmp_path / "attention.csv"
    path.write_text("\n".join(spaced) + "\n")
    got, lines, by_row, row_lines = both_readers(path, "attention")
    assert got == by_row and lines == row_lines == list(range(2, len(rows) + 2))
    assert got == tuple(rows)
