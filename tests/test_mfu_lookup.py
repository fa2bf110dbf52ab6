"""Lookup: grid points reproduced exactly, interpolation inside, edge outside, None where no table
covers a kernel, monotone where the data is monotone, and cheap enough to sweep."""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.base.errors import InferSimError
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape, MemoryBoundShape, TableHit
from infersim.tables.format import DeviceInfo, GemmRow, Provenance, TableDirectory, TableInfo
from infersim.tables.table_files import read_table_dir
from infersim.tables.interpolation import INTERPOLATIONS, Interpolation, _same, build_grid
from infersim.tables.grid_points import grid_points
from infersim.tables.lookup import MfuTables, load_tables

IMPORTED = REPO_ROOT / "mfu_tables" / "imported"
H20_BF16, H20_FP8 = 148e12, 296e12
H800_BF16, H800_FP8 = 989.4e12, 1978.9e12
H20_ROWS, H800_ROWS = 1710, 585  # rows of the imported tables (380 + 110 GEMM rows ...)


@pytest.fixture(scope="module")
def h20() -> MfuTables:
    return load_tables(IMPORTED / "h20")


@pytest.fixture(scope="module")
def h800() -> MfuTables:
    return load_tables(IMPORTED / "h800")


def fp8_gemm(m: int, k: int = 2048, n: int = 6144) -> GemmShape:
    return GemmShape(m, k, n, "fp8", "fp8")


def decode(batch: int, kv_len: int) -> AttentionShape:
    return AttentionShape("mha", "decode", batch, 1, kv_len, 32, 8, 128, 128)


@pytest.mark.parametrize("device", ["h20", "h800"])
def test_every_grid_point_is_reproduced_exactly(device: str) -> None:
    table_dir = read_table_dir(IMPORTED / device)
    tables = MfuTables(IMPORTED / device, table_dir)
    checked = 0
    for name, rows in table_dir.tables.items():
        for row in rows:
            hit = tables.lookup(row.shape(), table_dir.provenance.peak_flops[row.dtype])
            assert hit is not None and hit.method == "exact", (name, row)
            assert hit.seconds == pytest.approx(row.latency_us * 1e-6, rel=1e-9), (name, row)
            assert hit.table == f"{device}/{name}"
            checked += 1
    assert checked == {"h20": H20_ROWS, "h800": H800_ROWS}[device]


def test_interpolation_is_affine_in_the_work_between_grid_points(h20: MfuTables) -> None:
    # m=2048 lies a third of the way from m=1024 (106.114 us) to m=4096 (384.141 us)
    hit = h20.lookup(fp8_gemm(2048), H20_FP8)
    assert hit is not None and hit.method == "interpolated" and hit.note == ""
    expected = 106.114e-6 + (384.141e-6 - 106.114e-6) * (2048 - 1024) / (4096 - 1024)
    assert hit.seconds == pytest.approx(expected, rel=1e-12)
    assert hit.efficiency == pytest.approx(2 * 2048 * 2048 * 6144 / (expected * H20_FP8), rel=1e-12)
    # decode: bilinear in (batch, kv_len) between batch 256 and 512, kv 1024 and 4096
    hit = h20.lookup(decode(384, 2560), H20_BF16)
    assert hit is not None and hit.method == "interpolated"
    low = 411.97 + (1524 - 411.97) * 0.5
    high = 825.67 + (3041.43 - 825.67) * 0.5
    assert hit.seconds == pytest.approx(1e-6 * (low + high) / 2, rel=1e-12)


def test_prefill_is_interpolated_in_causal_pairs_and_scales_with_batch(h20: MfuTables) -> None:
    one = h20.lookup(AttentionShape("mha", "prefill", 1, 2048, 2048, 32, 4, 128, 128), H20_BF16)
    assert one is not None and one.method == "interpolated"
    pairs = lambda s: s * (s + 1) / 2  # noqa: E731
    fraction = (pairs(2048) - pairs(1024)) / (pairs(4096) - pairs(1024))
    assert one.seconds == pytest.approx(1e-6 * (110.493 + (1121.634 - 110.493) * fraction), rel=1e-12)
    three = h20.lookup(AttentionShape("mha", "prefill", 3, 2048, 2048, 32, 4, 128, 128), H20_BF16)
    assert three.seconds == pytest.approx(3 * one.seconds, rel=1e-12)
    assert three.efficiency == pytest.approx(one.efficiency, rel=1e-12)


