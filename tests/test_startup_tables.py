"""Kernel tables read back from the on-disk cache: plain data, each grid decoded (and checked) only
when it is looked up, the same table set as one indexed afresh."""

from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from infersim.base import diskcache
from infersim.shapes.kernels import AttentionShape, GemmShape
from infersim.tables import lookup, table_cache
from infersim.tables.table_cache import KeptGrids, KeptRows, Reindex

H20 = REPO_ROOT / "mfu_tables" / "imported" / "h20"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("INFERSIM_CACHE", "on")
    monkeypatch.setattr(lookup, "_LOADED", {})
    return tmp_path / "cache"


def _fresh_and_kept(directory: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[lookup.MfuTables, lookup.MfuTables]:
    fresh = lookup.load_tables(directory)  # indexed, and kept
    monkeypatch.setattr(lookup, "_LOADED", {})  # a new process: only the disk cache is left
    return fresh, lookup.load_tables(directory)


def _lookups(tables: lookup.MfuTables) -> list[object]:
    shapes = [GemmShape(m=m, k=512, n=n, dtype="fp8", weight_dtype="fp8") for m in (1, 77, 4096) for n in (2048, 7168)]
    shapes += [AttentionShape(kind="mha", stage="decode", batch=b, q_len=1, kv_len=kv, num_heads=32, num_kv_heads=4,
                              qk_head_dim=128, v_head_dim=128, causal=True, window=0, dtype="bf16", kv_dtype="bf16")
               for b in (1, 30) for kv in (1000, 9000)]
    hits = [tables.lookup(shape, 148e12) for shape in shapes]
    assert all(hits)  # every shape answered by a table
    return hits


def test_kept_tables_are_the_indexed_ones(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh, kept = _fresh_and_kept(H20, monkeypatch)
    assert isinstance(kept.grids, KeptGrids) and not isinstance(fresh.grids, KeptGrids)
    assert list(kept.grids) == list(fresh.grids) and len(kept.grids) == len(fresh.grids) == 82
    first = next(iter(fresh.grids))
    assert kept.grids[first] == fresh.grids[first] and kept.grids[first] is kept.grids.get(first)
    assert len(kept.grids._grids) == 1  # only the grid asked for was decoded
    assert kept.grids.get(("no", "such", "key")) is None and kept.grids.get(("no",), "none") == "none"
    assert dict(kept.grids) == dict(fresh.grids)  # every grid, node by node, leaf by leaf
    assert kept.provenance == fresh.provenance and kept.collectives == fresh.collectives
    assert kept.elementwise == fresh.elementwise and kept._hbm_fastest == fresh._hbm_fastest
    assert list(kept._hbm_rows) == list(fresh._hbm_rows) and kept._gemm_planes == fresh._gemm_planes
    assert kept.describe() == fresh.describe() and _lookups(kept) == _lookups(fresh)
    again = pickle.loads(pickle.dumps(kept))  # as sent to a sweep's worker processes
    assert dict(again.grids) == dict(fresh.grids) and list(again._hbm_rows) == list(fresh._hbm_rows)
    [entry] = cache.glob("tables-*.entry")
    assert b"pickle" not in entry.read_bytes().split(b"\n")[1][:20]  # a header, then JSON
    json.loads(entry.read_bytes().split(b"\n")[1])  # the index line is plain JSON


def test_kept_tables_check_the_card_as_the_indexed_ones(tmp_path: Path, cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from test_hostile_cli import scaled_tables

    from infersim.base.errors import ConfigError
    from infersim.run.config import load_hardware_card

    h20 = load_hardware_card("h20")[0]
    too_fast = scaled_tables(tmp_path, "attention_decode_mha_32-4-128.csv", 1.5)
    errors = []
    for _process in range(2):  # indexed (and kept), then read back from the disk cache
        monkeypatch.setattr(lookup, "_LOADED", {})
        with pytest.raises(ConfigError) as refused:
            lookup.load_tables(too_fast).check_hardware(h20)
        errors.append(str(refused.value))
    assert errors[0] == errors[1] and "HBM peak of hardware card h20" in errors[0]

    monkeypatch.setattr(lookup, "_LOADED", {})
    _fresh, kept = _fresh_and_kept(H20, monkeypatch)
    monkeypatch.setattr(KeptRows, "__iter__", lambda self: pytest.fail("rows decoded for a passing card"))
    kept.check_hardware(h20)


def _rewrite(entry: Path, change) -> None:
    """Rewrite a kept entry's payload with `change(index, blobs)`, under a header that holds (as
    only someone writing it on purpose would)."""
    payload = diskcache._unwrap(entry.read_bytes(), "tables")
    line, blobs = payload.split(b"\n", 1)
    index = json.loads(line)
    line, blobs = change(index, blobs)
    entry.write_bytes(diskcache._wrap("tables", line + b"\n" + blobs))


def test_a_grid_that_fails_its_checks_when_decoded_reindexes_the_files(cache: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = lookup.load_tables(H20)
    [entry] = cache.glob("tables-*.entry")

    def unordered_grids(index: dict, blobs: bytes) -> tuple[bytes, bytes]:
        # every grid's first level reversed: valid JSON of the right types, coordinates descending
        changed, offset, out = [], 0, []
        for key, start, length in index["grids"]:
            grid = json.loads(blobs[start:start + length])
            grid["root"] = [list(reversed(part)) for part in grid["root"]]
            blob = json.dumps(grid).encode()
            changed.append([key, offset, len(blob)])
            out.append(blob)
            offset += len(blob)
        rows = blobs[index["rows"][0]:index["rows"][0] + index["rows"][1]]
        index["grids"], index["rows"] = changed, [offset, len(rows)]
        return json.dumps(index).encode(), b"".join(out) + rows

    _rewrite(entry, unordered_grids)
    monkeypatch.setattr(lookup, "_LOADED", {})
    kept = lookup.load_tables(H20)
    assert isinstance(kept.grids, KeptGrids)  # the index holds: read back
    assert _lookups(kept) == _lookups(fresh)  # the grids did not: indexed afresh
    assert not entry.exists()  # and the entry deleted


def test_rows_that_fail_their_checks_reindex_the_files(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = lookup.load_tables(H20)
    [entry] = cache.glob("tables-*.entry")

    def rows_of_text(index: dict, blobs: bytes) -> tuple[bytes, bytes]:
        rows = json.dumps([["bf16", "fast", 1.0, "x"]]).encode()
        index["rows"] = [index["rows"][0], len(rows)]
        return json.dumps(index).encode(), blobs[:index["rows"][0]] + rows

    _rewrite(entry, rows_of_text)
    monkeypatch.setattr(lookup, "_LOADED", {})
    kept = lookup.load_tables(H20)
    assert list(kept._hbm_rows) == list(fresh._hbm_rows) and not entry.exists()


@pytest.mark.parametrize("damage", ["key", "provenance", "series", "span", "fields"])
def test_an_index_that_fails_its_checks_is_a_miss_and_deleted(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                damage: str) -> None:
    fresh = lookup.load_tables(H20)
    [entry] = cache.glob("tables-*.entry")

    def change(index: dict, blobs: bytes) -> tuple[bytes, bytes]:
        if damage == "key":
            index["key"] = "another"
        elif damage == "provenance":
            index["provenance"]["peak_flops"]["bf16"] = -1.0
        elif damage == "series":
            index["collectives"] = [["all_reduce", 8, [["1e6", 1.0]], "t"]]
        elif damage == "span":
            index["grids"][0][1] = len(blobs) + 10
        else:
            index["extra"] = 1
        return json.dumps(index).encode(), blobs

    _rewrite(entry, change)
    monkeypatch.setattr(lookup, "_LOADED", {})
    again = lookup.load_tables(H20)
    assert not isinstance(again.grids, KeptGrids)  # indexed afresh
    assert _lookups(again) == _lookups(fresh) and again.provenance == fresh.provenance
    assert entry.exists() and diskcache._unwrap(entry.read_bytes(), "tables")  # rewritten whole


def test_kept_grids_remember_a_key_no_table_holds() -> None:
    blob = json.dumps({"a": 1}).encode()
    decoded = []

    def decode(key, data):
        decoded.append(key)
        return json.loads(data)

    grids = KeptGrids(b"xx" + blob, {("gemm", "bf16", 1, 2): (2, 2 + len(blob))}, decode,
                      Reindex("tables-0000000000000000.entry", lambda: pytest.fail("reindexed")))
    for _ in range(2):  # the second time from what the first one kept
        assert grids.get(("gemm", "bf16", 3, 4)) is None
        assert grids.get(("gemm", "bf16", 3, 4), "none") == "none"
        assert grids.get(("gemm", "bf16", 1, 2)) == grids[("gemm", "bf16", 1, 2)] == {"a": 1}
        assert ("gemm", "bf16", 3, 4) not in grids and len(grids) == 1
    assert decoded == [("gemm", "bf16", 1, 2)]


def test_the_key_covers_the_code_of_every_table_and_shape_module(tmp_path: Path, cache: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No list of files: a module added to (or edited in) tables/, shapes/ or base/ changes the stamp."""
    import shutil

    package = tmp_path / "pkg"
    for folder in table_cache.CODE_FOLDERS:
        shutil.copytree(REPO_ROOT / "infersim" / folder, package / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "tables" / "table_cache.py").touch()
    monkeypatch.setattr(table_cache, "__file__", str(package / "tables" / "table_cache.py"))
    stamps = [table_cache.code_stamp()]
    (package / "shapes" / "new_shape.py").write_text("X = 1\n")
    stamps.append(table_cache.code_stamp())
    (package / "tables" / "format.py").write_text((package / "tables" / "format.py").read_text() + "\n# x\n")
    stamps.append(table_cache.code_stamp())
    (package / "tables" / "README.txt").write_text("not code")
    stamps.append(table_cache.code_stamp())
    assert len(set(stamps[:3])) == 3 and stamps[3] == stamps[2] and all(stamps)
    monkeypatch.undo()
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(cache))
    name, key = table_cache.cache_entry(H20, lookup.DEFAULT_INTERPOLATION, ())
    assert table_cache.code_stamp() in key and repr(table_cache.__version__) in key
    assert name == f"tables-{zlib.crc32(key.encode()):08x}{zlib.adler32(key.encode()):08x}.entry"
