"""Parsed YAML is kept per file and used only while the file's text is unchanged."""

from __future__ import annotations

import pytest

from infersim.cards import schema
from infersim.base.errors import ConfigError


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_an_edit_is_seen_and_the_kept_data_is_a_fresh_copy(tmp_path, cache) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("a: [1, 2]\n")
    first = schema.load_yaml(card)
    first["a"].append(3)  # the caller's to change
    assert schema.load_yaml(card) == {"a": [1, 2]} and len(list(cache.glob("yaml-*.marshal"))) == 1
    card.write_text("a: [4]\n")
    assert schema.load_yaml(card) == {"a": [4]} and len(list(cache.glob("yaml-*.marshal"))) == 1


def test_a_damaged_entry_or_data_marshal_refuses_is_parsed(tmp_path, cache) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("a: 1\n")
    schema.load_yaml(card)
    (entry,) = cache.glob("yaml-*.marshal")
    entry.write_bytes(b"\x00garbage")
    assert schema.load_yaml(card) == {"a": 1}
    dated = tmp_path / "dated.yaml"
    dated.write_text("when: 2024-01-02\n")  # a date: not plain data for marshal
    assert str(schema.load_yaml(dated)["when"]) == "2024-01-02"
    assert list(cache.glob("yaml-*.marshal")) == [entry]  # the card's, rewritten; none for dated
    assert schema._parsed_yaml(card, "a: 1\n") == {"a": 1}


def test_malformed_yaml_is_still_one_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        schema.load_yaml(bad)