def test_outside_the_range_is_the_roofline_at_the_edge_efficiency(h20: MfuTables) -> None:
    hit = h20.lookup(fp8_gemm(4), H20_FP8)
    assert hit is not None and hit.method == "edge"
    assert hit.efficiency == pytest.approx(2 * 16 * 2048 * 6144 / (10.63e-6 * H20_FP8), rel=1e-9)
    assert hit.seconds == pytest.approx(2 * 4 * 2048 * 6144 / (H20_FP8 * hit.efficiency), rel=1e-12)
    assert "m=4 below the table's range 16..32768" in hit.note and "edge efficiency 0.128" in hit.note
    # above a work axis the time is extended at the last interval's slope (see the next test)
    above = h20.lookup(fp8_gemm(65536), H20_FP8)
    assert above.method == "extrapolated" and "m=65536 above the table's range 16..32768" in above.note
    assert above.efficiency >= 0.924021 * (1 - 1e-5)  # never below the edge efficiency
    # ragged grid: the batch-512 row stops at kv_len 8192, so (384, 65536) is outside that row
    ragged = h20.lookup(decode(384, 65536), H20_BF16)
    assert ragged.method == "extrapolated" and "kv_len=65536 above the table's range 1024..8192" in ragged.note
    # between two rows with the same range the clamp is said once (batch 24: both rows around it stop at 131072)
    between = h20.lookup(decode(24, 140000), H20_BF16)
    assert between.note.count("kv_len=140000 above the table's range 1024..131072") == 1


def test_kernels_no_table_covers_get_none(h20: MfuTables, h800: MfuTables) -> None:
    assert h20.lookup(GemmShape(1024, 2048, 6144, "bf16", "bf16"), H20_BF16) is None  # tables are fp8
    assert h20.lookup(fp8_gemm(1024, 2048, 6000), H20_FP8) is None  # no such (K, N)
    assert h20.lookup(GemmShape(1024, 2048, 6144, "fp8", "int4"), H20_FP8) is None  # other weight format
    windowed = AttentionShape("mha", "decode", 8, 1, 8192, 32, 8, 128, 128, window=4096)
    assert h20.lookup(windowed, H20_BF16) is None
    chunked = AttentionShape("mha", "prefill", 1, 1024, 4096, 32, 4, 128, 128)
    assert h20.lookup(chunked, H20_BF16) is None
    two_queries = AttentionShape("mla", "decode", 16, 2, 4096, 128, 1, 576, 512, rope_dim=64)
    assert h800.lookup(two_queries, H800_BF16) is None
    assert h800.lookup(MemoryBoundShape("rmsnorm", 1e6), H800_BF16) is None  # type: ignore[arg-type]
    fewer_per_kv_head = AttentionShape("mha", "decode", 8, 1, 8192, 16, 8, 128, 128)  # 2 a KV head: below 4
    assert h20.lookup(fewer_per_kv_head, H20_BF16) is None
    fp8_kv = AttentionShape("mha", "decode", 16, 1, 8192, 32, 8, 128, 128, kv_dtype="fp8")
    assert h20.lookup(fp8_kv, H20_BF16).seconds == pytest.approx(164.13e-6, rel=1e-9)


def test_grouped_gemm_interpolates_over_ep_as_local_experts(h800: MfuTables) -> None:
    shape = GroupedGemmShape("decode", "up", 256, 48, 8, 7168, 2048, 128.0, 5.33, dtype="fp8", weight_dtype="fp8")
    hit = h800.lookup(shape, H800_FP8)
    assert hit is not None and hit.method == "interpolated"
    # ep enters as 1/ep; the row at 128 tokens per GPU has ep 16: 196.722, 32: 120.397, 64: 93.832,
    # 128: 90.889 us. The straight line between ep 32 and 64 overestimates a convex curve; the secant
    # through ep 128 and 64, extended to ep 48, is the larger lower bound and is what the lookup gives.
    x, x16, x32, x64, x128 = 1 / 48, 1 / 16, 1 / 32, 1 / 64, 1 / 128
    straight = 93.832 + (120.397 - 93.832) * (x - x64) / (x32 - x64)
    from_below = 93.832 + (93.832 - 90.889) / (x64 - x128) * (x - x64)
    from_above = 120.397 - (196.722 - 120.397) / (x16 - x32) * (x32 - x)
    assert from_above < from_below < straight
    assert hit.seconds == pytest.approx(1e-6 * from_below, rel=1e-12)


