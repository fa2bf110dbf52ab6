"""Sliding-window attention in the kernel tables: the attention CSVs' optional `window` column,
lookup grids keyed by the window (a windowed shape is answered only by rows of its window, full
attention never by them), the windowed axes (decode kv_len held flat above the window, prefill over
attended query-key pairs), and aiconfigurator's window_size rows kept by the importer.

All fixtures are small hand-written tables: neither pyarrow, aiconfigurator-core nor ../shared is needed.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from infersim.base.errors import ConfigError
from infersim.shapes.kernels import AttentionShape
from infersim.tabletools import aiconfigurator as aic
from infersim.tabletools import aiconfigurator_convert as aic_convert
from infersim.tables.format import AttentionRow, DeviceInfo, Provenance, TableDirectory, TableInfo
from infersim.tables.output import write_table_dir
from infersim.tables.table_files import read_table_csv, read_table_dir, table_csv_text
from infersim.tables.lookup import MfuTables, load_tables

PEAK = 1e15  # the fixtures' bf16 peak FLOP/s
GPT_OSS = dict(num_heads=64, num_kv_heads=8, qk_head_dim=64, v_head_dim=64)  # GPT-OSS-120B, one GPU's heads


def row(stage: str = "decode", batch: int = 8, kv_len: int = 128, latency_us: float = 10.0,
        window: int = 0) -> AttentionRow:
    q_len = 1 if stage == "decode" else kv_len
    return AttentionRow(kind="mha", stage=stage, dtype="bf16", kv_dtype="bf16", causal=True, batch=batch,  # type: ignore[arg-type]
                        q_len=q_len, kv_len=kv_len, latency_us=latency_us, window=window, **GPT_OSS)


def shape(stage: str = "decode", batch: int = 8, kv_len: int = 128, window: int = 0) -> AttentionShape:
    q_len = 1 if stage == "decode" else kv_len
    return AttentionShape("mha", stage, batch, q_len, kv_len, window=window, **GPT_OSS)  # type: ignore[arg-type]


def tables_of(rows: list[AttentionRow], directory: Path) -> MfuTables:
    prov = Provenance(1, DeviceInfo("test GPU"), {"bf16": PEAK}, "measured", "2026-01-01", "2026-01-01", "test",
                      tables={"attention.csv": TableInfo("attention", "test")})
    return MfuTables(directory, TableDirectory(prov, {"attention.csv": tuple(rows)}))


# ---------------------------------------------------------------------------------------------
# Format


def test_window_column_is_written_only_when_a_row_has_a_window(tmp_path: Path) -> None:
    full = table_csv_text("attention", [row()], lambda dtype: PEAK)
    assert full.splitlines()[0] == ("kind,stage,dtype,kv_dtype,num_heads,num_kv_heads,qk_head_dim,v_head_dim,"
                                    "causal,batch,q_len,kv_len,latency_us,efficiency,source_mfu")
    mixed = table_csv_text("attention", [row(), row(kv_len=4096, latency_us=16.0, window=128)], lambda dtype: PEAK)
    header, first, second = mixed.splitlines()
    assert header.endswith(",source_mfu,window")
    # full: 2 x 8 seqs x 64 heads x 128 keys x (64 + 64) / (10e-6 s x 1e15) = 0.0016777216
    assert first == "mha,decode,bf16,bf16,64,8,64,64,true,8,1,128,10,0.00167772,,0"
    # windowed: kv_len 4096 but 128 keys attended: the same FLOPs in 16 us = 0.001048576
    assert second == "mha,decode,bf16,bf16,64,8,64,64,true,8,1,4096,16,0.00104858,,128"
    path = tmp_path / "attention.csv"
    path.write_text(mixed)
    back = read_table_csv(path, "attention", lambda dtype: PEAK)
    assert back == (row(), row(kv_len=4096, latency_us=16.0, window=128))
    assert back[1].shape().window == 128 and back[1].shape().kv_tokens_read == 128
    path.write_text(full)  # a table without the column reads as full attention
    (old,) = read_table_csv(path, "attention", lambda dtype: PEAK)
    assert old.window == 0 and old == row()


def test_an_empty_window_cell_is_full_attention(tmp_path: Path) -> None:
    path = tmp_path / "attention.csv"
    windowed = table_csv_text("attention", [row(kv_len=4096, window=128)], lambda dtype: PEAK)
    path.write_text(windowed.replace(",128\n", ",\n"))
    with pytest.raises(ConfigError, match="efficiency"):  # read as window 0: the stored efficiency no longer fits
        read_table_csv(path, "attention", lambda dtype: PEAK)
    path.write_text(table_csv_text("attention", [row()], lambda dtype: PEAK).replace(
        "source_mfu\n", "source_mfu,window\n").replace(",\n", ",,\n"))
    assert read_table_csv(path, "attention", lambda dtype: PEAK) == (row(),)


@pytest.mark.parametrize("bad", ["-128", "12.5", "wide"])
def test_a_bad_window_is_named_with_file_line_and_value(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "attention.csv"
    text = table_csv_text("attention", [row(), row(window=128)], lambda dtype: PEAK)
    path.write_text(text.replace(",128\n", f",{bad}\n"))
    with pytest.raises(ConfigError) as err:
        read_table_csv(path, "attention", lambda dtype: PEAK)
    message = str(err.value)
    assert f"{path}:3" in message and "window" in message and bad in message


def test_bundled_attention_tables_without_windows_are_written_byte_identical(tmp_path: Path) -> None:
    rows = [row(), row(batch=16, kv_len=256, latency_us=12.5)]
    prov = Provenance(1, DeviceInfo("test GPU"), {"bf16": PEAK}, "measured", "2026-01-01", "2026-01-01", "test",
                      tables={"attention.csv": TableInfo("attention", "test")})
    write_table_dir(tmp_path, TableDirectory(prov, {"attention.csv": tuple(rows)}))
    text = (tmp_path / "attention.csv").read_text()
    assert "window" not in text
    again = read_table_dir(tmp_path)
    assert table_csv_text("attention", again.tables["attention.csv"], lambda dtype: PEAK) == text


# ---------------------------------------------------------------------------------------------
# Lookup


def test_a_window_shape_is_answered_by_window_rows_and_full_attention_by_full_rows(tmp_path: Path) -> None:
    tables = tables_of([row(kv_len=128, latency_us=10.0), row(kv_len=4096, latency_us=40.0),
                        row(kv_len=128, latency_us=9.0, window=128), row(kv_len=4096, latency_us=12.0, window=128)],
                       tmp_path)
    hit = tables.lookup(shape(kv_len=4096, window=128), PEAK)
    assert hit is not None and hit.method == "exact" and hit.seconds == pytest.approx(12e-6, rel=1e-12)
    hit = tables.lookup(shape(kv_len=4096), PEAK)
    assert hit is not None and hit.method == "exact" and hit.seconds == pytest.approx(40e-6, rel=1e-12)
    # between grid points, each from its own rows: kv 2112 is half-way from 128 to 4096
    assert tables.lookup(shape(kv_len=2112, window=128), PEAK).seconds == pytest.approx(10.5e-6, rel=1e-12)
    assert tables.lookup(shape(kv_len=2112), PEAK).seconds == pytest.approx(25e-6, rel=1e-12)
    # another window has no rows
    assert tables.lookup(shape(kv_len=4096, window=256), PEAK) is None


def test_window_rows_never_answer_full_attention_nor_full_rows_a_window(tmp_path: Path) -> None:
    only_window = tables_of([row(kv_len=128, latency_us=9.0, window=128), row(kv_len=4096, latency_us=12.0, window=128)],
                            tmp_path / "w")
    assert only_window.lookup(shape(kv_len=4096), PEAK) is None
    assert only_window.lookup(shape(kv_len=4096, window=128), PEAK).seconds == pytest.approx(12e-6, rel=1e-12)
    only_full = tables_of([row(kv_len=128, latency_us=10.0), row(kv_len=4096, latency_us=40.0)], tmp_path / "f")
    assert only_full.lookup(shape(kv_len=4096, window=128), PEAK) is None
    assert only_full.lookup(shape(kv_len=4096), PEAK).seconds == pytest.approx(40e-6, rel=1e-12)


def test_windowed_decode_above_a_row_is_extended_only_up_to_the_window(tmp_path: Path) -> None:
    tables = tables_of([
        # batch 8: measured past the window (settled at 12 us)
        row(batch=8, kv_len=64, latency_us=8.0, window=128), row(batch=8, kv_len=256, latency_us=12.0, window=128),
        # batch 512: measured over short contexts only, still growing inside the window
        row(batch=512, kv_len=32, latency_us=40.0, window=128), row(batch=512, kv_len=64, latency_us=48.0, window=128),
        # full attention, the same points: extended at the last interval's slope as before
        row(batch=512, kv_len=32, latency_us=40.0), row(batch=512, kv_len=64, latency_us=48.0),
    ], tmp_path)
    hit = tables.lookup(shape(batch=8, kv_len=32768, window=128), PEAK)
    assert hit is not None and hit.method == "extrapolated" and hit.seconds == pytest.approx(12e-6, rel=1e-12)
    assert "window 128" in hit.note and "kv_len=32768 above" in hit.note
    # slope 8 us / 32 tokens up to kv 128 (+16 us), flat beyond: 48 + 16 = 64 us at any longer context
    for kv in (1024, 32768):
        hit = tables.lookup(shape(batch=512, kv_len=kv, window=128), PEAK)
        assert hit is not None and hit.method == "extrapolated"
        assert hit.seconds == pytest.approx(64e-6, rel=1e-12)
    # inside the window the slope applies as for full attention: kv 96 is 48 + 8 = 56 us
    assert tables.lookup(shape(batch=512, kv_len=96, window=128), PEAK).seconds == pytest.approx(56e-6, rel=1e-12)
    # full attention keeps growing: 48 us + 0.25 us per token x (1024 - 64) = 288 us
    full = tables.lookup(shape(batch=512, kv_len=1024), PEAK)
    assert full.method == "extrapolated" and full.seconds == pytest.approx(288e-6, rel=1e-12)


def pairs(s: int, w: int = 128) -> float:
    """Query-key pairs of one head over a causal sequence of s tokens with a window of w."""
    return s * (s + 1) / 2 if s <= w else w * (w + 1) / 2 + (s - w) * w


def test_windowed_prefill_is_interpolated_over_attended_pairs(tmp_path: Path) -> None:
    tables = tables_of([row("prefill", 1, 1024, 100.0, window=128), row("prefill", 1, 2048, 160.0, window=128),
                        row("prefill", 1, 1024, 100.0), row("prefill", 1, 2048, 300.0)], tmp_path)
    hit = tables.lookup(shape("prefill", 1, 2048, window=128), PEAK)
    assert hit.method == "exact" and hit.seconds == pytest.approx(160e-6, rel=1e-12)
    # beyond the window the work is linear in the sequence: 1536 tokens is half-way, 130 us
    mid = tables.lookup(shape("prefill", 1, 1536, window=128), PEAK)
    assert mid.method == "interpolated" and mid.seconds == pytest.approx(130e-6, rel=1e-12)
    assert (pairs(1536) - pairs(1024)) / (pairs(2048) - pairs(1024)) == pytest.approx(0.5)
    # full attention stays in s(s+1)/2 (1536 is 5/12 of the way in pairs): 100 + 200 x t
    t = (1536 * 1537 - 1024 * 1025) / (2048 * 2049 - 1024 * 1025)
    assert tables.lookup(shape("prefill", 1, 1536), PEAK).seconds == pytest.approx((100 + 200 * t) * 1e-6, rel=1e-12)
    # above the range: on at the last interval's cost per pair, linear in the sequence (60 us per 1024 tokens)
    far = tables.lookup(shape("prefill", 1, 4096, window=128), PEAK)
    assert far.method == "extrapolated" and far.seconds == pytest.approx(280e-6, rel=1e-12)
    # a batch of sequences is that many one-sequence kernels
    assert tables.lookup(shape("prefill", 3, 2048, window=128), PEAK).seconds == pytest.approx(480e-6, rel=1e-12)


def test_a_table_directory_with_window_rows_loads_from_disk(tmp_path: Path) -> None:
    rows = (row(kv_len=128, latency_us=9.0, window=128), row(kv_len=4096, latency_us=12.0, window=128),
            row(kv_len=4096, latency_us=40.0))
    prov = Provenance(1, DeviceInfo("test GPU"), {"bf16": PEAK}, "measured", "2026-01-01", "2026-01-01", "test",
                      tables={"attention.csv": TableInfo("attention", "test")})
    write_table_dir(tmp_path, TableDirectory(prov, {"attention.csv": rows}))
    tables = load_tables(tmp_path)
    assert tables.lookup(shape(kv_len=4096, window=128), PEAK).seconds == pytest.approx(12e-6, rel=1e-12)
    assert tables.lookup(shape(kv_len=4096), PEAK).seconds == pytest.approx(40e-6, rel=1e-12)
    assert "window 128" not in tables.describe()


# ---------------------------------------------------------------------------------------------
# Importer


def aic_attention(op: str, batch: int, isl: int, step: int, ms: float, window: int = 0, beam: int = 1) -> dict:
    """One row in aiconfigurator's attention table columns (GPT-OSS's 64/8/64 layout)."""
    return {"framework": "TRTLLM", "version": "1.3.0rc20", "device": "NVIDIA H200", "op_name": op,
            "kernel_source": "torch_flow", "batch_size": batch, "isl": isl, "num_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "window_size": window, "beam_width": beam,
            "attn_dtype": "bfloat16", "kv_cache_dtype": "fp8", "step": step, "latency": ms}


def write_records(path: Path, records: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def test_importer_keeps_window_rows_and_skips_beam_search(tmp_path: Path) -> None:
    path = tmp_path / "generation_attention_perf.csv"
    write_records(path, [
        aic_attention("generation_attention", 64, 1, 127, 0.0107, window=128),
        aic_attention("generation_attention", 64, 1, 4095, 0.0160, window=128),
        aic_attention("generation_attention", 64, 1, 4095, 0.0832),
        aic_attention("generation_attention", 64, 1, 4095, 0.0900, beam=2),
    ])
    conv = aic_convert.convert_generation_attention(aic.read_records(path), str(path))
    assert [(r.window, r.batch, r.q_len, r.kv_len, r.kv_dtype, r.latency_us) for r in conv.rows] == [
        (128, 64, 1, 128, "fp8", pytest.approx(10.7)), (128, 64, 1, 4096, "fp8", pytest.approx(16.0)),
        (0, 64, 1, 4096, "fp8", pytest.approx(83.2))]
    notes = " ".join(conv.notes)
    assert "1 rows skipped: beam search" in notes and "window_size > 0 rows kept" in notes and "windows 128" in notes
    context = tmp_path / "context_attention_perf.csv"
    write_records(context, [aic_attention("context_attention", 1, 1024, 0, 0.0751, window=128),
                            aic_attention("context_attention", 1, 1024, 0, 0.0613)])
    prefill = aic_convert.convert_context_attention(aic.read_records(context), str(context)).rows
    assert [(r.window, r.q_len, r.kv_len, r.latency_us) for r in prefill] == [
        (128, 1024, 1024, pytest.approx(75.1)), (0, 1024, 1024, pytest.approx(61.3))]


def test_thinning_keeps_the_window_knee(tmp_path: Path) -> None:
    """A windowed decode's time grows with kv_len up to the window and levels off beyond it: thinning
    keeps the knee (an interpolation across it would miss by far more than the tolerance), where full
    attention, linear in kv_len throughout, keeps only its ends."""
    from infersim.tabletools.thinning import thin_rows

    path = tmp_path / "generation_attention_perf.csv"
    steps = (63, 127, 255, 511, 1023, 2047)
    write_records(path, [aic_attention("generation_attention", 8, 1, s, 0.008 + 1e-5 * (min(s + 1, w) if w else s + 1),
                                       window=w) for w in (0, 128) for s in steps])
    rows = aic_convert.convert_generation_attention(aic.read_records(path), str(path)).rows
    kept = sorted((r.window, r.kv_len) for r in thin_rows(rows, 0.03).rows)
    # full: 64 and the last two; window 128: also 128, the knee (a line from 64 to 256 gives 8.853 us there,
    # 4.6% below the measured 9.28 us), while 256 and 512 lie on the flat line from 128 to 1024
    assert [kv for w, kv in kept if w == 0] == [64, 1024, 2048]
    assert [kv for w, kv in kept if w == 128] == [64, 128, 1024, 2048]


def test_imported_window_rows_answer_lookups(tmp_path: Path) -> None:
    """Through the whole importer: a miniature aiconfigurator package with GPT-OSS's layout."""
    systems = tmp_path / "systems"
    (systems / "data").mkdir(parents=True)
    (systems / "query_versions.yaml").write_text(yaml.safe_dump({
        "schema_version": 1, "defaults": {"trtllm": {"current": "1.3.0rc20", "previous": None}}}))
    directory = systems / "data" / "h200_sxm" / "attention" / "trtllm" / "1.3.0rc20"
    directory.mkdir(parents=True)
    write_records(directory / "generation_attention_perf.csv", [
        aic_attention("generation_attention", 64, 1, 127, 0.0107, window=128),
        aic_attention("generation_attention", 64, 1, 255, 0.0161, window=128),
        aic_attention("generation_attention", 64, 1, 255, 0.0180)])
    (directory / "collection_meta.yaml").write_text(yaml.safe_dump({
        "provenance": "collected", "tables": {"generation_attention_perf": {"status": "complete"}}}))
    written = aic.import_aiconfigurator(tmp_path / "out", "test", devices=["h200"],
                                        source=aic.AicSource(systems, "fixture"))
    text = (written[0] / "attention_decode.csv").read_text().splitlines()
    assert text[0].endswith(",source_mfu,window") and text[1].endswith(",128")
    tables = load_tables(written[0])
    peak = tables.provenance.peak_flops["bf16"]
    windowed = AttentionShape("mha", "decode", 64, 1, 256, 64, 8, 64, 64, window=128, kv_dtype="fp8")
    assert tables.lookup(windowed, peak).seconds == pytest.approx(16.1e-6, rel=1e-9)
    full = AttentionShape("mha", "decode", 64, 1, 256, 64, 8, 64, 64, kv_dtype="fp8")
    assert tables.lookup(full, peak).seconds == pytest.approx(18.0e-6, rel=1e-9)
