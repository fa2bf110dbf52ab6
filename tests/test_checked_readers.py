"""Files InferSim reads besides cards and configs go through its checked readers (infersim.base.plaindata):
aiconfigurator's YAML files, a `serve --isl/--osl` value and a GPU run's stage summary. A key given
twice, text that is not UTF-8 or a value nested too deep is one message naming the file (or is read
as no summary), never a value silently kept or a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_hostile_cli import one_line_error, run

from infersim.base.errors import InferSimError
from infersim.tabletools import aiconfigurator as aic
from infersim.tabletools.bench.budget import SUMMARY_FORMAT, PartRecord, StageSummary, read_summary

SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml", "--rate", "2", "--num-requests", "3")


# -- aiconfigurator's YAML files ------------------------------------------------------------------


def test_query_versions_are_read_as_before(tmp_path: Path) -> None:
    (tmp_path / "query_versions.yaml").write_text(yaml.safe_dump({
        "defaults": {"trtllm": {"current": "1.0.0"}, "sglang": {"current": "0.5.1"}},
        "overrides": {"h100_sxm": {"trtllm": {"current": "1.2.0"}}, "b200_sxm": None}}))
    versions = aic.current_versions(tmp_path)
    assert versions[("h100_sxm", "trtllm")] == "1.2.0"  # the system's override
    assert versions[("h100_sxm", "sglang")] == "0.5.1"  # the default where it has none
    assert versions[("b200_sxm", "trtllm")] == "1.0.0"
    assert aic.current_versions(tmp_path / "absent") == {}


def test_a_query_versions_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "query_versions.yaml"
    path.write_text("defaults:\n  trtllm: {current: 1.0.0}\n  trtllm: {current: 0.9.0}\n")
    with pytest.raises(InferSimError, match=f"{path}: field 'defaults.trtllm'.*on lines 2 and 3"):
        aic.current_versions(tmp_path)


@pytest.mark.parametrize("text, named", [
    ("- a list\n", "top level (value: ['a list']): expected a mapping"),
    ("defaults: [trtllm]\n", "field 'defaults' (value: ['trtllm']): expected a mapping"),
    ("overrides:\n  h100_sxm: {trtllm: 1.2.0}\n", "field 'overrides.h100_sxm.trtllm' (value: '1.2.0'): expected a mapping"),
])
def test_a_query_versions_section_that_is_no_mapping_is_named(tmp_path: Path, text: str, named: str) -> None:
    (tmp_path / "query_versions.yaml").write_text(text)
    with pytest.raises(InferSimError) as caught:
        aic.current_versions(tmp_path)
    assert str(caught.value) == f"{tmp_path / 'query_versions.yaml'}: {named}"


def test_an_aiconfigurator_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "query_versions.yaml"
    path.write_bytes(b"defaults:\n  trtllm: {current: \xff}\n")
    with pytest.raises(InferSimError, match=f"{path}: top level: not UTF-8 text \\(byte 0xff"):
        aic.current_versions(tmp_path)


def test_a_system_file_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h100_sxm.yaml"
    path.write_text("gpu:\n  mem_bw_empirical_scaling_factor: 0.75\n  mem_bw_empirical_scaling_factor: 0.9\n")
    with pytest.raises(InferSimError, match=f"{path}: field 'gpu.mem_bw_empirical_scaling_factor'.*on lines 2 and 3"):
        aic.elementwise_rule(tmp_path, "h100_sxm")
    path.write_text("gpu: 0.75\n")
    with pytest.raises(InferSimError, match=f"{path}: field 'gpu' \\(value: 0.75\\): expected a mapping"):
        aic.elementwise_rule(tmp_path, "h100_sxm")


def test_collection_meta_is_read_as_before_and_a_key_given_twice_refused(tmp_path: Path) -> None:
    path = tmp_path / "collection_meta.yaml"
    path.write_text("provenance: collected\ntables:\n  gemm_perf: {status: complete}\n")
    assert aic.collection_status(tmp_path, "gemm_perf") == "collected/complete"
    assert aic.collection_status(tmp_path, "moe_perf") == "collected/unstated"
    path.write_text("provenance: collected\ntables:\n  gemm_perf: {status: complete, status: partial}\n")
    with pytest.raises(InferSimError, match=f"{path}: field 'tables.gemm_perf.status'.*given twice"):
        aic.collection_status(tmp_path, "gemm_perf")
    path.write_text("provenance: collected\ntables:\n  gemm_perf: complete\n")
    with pytest.raises(InferSimError, match=f"{path}: field 'tables.gemm_perf' \\(value: 'complete'\\)"):
        aic.collection_status(tmp_path, "gemm_perf")


# -- serve --isl / --osl ---------------------------------------------------------------------------


def test_a_length_flag_is_read_as_yaml_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *SERVE, "--isl", "{dist: uniform, min: 100, max: 300}", "--osl", "20",
                         "--format", "json")
    assert code == 0, err
    assert json.loads(out)["completed"] == 3
    code, _out, err = run(capsys, *SERVE, "--isl", "{dist: [")
    assert code == 2
    one_line_error(err, "--isl '{dist: ['", "expected a number or a mapping like")


def test_a_length_flag_holding_a_number_too_long_to_read_is_one_message(capsys: pytest.CaptureFixture[str]) -> None:
    """YAML reads 5,000 digits as an integer Python refuses to build (past 4,300 digits)."""
    code, _out, err = run(capsys, *SERVE, "--osl", "9" * 5000)
    assert code == 2
    one_line_error(err, "--osl", "expected a number or a mapping like")


# -- a GPU run's stage summary ---------------------------------------------------------------------


def test_a_stage_summary_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    StageSummary(path, "bench", 60.0, [PartRecord("gemm", 3, 10.0)], card="h100-sxm")
    summary = read_summary(path)
    assert summary is not None and summary["format"] == SUMMARY_FORMAT and summary["card"] == "h100-sxm"
    assert [part["name"] for part in summary["parts"]] == ["gemm"]


@pytest.mark.parametrize("text", [
    f'{{"format": "{SUMMARY_FORMAT}", "parts": [], "parts": [{{"name": "x"}}]}}',  # which parts is not guessed
    f'{{"format": "{SUMMARY_FORMAT}", "parts": {"[" * 100_000 + "]" * 100_000}}}',  # too deep for json
    f'{{"format": "{SUMMARY_FORMAT}", "parts": [',  # cut off by a kill
])
def test_a_stage_summary_this_writer_did_not_write_whole_is_no_summary(tmp_path: Path, text: str) -> None:
    path = tmp_path / "summary.json"
    path.write_text(text)
    assert read_summary(path) is None


def test_a_stage_summary_that_is_not_utf8_is_no_summary(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_bytes(b'{"format": "\xff"}')
    assert read_summary(path) is None