def test_the_callers_peak_scales_time_and_keeps_efficiency(h800: MfuTables) -> None:
    base = h800.lookup(fp8_gemm(1024, 7168, 1536), H800_FP8)
    doubled = h800.lookup(fp8_gemm(1024, 7168, 1536), 2 * H800_FP8)
    assert doubled.seconds == pytest.approx(base.seconds / 2, rel=1e-12)
    assert doubled.efficiency == pytest.approx(base.efficiency, rel=1e-12)


def test_a_root_with_several_devices_must_be_narrowed_down() -> None:
    with pytest.raises(InferSimError, match="several device table directories \\(h20, h800\\)"):
        load_tables(IMPORTED)


def test_describe_names_directory_device_and_origin(h800: MfuTables) -> None:
    text = h800.describe()
    # a bundled directory is named the same on every machine (the README example depends on it)
    assert text.startswith("mfu_tables/imported/h800 (bundled) (NVIDIA H800 SXM, imported from original InferSim")
    assert "1 attention prefill" in text and "10 gemm" in text


def test_describe_names_a_directory_outside_the_bundle_by_its_path(tmp_path: Path) -> None:
    copy = tmp_path / "my-h800"
    shutil.copytree(IMPORTED / "h800", copy)
    assert load_tables(copy).describe().startswith(f"{copy} (NVIDIA H800 SXM")


# ---------------------------------------------------------------------------------------------
# Monotone where the data is monotone


def monotone_gemm_grids(device: str) -> list[tuple[int, int, list[int]]]:
    sources = grid_points(read_table_dir(IMPORTED / device))
    grids = []
    for key, source in sources.items():
        if key[0] != "gemm":
            continue
        points = sorted((p.coords[0], p.seconds) for p in source.points)
        if all(b[1] >= a[1] for a, b in zip(points, points[1:])):
            grids.append((key[2], key[3], [int(m) for m, _ in points]))
    return grids


H20_MONOTONE = monotone_gemm_grids("h20")


def test_published_gemm_grids_monotone_in_m_are_found() -> None:
    # 14 of the 34 H20 GEMM grids; the others have small-m timing noise (e.g. m=32 faster than m=16)
    assert len(H20_MONOTONE) == 14
    assert (2048, 6144, [16, 32, 64, 128, 256, 512, 1024, 4096, 8192, 16384, 32768]) not in H20_MONOTONE


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_time_is_monotone_in_m_where_the_table_is(h20: MfuTables, data: st.DataObject) -> None:
    k, n, ms = data.draw(st.sampled_from(H20_MONOTONE))
    low = data.draw(st.integers(min_value=ms[0], max_value=ms[-1] - 1))
    high = data.draw(st.integers(min_value=low + 1, max_value=ms[-1]))
    t_low = h20.lookup(fp8_gemm(low, k, n), H20_FP8).seconds
    t_high = h20.lookup(fp8_gemm(high, k, n), H20_FP8).seconds
    assert t_low <= t_high * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.floats(min_value=1.0, max_value=1e4), min_size=2, max_size=8),
    queries=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=6),
    scheme=st.sampled_from(["envelope", "time", "log-efficiency"]),
)
def test_interpolation_of_monotone_data_is_monotone(times: list[float], queries: list[float], scheme: str) -> None:
    ms = [16 * 2**i for i in range(len(times))]
    cumulative = [sum(times[: i + 1]) for i in range(len(times))]  # non-decreasing in m
    if scheme == "log-efficiency":
        cumulative = [c * m / ms[0] for c, m in zip(cumulative, ms)]  # efficiency non-increasing: time grows
    points = [((m,), t * 1e-6, 2 * m * 64 * 64 / (t * 1e-6 * 1e15)) for m, t in zip(ms, cumulative)]
    grid = build_grid(("m",), points, 1e15, INTERPOLATIONS[scheme])
    span = ms[-1] - ms[0]
    values = sorted(ms[0] + q * span for q in queries)
    seconds = [grid.evaluate((m,), 2 * m * 64 * 64).seconds for m in values]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(seconds, seconds[1:]))


