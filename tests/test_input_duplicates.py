"""A key given twice in one mapping of a YAML or JSON file, and a CSV trace column given twice (or
under two names of one field), is one message naming the file, the key and where each is: neither is
kept silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hostile_cli import one_line_error, run

from infersim.base import diskcache
from infersim.cards import schema

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")
RUN_CONFIG = """\
model: llama-3.1-8b
hardware: h100-sxm
engine: sglang
deployment:
  num_gpus: 1
workload:
  isl: 4096
  osl: 100
  isl: 100
"""


def test_a_config_key_given_twice_is_refused_with_both_lines(tmp_path, capsys) -> None:
    config = tmp_path / "dup.yaml"
    config.write_text(RUN_CONFIG)
    code, out, err = run(capsys, "--config", str(config))
    assert code == 2 and not out
    one_line_error(err, str(config), "field 'workload.isl'", "given twice", "on lines 7 and 9")


def test_a_key_kept_from_an_earlier_version_is_parsed_again(tmp_path, capsys, monkeypatch) -> None:
    """An entry of the parsed-YAML cache written before duplicates were refused holds the last
    value; it is not used."""
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("INFERSIM_CACHE", "on")
    config = tmp_path / "dup.yaml"
    config.write_text(RUN_CONFIG)
    name, where = schema._parsed_yaml_entry(config)
    data = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "sglang", "deployment": {"num_gpus": 1},
            "workload": {"isl": 100, "osl": 100}}
    diskcache.write_json(name, "yaml", {"path": where, "text": RUN_CONFIG, "data": data})
    code, _out, err = run(capsys, "--config", str(config))
    assert code == 2
    one_line_error(err, str(config), "field 'workload.isl'", "given twice")


def test_a_merged_key_given_again_is_an_override_not_a_duplicate(tmp_path, capsys) -> None:
    config = tmp_path / "merge.yaml"
    config.write_text(RUN_CONFIG.replace("  isl: 4096\n  osl: 100\n  isl: 100\n",
                                         "  <<: {isl: 4096, osl: 2048}\n  isl: 100\n"))
    code, out, err = run(capsys, "--config", str(config), "--format", "json")
    assert code == 0, err
    workload = json.loads(out)["workload"]
    assert (workload["isl"], workload["osl"]) == (100, 2048)


def test_equal_keys_spelled_differently_are_the_same_key(tmp_path, capsys) -> None:
    """YAML reads 1 and 0x1 as the same number: one mapping cannot hold both."""
    config = tmp_path / "numbers.yaml"
    config.write_text(RUN_CONFIG.replace("  isl: 100\n", "  extra: {1: a, 0x1: b}\n"))
    code, _out, err = run(capsys, "--config", str(config))
    assert code == 2
    one_line_error(err, str(config), "field 'workload.extra.0x1'", "'1' and '0x1' are the same key",
                   "on line 9 (columns 11 and 17)")


def test_a_serve_workload_file_key_given_twice(tmp_path, capsys) -> None:
    workload = tmp_path / "workload.yaml"
    workload.write_text("stages:\n  - {rate: 1, duration: 10}\nisl: 100\nosl: 50\nosl: 60\n")
    code, _out, err = run(capsys, *SERVE, "--workload", str(workload))
    assert code == 2
    one_line_error(err, f"--workload {workload}", "field 'osl'", "on lines 4 and 5")


def test_a_calibrate_reference_key_given_twice(tmp_path, capsys) -> None:
    reference = tmp_path / "reference.yaml"
    reference.write_text("experiments:\n  - id: a\n    model: llama-3.1-8b\n    tp: 1\n    tp: 2\n")
    code, _out, err = run(capsys, "calibrate", "--reference", str(reference))
    assert code == 2
    one_line_error(err, f"--reference {reference}", "field 'experiments[0].tp'", "on lines 4 and 5")


def test_a_flag_value_key_given_twice(capsys) -> None:
    code, _out, err = run(capsys, *SERVE, "--rate", "1", "--isl", "{dist: lognormal, mean: 100, mean: 200}")
    assert code == 2
    one_line_error(err, "--isl", "field 'mean'", "given twice")


def test_an_hf_config_key_given_twice(tmp_path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text('{\n  "architectures": ["LlamaForCausalLM"],\n  "hidden_size": 4096,\n'
                      '  "num_hidden_layers": 2,\n  "hidden_size": 8\n}\n')
    for argv in (["--model", str(config), "--hardware", "h100"], ["cards", "import-hf", str(config), "--out", "-"]):
        code, _out, err = run(capsys, *argv)
        assert code == 2
        one_line_error(err, str(config), "field 'hidden_size'", "on lines 3 and 5")


def test_a_nested_json_key_given_twice_is_named_by_its_path(tmp_path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["LlamaForCausalLM"],\n "rope_scaling": {"factor": 8, "factor": 4}}\n')
    code, _out, err = run(capsys, "--model", str(config), "--hardware", "h100")
    assert code == 2
    one_line_error(err, str(config), "field 'rope_scaling.factor'", "on line 2")


def test_a_bench_result_key_given_twice(tmp_path, capsys) -> None:
    result = tmp_path / "bench.json"
    result.write_text('{"backend": "vllm", "completed": 10, "completed": 500}\n')
    code, _out, err = run(capsys, "compare", "--bench-result", str(result), "--hardware", "h100")
    assert code == 2
    one_line_error(err, str(result), "field 'completed'", "given twice")


def test_a_trace_row_key_given_twice(tmp_path, capsys) -> None:
    trace = tmp_path / "requests.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5}\n'
                     '{"arrival_s": 1, "input_tokens": 10, "input_tokens": 20, "output_tokens": 5}\n')
    code, _out, err = run(capsys, *SERVE, "--trace", str(trace))
    assert code == 2
    one_line_error(err, str(trace), "row 2", "field 'input_tokens'", "at columns 18 and 38")


def _csv_trace(path: Path, header: str) -> Path:
    width = len(header.split(","))
    path.write_text(header + "\n" + "".join(",".join([str(i)] + ["10"] * (width - 1)) + "\n" for i in range(5)))
    return path


@pytest.mark.parametrize("header, named", [
    ("arrival_s,input_tokens,output_tokens,input_tokens", "column 'input_tokens' twice (columns 2 and 4)"),
    ("arrival_s,timestamp,input_tokens,output_tokens", "'arrival_s' and 'timestamp' (columns 1 and 2) both name arrival_s"),
    ("TIMESTAMP,input_tokens,ContextTokens,output_tokens",
     "'input_tokens' and 'ContextTokens' (columns 2 and 3) both name input_tokens"),
    ("timestamp,TIMESTAMP,isl,osl", "'timestamp' and 'TIMESTAMP'"),
])
def test_a_csv_trace_column_given_twice_is_refused(tmp_path, capsys, header, named) -> None:
    trace = _csv_trace(tmp_path / "trace.csv", header)
    code, _out, err = run(capsys, *SERVE, "--trace", str(trace))
    assert code == 2
    one_line_error(err, str(trace), named, "keep one")


def test_csv_columns_nothing_reads_may_repeat(tmp_path, capsys) -> None:
    """Empty names (a trailing comma) and columns no field reads are not refused."""
    trace = _csv_trace(tmp_path / "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,note,note,,")
    code, out, err = run(capsys, *SERVE, "--trace", str(trace), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["completed"] == 5
