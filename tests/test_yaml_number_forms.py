"""YAML numbers have one meaning whatever YAML version their writer had in mind: digits alone are
decimal (`010` is 10, as YAML 1.2, Python and the direct flags read it, not YAML 1.1's octal 8), a
base is said only by a prefix (0b, 0o, 0x), and a colon never makes a number (`1:30` is not YAML
1.1's base-60 90: it stays text, which a number field refuses naming the value). Through every way
user YAML comes in: config files, `--set`, `--grid`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from test_hostile_cli import one_line_error, run

from infersim.base.errors import ConfigError, InferSimError
from infersim.base.plaindata import _unique_key_loader, loads_yaml, parse_flag_value
from infersim.sweep.grid import parse_grid

READINGS = [
    ("010", 10), ("-010", -10), ("+010", 10), ("09", 9), ("0", 0), ("-0", 0), ("0_10", 10), ("1_000", 1000),
    ("0x1F", 31), ("-0x1f", -31), ("0o17", 15), ("0b101", 5), ("12", 12),
    ("1.5", 1.5), ("010.5", 10.5), ("2.5e+12", 2.5e12), ("-.inf", -math.inf),
    # not numbers: base 60 in either form, and forms no reading gives one meaning
    ("1:30", "1:30"), ("-1:30", "-1:30"), ("1:30:00", "1:30:00"), ("1:30.5", "1:30.5"),
    ("0x_", "0x_"), ("0o8", "0o8"), ("0X1F", "0X1F"),
    # YAML 1.1 leaves an exponent without a dot or sign as text; the schema's number rule reads it
    ("1e5", "1e5"),
]


@pytest.mark.parametrize("text, expected", READINGS)
def test_a_scalar_reads_one_way(text, expected):
    for value in (loads_yaml(text, "t.yaml"), parse_flag_value(text, "--set workload.isl=")):
        assert value == expected and type(value) is type(expected), (text, value)


def test_numbers_in_a_mapping_and_as_keys():
    assert loads_yaml("isl: 010\nosl: 1:00\nlens: [08, 0x10]\n010: ten\n", "t.yaml") == {
        "isl": 10, "osl": "1:00", "lens": [8, 16], 10: "ten"}


def test_nan_and_booleans_are_unchanged():
    assert math.isnan(loads_yaml(".nan", "t.yaml"))
    assert loads_yaml("[true, false, yes, no, ~]", "t.yaml") == [True, False, True, False, None]


@pytest.mark.parametrize("text, problem", [("!!int 1:30", "'1:30' is not an integer"),
                                           ("!!int abc", "'abc' is not an integer"),
                                           ("!!float 1:30", "'1:30' is not a number (base-60"),
                                           ("!!float abc", "'abc' is not a number")])
def test_an_explicit_tag_cannot_bring_the_forms_back(text, problem):
    with pytest.raises(ConfigError) as err:
        loads_yaml(f"isl: {text}\n", "t.yaml")
    assert "t.yaml" in str(err.value) and problem in str(err.value) and "too long" not in str(err.value)
    assert loads_yaml("!!int 010", "t.yaml") == 10 and loads_yaml("!!float 3", "t.yaml") == 3.0


def test_a_number_too_long_is_still_said_so():
    with pytest.raises(ConfigError, match="too long to read"):
        loads_yaml("isl: " + "1" * 5000, "t.yaml")


def test_pyyaml_own_loader_is_left_as_it_was():
    loaded = loads_yaml("[010, 1:30]", "t.yaml")  # builds our loader first
    assert loaded == [10, "1:30"]
    assert yaml.safe_load("[010, 1:30, 0b101]") == [8, 90, 5]  # PyYAML's shared tables: YAML 1.1 still
    loader = _unique_key_loader()
    if hasattr(yaml, "CSafeLoader"):
        assert issubclass(loader, yaml.CSafeLoader)  # the libyaml parser is kept


# ---- end to end


def workload_of(out: str) -> dict:
    return json.loads(out)["workload"]


def test_set_reads_leading_zeros_as_decimal_like_the_direct_flag(capsys):
    base = ("--model", "llama-3.1-8b", "--hardware", "h100", "--format", "json")
    code, out, _ = run(capsys, *base, "--set", "workload.isl=010", "--set", "workload.osl=0x10")
    assert code == 0 and workload_of(out)["isl"] == 10 and workload_of(out)["osl"] == 16
    code, flag_out, _ = run(capsys, *base, "--isl", "010", "--osl", "16")
    assert code == 0 and workload_of(flag_out)["isl"] == 10


@pytest.mark.parametrize("value", ["1:30", "1:30.5", "0X1F"])
def test_set_refuses_what_is_not_a_number(capsys, value):
    code, out, err = run(capsys, "--model", "llama-3.1-8b", "--hardware", "h100", "--set", f"workload.isl={value}")
    assert code == 2 and out == ""
    one_line_error(err, "--set", "field 'workload.isl'", repr(value), "expected a whole number")


def config_file(tmp_path: Path, isl: str, osl: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("model: llama-3.1-8b\nhardware: h100\ndeployment: {num_gpus: 1}\n"
                    f"workload:\n  isl: {isl}\n  osl: {osl}\n  decode_batch_per_gpu: 08\n")
    return path


def test_a_config_file_reads_the_same(tmp_path, capsys):
    path = config_file(tmp_path, "010", "0100")
    for _ in range(2):  # the second read comes from the parsed-YAML cache
        code, out, _ = run(capsys, "--config", str(path), "--format", "json")
        assert code == 0
        assert {k: workload_of(out)[k] for k in ("isl", "osl", "decode_batch_per_gpu")} == {
            "isl": 10, "osl": 100, "decode_batch_per_gpu": 8}


def test_a_config_file_refuses_base_60(tmp_path, capsys):
    path = config_file(tmp_path, "010", "1:00")
    code, out, err = run(capsys, "--config", str(path))
    assert code == 2 and out == ""
    one_line_error(err, str(path), "field 'workload.osl'", "'1:00'", "expected a whole number")


def test_grid_values_read_the_same():
    assert parse_grid(["workload.isl=010,020,0x10"])[0].values == (10, 20, 16)
    with pytest.raises(InferSimError) as err:
        parse_grid(["workload.isl=010,1:30"])
    assert "workload.isl=010,1:30" in str(err.value) and "'1:30'" in str(err.value)


def test_a_file_parsed_under_the_old_reading_is_parsed_again(tmp_path):
    from infersim.base import diskcache
    from infersim.cards import schema

    path = tmp_path / "old.yaml"
    text = "isl: 010\n"
    path.write_text(text)
    name, where = schema._parsed_yaml_entry(path)
    # an entry as a version reading YAML 1.1's octal kept it
    diskcache.write_json(name, "yaml", {"path": where, "text": text, "data": {"isl": 8},
                                        "rules": "unique keys, bounded nesting"})
    assert schema.load_yaml(path) == {"isl": 10}
    assert schema.load_yaml(path) == {"isl": 10}  # and kept under today's rules