def knee_grid(points_us: dict[int, float], scheme: str = "envelope"):
    points = [((m,), t * 1e-6, 2 * m * 64 * 64 / (t * 1e-6 * 1e15)) for m, t in points_us.items()]
    return build_grid(("m",), points, 1e15, INTERPOLATIONS[scheme])


def test_envelope_follows_a_knee_the_straight_line_cuts() -> None:
    # flat at 10 us up to m = 32 (weight-bound), then 20 us per 128 rows: the true time at m = 64 is 10 us
    grid = knee_grid({16: 10.0, 32: 10.0, 128: 20.0, 256: 40.0})
    assert grid.evaluate((64,), 2 * 64 * 64 * 64).seconds == pytest.approx(10e-6, rel=1e-12)
    assert knee_grid({16: 10.0, 32: 10.0, 128: 20.0, 256: 40.0}, "time").evaluate(
        (64,), 2 * 64 * 64 * 64).seconds == pytest.approx((10 + 10 * 32 / 96) * 1e-6, rel=1e-12)
    # past the knee (m = 192) the right-hand secant is exact: 20 + 20 * 64 / 128 = 30 us
    assert grid.evaluate((192,), 2 * 192 * 64 * 64).seconds == pytest.approx(30e-6, rel=1e-12)


def test_envelope_keeps_the_straight_line_where_data_are_concave_or_at_a_row_end() -> None:
    # concave: time per row falls with m (efficiency rising), extensions lie above the straight line
    concave = knee_grid({16: 10.0, 32: 18.0, 64: 30.0, 128: 40.0})
    assert concave.evaluate((48,), 2 * 48 * 64 * 64).seconds == pytest.approx(24e-6, rel=1e-12)
    # the last interval has a segment on one side only: straight line
    assert knee_grid({16: 10.0, 32: 10.0, 128: 20.0}).evaluate((64,), 1.0).seconds == pytest.approx(
        (10 + 10 * 32 / 96) * 1e-6, rel=1e-12)


def test_table_directory_built_in_memory_answers_lookups(tmp_path: Path) -> None:
    rows = tuple(GemmRow("bf16", m, 4096, 4096, t) for m, t in ((64, 20.0), (128, 24.0), (256, 40.0)))
    prov = Provenance(1, DeviceInfo("test GPU"), {"bf16": 1e15}, "measured", "2026-01-01", "2026-01-01", "test",
                      tables={"gemm.csv": TableInfo("gemm", "test")})
    tables = MfuTables(tmp_path, TableDirectory(prov, {"gemm.csv": rows}))
    hit = tables.lookup(GemmShape(192, 4096, 4096), 1e15)
    assert hit.method == "interpolated" and hit.seconds == pytest.approx(32e-6, rel=1e-12)


def test_above_a_work_axis_the_time_carries_on_at_the_last_intervals_slope() -> None:
    """t = 10 us fixed + 1 us per unit of m (peak 1e15 FLOP/s, 1e6 FLOP per unit): from the last two
    points (m=4: 14 us, m=8: 18 us) the slope is 1 us per unit, so m=20 takes 18 + 12 = 30 us
    (constant edge efficiency would say 18 x 20/8 = 45 us)."""
    points = [((m,), (10.0 + m) * 1e-6, m * 1e6 / (1e15 * (10.0 + m) * 1e-6)) for m in (1.0, 2.0, 4.0, 8.0)]
    grid = build_grid(("m",), points, 1e15)
    value = grid.evaluate((20.0,), 20e6)
    assert value.seconds == pytest.approx(30e-6)
    assert value.clamps and all(c.extrapolated for c in value.clamps)
    # a last interval steeper than proportional (efficiency falling) is capped at the edge efficiency
    steep = build_grid(("m",), [((4.0,), 4e-6, 1e-3), ((8.0,), 16e-6, 0.5e-3)], 1e15)
    assert steep.evaluate((16.0,), 16e6).seconds == pytest.approx(32e-6)
    # never faster than the peak: a flat last interval still costs the FLOPs at peak
    flat = build_grid(("m",), [((4.0,), 5e-6, 1e-3), ((8.0,), 5e-6, 1e-3)], 1e15)
    assert flat.evaluate((1e4,), 1e10).seconds == pytest.approx(1e-5)
    # below the range, and on the ep axis, the edge efficiency still holds
    assert not all(c.extrapolated for c in grid.evaluate((0.5,), 0.5e6).clamps)


