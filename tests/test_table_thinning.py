"""Thinning a kernel table where interpolation loses nothing (infersim.tabletools.thinning), gzip-compressed
table files, and the size of the bundled tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.base.errors import ConfigError
from infersim.tables.format import GemmRow
from infersim.tables.interpolation import build_grid
from infersim.tables.output import write_table_dir
from infersim.tables.table_files import read_table_dir
from infersim.tabletools.thinning import _row_values, thin_row, thin_rows

BUNDLED = Path(__file__).resolve().parent.parent / "mfu_tables"
#: the cap on the bundled tables' bytes on disk (1 MB = 1e6 bytes)
BUNDLE_CAP_BYTES = 60e6


def test_a_straight_line_keeps_its_ends() -> None:
    # time = 5 + 2 x at every point: the first point and the last two reproduce the rest exactly
    coords = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    kept, worst = thin_row(coords, [5 + 2 * x for x in coords], 0.03)
    assert kept == [0, 4, 5] and worst == 0.0


def test_a_step_at_m_plus_one_is_kept() -> None:
    """vLLM's fp8 GEMM on an H100 (aiconfigurator 0.12, K 7168, N 16384): 57.8 us at m = 256,
    167.9 us at m = 257, 95.4 at 512 (another kernel from 257 on). Interpolating 257 from 256 and
    512 would give 58.0 us, 65% low: it stays; 256 and 257 both stay (each is a side of the step)."""
    m = [128.0, 192.0, 256.0, 257.0, 512.0, 513.0, 1024.0]
    us = [49.9, 66.7, 57.8, 167.9, 95.4, 228.4, 193.1]
    kept, worst = thin_row(m, us, 0.03)
    assert {2, 3} <= set(kept)
    assert worst <= 0.03


def test_left_out_points_are_within_tolerance_by_hand() -> None:
    # 10 at x = 1, 2, 3 (flat), then +10 per unit: 3 is the knee and stays; 2 lies on the flat line
    # from 1 to 3, and 4 and 5 on the line from 3 to 6, the first of the last two (always kept)
    kept, worst = thin_row([1, 2, 3, 4, 5, 6, 7], [10, 10, 10, 20, 30, 40, 50], 0.01)
    assert kept == [0, 2, 5, 6] and worst == 0.0


rows_strategy = st.lists(st.floats(min_value=1.0, max_value=1e4), min_size=4, max_size=12)


@settings(max_examples=200, deadline=None)
@given(values=rows_strategy, data=st.data())
def test_the_row_rule_is_the_lookups(values: list[float], data: st.DataObject) -> None:
    """The thinning's prediction of a left-out point is what the lookup's interpolation (with its
    convex envelope) answers from the kept points, for any row and any kept subset with both ends."""
    coords = [float(2 ** i) for i in range(len(values))]
    inner = data.draw(st.sets(st.integers(1, len(values) - 2)))
    kept = sorted({0, len(values) - 1} | inner)
    grid = build_grid(("m",), (((coords[k],), values[k], 0.5) for k in kept), 1e15)
    for j in range(len(values)):
        if j not in kept:
            looked_up = grid.evaluate((coords[j],), 1.0).seconds
            assert _row_values(coords, values, kept, j) == pytest.approx(looked_up, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(values=rows_strategy, tolerance=st.sampled_from([0.01, 0.03, 0.1]))
def test_every_point_left_out_is_reproduced_within_tolerance(values: list[float], tolerance: float) -> None:
    coords = [float(2 ** i) for i in range(len(values))]
    kept, worst = thin_row(coords, values, tolerance)
    assert kept[0] == 0 and kept[-2:] == [len(values) - 2, len(values) - 1]
    errors = [abs(_row_values(coords, values, kept, j) / values[j] - 1) for j in range(len(values)) if j not in kept]
    assert max(errors, default=0.0) == pytest.approx(worst) and worst <= tolerance


def test_thin_rows_keeps_every_row_of_a_kept_coordinate() -> None:
    """Rows are thinned per (K, N); repeated measurements at one m are averaged for the decision and
    all kept."""
    rows = [GemmRow(dtype="bf16", m=m, k=4096, n=4096, latency_us=10.0 + m) for m in (1, 2, 4, 8, 16)]
    rows.append(GemmRow(dtype="bf16", m=16, k=4096, n=4096, latency_us=26.0))
    rows += [GemmRow(dtype="bf16", m=m, k=8192, n=4096, latency_us=5.0 * m) for m in (1, 2, 4)]
    result = thin_rows(rows, 0.03)
    assert [(r.k, r.m) for r in result.rows] == [(4096, 1), (4096, 8), (4096, 16), (4096, 16),
                                                (8192, 1), (8192, 2), (8192, 4)]
    assert (result.kept_points, result.total_points) == (6, 8)


# ---------------------------------------------------------------------------------------------
# gzip-compressed table files


def test_a_compressed_table_reads_as_its_csv(tmp_path: Path) -> None:
    source = BUNDLED / "imported" / "h800"
    plain = read_table_dir(source)
    from dataclasses import replace

    from infersim.tabletools.aiconfigurator import compressed

    packed = compressed(plain)
    write_table_dir(tmp_path / "gz", replace(packed, row_lines={}))
    assert all(p.name.endswith(".csv.gz") for p in (tmp_path / "gz").iterdir() if p.name != "provenance.yaml")
    again = read_table_dir(tmp_path / "gz")
    assert {name.removesuffix(".gz"): rows for name, rows in again.tables.items()} == dict(plain.tables)
    # the same rows make the same bytes (no timestamp in the gzip header)
    name = next(iter(again.tables))
    first = (tmp_path / "gz" / name).read_bytes()
    write_table_dir(tmp_path / "gz", replace(packed, row_lines={}), force=True)
    assert (tmp_path / "gz" / name).read_bytes() == first


def test_a_broken_compressed_table_is_one_error(tmp_path: Path) -> None:
    source = BUNDLED / "imported" / "h800"
    from dataclasses import replace

    from infersim.tabletools.aiconfigurator import compressed

    write_table_dir(tmp_path / "gz", replace(compressed(read_table_dir(source)), row_lines={}))
    victim = min(p for p in (tmp_path / "gz").iterdir() if p.name.endswith(".gz"))
    packed = victim.read_bytes()
    victim.write_bytes(packed[: len(packed) // 2])  # cut off: the stream ends early
    with pytest.raises(ConfigError, match=f"{victim.name}.*cannot read table file"):
        read_table_dir(tmp_path / "gz")
    victim.write_bytes(b"plain text, not gzip")
    with pytest.raises(ConfigError, match="cannot read table file"):
        read_table_dir(tmp_path / "gz")


def test_bundled_tables_stay_under_the_cap() -> None:
    total = sum(p.stat().st_size for p in BUNDLED.rglob("*") if p.is_file())
    assert 0 < total <= BUNDLE_CAP_BYTES, f"bundled kernel tables take {total / 1e6:.1f} MB"
