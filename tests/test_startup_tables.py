"""Kernel tables read back from the on-disk cache unpickle each grid only when it is looked up."""

from __future__ import annotations

import pickle

import pytest

from conftest import REPO_ROOT
from infersim.tables import lookup
from infersim.tables.table_cache import KeptGrids, KeptRows


def test_kept_grids_are_the_indexed_grids(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("INFERSIM_CACHE", "on")
    monkeypatch.setattr(lookup, "_LOADED", {})
    fresh = lookup.load_tables(REPO_ROOT / "mfu_tables" / "imported" / "h20")
    monkeypatch.setattr(lookup, "_LOADED", {})  # a new process: read from the disk cache
    kept = lookup.load_tables(REPO_ROOT / "mfu_tables" / "imported" / "h20")
    assert isinstance(kept.grids, KeptGrids) and not isinstance(fresh.grids, KeptGrids)
    assert list(kept.grids) == list(fresh.grids) and len(kept.grids) == len(fresh.grids) > 1
    first = next(iter(fresh.grids))
    assert kept.grids[first] == fresh.grids[first] and kept.grids[first] is kept.grids.get(first)
    assert len(kept.grids._grids) == 1  # only the grid asked for was unpickled
    assert kept.grids.get(("no", "such", "key")) is None
    again = pickle.loads(pickle.dumps(kept))  # as sent to a sweep's worker processes
    assert dict(again.grids) == dict(fresh.grids)


def test_kept_tables_check_the_card_as_the_indexed_ones(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_hostile_cli import scaled_tables

    from infersim.run.config import load_hardware_card
    from infersim.base.errors import ConfigError

    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("INFERSIM_CACHE", "on")
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
    lookup.load_tables(REPO_ROOT / "mfu_tables" / "imported" / "h20")
    monkeypatch.setattr(lookup, "_LOADED", {})
    kept = lookup.load_tables(REPO_ROOT / "mfu_tables" / "imported" / "h20")
    monkeypatch.setattr(KeptRows, "__iter__", lambda self: pytest.fail("rows unpickled for a passing card"))
    kept.check_hardware(h20)