def test_above_a_dense_row_the_slope_spans_the_last_doubling_not_one_noisy_interval() -> None:
    """t = 10 us + 1 us per unit of m, measured at m = 1, 2, 4, 8, 12, 16 with the point at m = 12
    4 us slow (26 us where the kernel takes 22): the last interval (12 -> 16) is flat, and carried on
    it would price m = 32 at 26 us. The slope over the last doubling (8 -> 16: 18 -> 26 us) is the
    kernel's 1 us per unit, so m = 32 takes 26 + 16 = 42 us, its true time."""
    times = {1.0: 11.0, 2.0: 12.0, 4.0: 14.0, 8.0: 18.0, 12.0: 26.0, 16.0: 26.0}
    points = [((m,), t * 1e-6, m * 1e6 / (1e15 * t * 1e-6)) for m, t in times.items()]
    grid = build_grid(("m",), points, 1e15)
    assert grid.evaluate((32.0,), 32e6).seconds == pytest.approx(42e-6)
    # half the top between two points: the row 1, 2, 4, 8, 24 (34 us) has half its top, 12, between
    # 8 (18 us) and 24, interpolated to 18 + 16 * 4 / 16 = 22 us: slope (34 - 22) / 12 = 1 us per unit
    sparse = build_grid(("m",), [((m,), (10.0 + m) * 1e-6, 1e-3) for m in (1.0, 2.0, 4.0, 8.0, 24.0)], 1e15)
    assert sparse.evaluate((40.0,), 40e6).seconds == pytest.approx(50e-6)


