"""Parsed YAML is kept per file as plain data and used only while the file's text is unchanged."""

from __future__ import annotations

import json

import pytest

from infersim.base import diskcache
from infersim.base.errors import ConfigError
from infersim.cards import schema


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("INFERSIM_CACHE", "on")
    return tmp_path / "cache"


def test_an_edit_is_seen_and_the_kept_data_is_a_fresh_copy(tmp_path, cache) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("a: [1, 2]\n")
    first = schema.load_yaml(card)
    first["a"].append(3)  # the caller's to change
    assert schema.load_yaml(card) == {"a": [1, 2]} and len(list(cache.glob("yaml-*.entry"))) == 1
    assert schema._parsed_yaml(card, "a: [1, 2]\n") == {"a": [1, 2]}  # read back from the entry
    card.write_text("a: [4]\n")
    assert schema.load_yaml(card) == {"a": [4]} and len(list(cache.glob("yaml-*.entry"))) == 1


def test_a_damaged_entry_or_data_json_cannot_hold_is_parsed(tmp_path, cache) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("a: 1\n")
    schema.load_yaml(card)
    (entry,) = cache.glob("yaml-*.entry")
    entry.write_bytes(b"\x00garbage")
    assert schema.load_yaml(card) == {"a": 1}
    assert diskcache._unwrap(entry.read_bytes(), "yaml")  # deleted and written again
    bomb = "a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8]\n" + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
                                                         for i in range(1, 10))  # 8 x 9^9 numbers written out
    for name, text in (("dated", "when: 2024-01-02\n"), ("numbered", "1: one\n2: two\n"), ("nan", "x: .nan\n"),
                       ("bomb", bomb), ("recursive", "a: &a [1, *a]\n")):
        other = tmp_path / f"{name}.yaml"
        other.write_text(text)
        assert schema.load_yaml(other) is not None  # parsed, never kept: JSON would not give it back as parsed
    assert list(cache.glob("yaml-*.entry")) == [entry]
    assert schema._parsed_yaml(card, "a: 1\n") == {"a": 1}
    assert schema.load_yaml(tmp_path / "numbered.yaml") == {1: "one", 2: "two"}


@pytest.mark.parametrize("kept", [[1, 2], {"path": "p", "text": "a: 1\n"}, {"path": 1, "text": "a: 1\n", "data": 2}])
def test_an_entry_of_another_structure_is_deleted(tmp_path, cache, kept) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("a: 1\n")
    name, _where = schema._parsed_yaml_entry(card)
    diskcache.write_json(name, "yaml", kept)
    assert (cache / name).exists()
    assert schema._parsed_yaml(card, "a: 1\n") is None and not (cache / name).exists()


def test_an_entry_of_another_path_is_not_used(tmp_path, cache) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("a: 1\n")
    name, _where = schema._parsed_yaml_entry(card)
    diskcache.write_json(name, "yaml", {"path": str(tmp_path / "other.yaml"), "text": "a: 1\n", "data": {"a": 2}})
    assert schema.load_yaml(card) == {"a": 1}
    assert json.loads(diskcache.read_entry(name, "yaml"))["path"] == str(card)


def test_malformed_yaml_is_still_one_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        schema.load_yaml(bad)