def test_extrapolation_benchmark_prefers_the_slope_rule_on_the_imported_tables(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mfu_extrapolation", REPO_ROOT / "benchmarks" / "mfu_extrapolation.py")
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(bench)
    axis, edge, slope, doubling = bench.predictions(IMPORTED / "h20" / "gemm.csv", 512.0)
    assert axis == "m" and len(edge) == len(slope) == len(doubling) == 314
    assert statistics.median(slope) < statistics.median(edge) < 0.05
    assert bench.main([str(IMPORTED / "h800")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("all")


def test_indexed_tables_are_cached_on_disk_between_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import infersim.tables.lookup as lookup

    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("INFERSIM_CACHE", "on")
    copy = tmp_path / "h800"
    shutil.copytree(IMPORTED / "h800", copy)
    monkeypatch.setattr(lookup, "_LOADED", {})
    first = load_tables(copy)
    [cached] = list((tmp_path / "cache").glob("tables-*.entry"))
    monkeypatch.setattr(lookup, "_LOADED", {})  # a new process: only the disk cache is left
    second = load_tables(copy)
    assert second is not first and second.describe() == first.describe()
    shape = fp8_gemm(100)
    assert second.lookup(shape, H20_FP8) == first.lookup(shape, H20_FP8)
    # a damaged cache file is read past, an edited table gets a new entry
    cached.write_bytes(b"not an entry")
    monkeypatch.setattr(lookup, "_LOADED", {})
    assert load_tables(copy).lookup(shape, H20_FP8) == first.lookup(shape, H20_FP8)
    table = next(copy.glob("gemm*.csv"))
    table.write_text(table.read_text())
    os.utime(table, ns=(1, 1))
    monkeypatch.setattr(lookup, "_LOADED", {})
    load_tables(copy)
    assert len(list((tmp_path / "cache").glob("tables-*.entry"))) == 2
    # turned off: nothing written
    monkeypatch.setenv("INFERSIM_CACHE", "off")
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "off"))
    monkeypatch.setattr(lookup, "_LOADED", {})
    load_tables(copy)
    assert not (tmp_path / "off").exists()


def _grouped_table(tmp_path: Path) -> MfuTables:
    """One MoE grouped GEMM (16 experts, top-2, hidden 1024, width 512, fp8) timed at EP 1 up to 8192
    tokens per GPU (compute-bound there, efficiency 0.5) and at EP 8 only up to 64 (weight-bound:
    every local expert's 2 x 1 MiB of weights streamed at 1 TB/s, plus a 2 us fixed cost)."""
    from infersim.tables.format import GroupedGemmRow

    peak = 1e15
    rows = []
    for tokens in (1024, 2048, 4096, 8192):
        shape = GroupedGemmRow("fp8", "prefill", "up", 16, 1, 2, 1024, 512, True, tokens, 0.0).shape()
        rows.append(GroupedGemmRow("fp8", "prefill", "up", 16, 1, 2, 1024, 512, True, tokens,
                                   shape.flops / (0.5 * peak) * 1e6))
    for tokens in (16, 32, 64):
        shape = GroupedGemmRow("fp8", "prefill", "up", 16, 8, 2, 1024, 512, True, tokens, 0.0).shape()
        rows.append(GroupedGemmRow("fp8", "prefill", "up", 16, 8, 2, 1024, 512, True, tokens,
                                   (2e-6 + shape.bytes / 1e12) * 1e6))
    prov = Provenance(1, DeviceInfo("test GPU"), {"fp8": peak}, "measured", "2026-01-01", "2026-01-01", "test",
                      tables={"grouped_gemm_fp8.csv": TableInfo("grouped_gemm", "test")})
    return MfuTables(tmp_path, TableDirectory(prov, {"grouped_gemm_fp8.csv": tuple(rows)}))


def test_grouped_gemm_crossing_into_compute_takes_the_roofline_anchored_at_the_table(tmp_path: Path) -> None:
    """At EP 8 the row ends weight-bound at 64 tokens; 8192 tokens per GPU are compute-bound on the
    card's roofline, where the row's slope (weights re-read, a few activations added) says nothing:
    priced at the table's streaming rate at 64 tokens and its best efficiency (0.5, at EP 1)."""
    from infersim.run.config import load_hardware_card
    from infersim.tables.beyond_range import beyond_range
    from infersim.costing.timing import roofline_rates

    tables = _grouped_table(tmp_path)
    hw, _ = load_hardware_card("h800")
    shape = GroupedGemmShape("prefill", "up", 16, 8, 2, 1024, 512, 8192.0, 2.0, dtype="fp8", weight_dtype="fp8")
    hit = tables.lookup(shape, 1e15)
    assert hit.method == "extrapolated" and hit.edge_axis == "tokens_per_gpu" and hit.edge_value == 64
    assert hit.best_efficiency == pytest.approx(0.5)
    edge = GroupedGemmShape("prefill", "up", 16, 8, 2, 1024, 512, 64.0, 2.0, dtype="fp8", weight_dtype="fp8")
    assert hit.edge_seconds == pytest.approx(2e-6 + edge.bytes / 1e12)
    priced = beyond_range(shape, hit, lambda s: roofline_rates(s, hw), 1e15)
    streaming = edge.bytes / hit.edge_seconds
    assert priced.method == "edge"
    assert priced.seconds == pytest.approx(max(shape.flops / 0.5e15, shape.bytes / streaming))
    assert priced.seconds > 1.5 * hit.seconds  # a weight stream's slope barely grows with tokens: too fast once compute binds
    assert "memory-bound at the table's last point, compute-bound here" in priced.note
    # inside one regime the slope stands: 128 tokens are still weight-bound
    near = GroupedGemmShape("prefill", "up", 16, 8, 2, 1024, 512, 128.0, 2.0, dtype="fp8", weight_dtype="fp8")
    near_hit = tables.lookup(near, 1e15)
    assert beyond_range(near, near_hit, lambda s: roofline_rates(s, hw), 1e15) == near_hit


def test_one_row_grids_and_attention_keep_the_slope_beyond_their_range(h800: MfuTables) -> None:
    from infersim.run.config import load_hardware_card
    from infersim.tables.beyond_range import beyond_range
    from infersim.costing.timing import kernel_cost, roofline_rates

    hw, _ = load_hardware_card("h800")
    shape = fp8_gemm(1 << 20, 7168, 2112)  # far above every m the GEMM tables measured
    hit = h800.lookup(shape, H800_FP8)
    if hit is not None and hit.method == "extrapolated":
        assert hit.best_efficiency == 0.0  # one row: nothing else measured
        assert beyond_range(shape, hit, lambda s: roofline_rates(s, hw), H800_FP8) == hit
        assert kernel_cost(shape, hw, h800).source.value == "table"



def _grouped_by_scan(values: list[float]) -> dict[float, list[int]]:
    """The grouping of a grid level by the plain scan over every key in the order made: key ->
    the indices of the values that joined it."""
    groups: dict[float, list[int]] = {}
    for i, v in enumerate(values):
        key = next((k for k in groups if _same(k, v)), v)
        groups.setdefault(key, []).append(i)
    return groups


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 1024.0, 3.5e6]), min_size=1, max_size=40),
       st.lists(st.sampled_from([-2e-9, -1e-9, -4e-10, 0.0, 4e-10, 1e-9, 2e-9]), min_size=40, max_size=40))
def test_a_grid_level_groups_coordinates_within_tolerance_as_a_scan_would(bases: list[float],
                                                                         nudges: list[float]) -> None:
    """Points within the relative tolerance (1e-9) of a key join the earliest such key; a level
    finds it by bisection, which must group exactly as scanning every key in order does."""
    values = [b * (1 + n) for b, n in zip(bases, nudges)]
    seconds = [1e-6 * (i + 1) for i in range(len(values))]
    identity = Interpolation("test", lambda axis, x: x, interpolates_time=True)
    root = build_grid(("m",), (((v,), t, 0.5) for v, t in zip(values, seconds)), 1e15, identity).root
    groups = _grouped_by_scan(values)
    assert root.coords == tuple(sorted(groups))
    for key, (mean_seconds, _eff) in zip(root.coords, root.children):
        members = groups[key]
        assert mean_seconds == pytest.approx(sum(seconds[i] for i in members) / len(members), rel=1e-12)


def test_an_extended_row_computes_its_flops_no_faster_than_the_roofline() -> None:
    """A compute-bound GEMM row whose last two points lie close together (run-to-run noise) has a
    last-interval slope below what executing the FLOPs takes: the extension is held to all of the
    query's FLOPs at the highest of the card's rate, the kernel's own at the row's last point and the
    grid's best (the FLOPs overlap the bytes streamed, so they bound the whole time, not the time
    beyond the edge). Hand roofline: FLOPs as the shape counts them, 100 TFLOP/s, 1 TB/s."""
    from dataclasses import replace

    from infersim.tables.beyond_range import roofline_floor

    edge, shape = GemmShape(4096, 4096, 4096), GemmShape(8192, 4096, 4096)
    edge_seconds = edge.flops / 80e12  # measured at 80 TFLOP/s, below the card's 100: 1.718 ms
    hit = TableHit(edge_seconds * 1.05, "t.csv", "extrapolated", 0.0, "", "m", 4096.0, edge_seconds)
    roofline = lambda s: (s.flops, 100e12, 1e12)  # noqa: E731
    floored = roofline_floor(shape, edge, hit, roofline, 1e15)
    assert shape.flops == 2 * 8192 * 4096 * 4096  # 275 GFLOP: 2.749 ms at 100 TFLOP/s
    assert floored.seconds == pytest.approx(shape.flops / 100e12)
    assert "at least its 275 GFLOP at the fastest FLOP rate" in floored.note
    # measured faster at its last point than the card's rate: that rate holds (1.374 ms, above the
    # 0.687 ms edge plus 67 MB more A and C read at 1 TB/s)
    fast = replace(hit, seconds=edge.flops / 200e12 * 1.05, edge_seconds=edge.flops / 200e12)
    assert roofline_floor(shape, edge, fast, roofline, 1e15).seconds == pytest.approx(shape.flops / 200e12)
    # the grid's best efficiency (0.3 of the 1e15 peak) is higher still: 0.916 ms, below the 1.804 ms
    # the slope gives, which stands (it is above the bytes' floor, 1.718 + 0.067 ms)
    best = replace(hit, best_efficiency=0.3)
    assert roofline_floor(shape, edge, best, roofline, 1e15) == best
    # a slope already slower than the roofline stands
    slow = replace(hit, seconds=edge_seconds + 2 * (shape.flops - edge.flops) / 100e12)
    assert roofline_floor(shape, edge, slow, roofline, 1e15) == slow
