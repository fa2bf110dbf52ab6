"""`infersim validate` end to end: text and JSON, serving points with and without the
request-level simulator, and bad input (one clear line, exit 2)."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from conftest import public_reference
from infersim.cli.main import main
from infersim.run.config import RunSpec
from infersim.serve.cost import StepPriceBook
from infersim.validate.evaluate import NEEDS_SERVE

ENGINE_FIELD = "engine" in {f.name for f in dataclasses.fields(RunSpec)}  # engine cards merged

REFERENCE = [
    {"id": "deepgemm-dense-m4096-n7168-k16384", "value": {"tflops": 1358, "GBps": 343}, "source": "DEEPGEMM",
     "unit": "TFLOPS, GB/s"},
    {"id": "sgl-h20-decode-base", "value": 714, "source": "ANT", "unit": "tok/s/GPU"},
    {"id": "trt10-llama3.1-8b-h100-tp1-128-128", "value": 28312, "source": "TRT_PO_V10", "unit": "tok/s"},
    {"id": "trt10-llama4-maverick-h100-tp8-1000-1000", "value": 9677, "source": "TRT_PO_V10", "unit": "tok/s"},
    {"id": "not-in-the-mapping", "value": 1.5, "source": "ELSEWHERE", "unit": "ms"},
]


@pytest.fixture
def reference(tmp_path) -> Path:
    path = tmp_path / "reference.yaml"
    path.write_text(yaml.safe_dump({"data_points": REFERENCE}, sort_keys=False))
    return path


@pytest.fixture
def no_serve(monkeypatch):
    """The request-level simulator absent, whether or not this build has it."""
    monkeypatch.setitem(sys.modules, "infersim.serve.api", None)


def test_text_report(reference, no_serve, capsys):
    assert main(["validate", "--reference", str(reference)]) == 0
    out = capsys.readouterr().out
    assert "deepgemm-dense-m4096-n7168-k16384/tflops" in out
    assert "-5.8%" in out  # 1279.4 predicted against 1358 measured
    assert "sgl-h20-decode-base" in out
    assert "SUMMARY" in out and "source DEEPGEMM" in out and "kind stage" in out and "overall" in out
    assert "NOT EXPRESSED (3)" in out
    assert f"trt10-llama3.1-8b-h100-tp1-128-128 [TRT_PO_V10]: {NEEDS_SERVE}" in out
    assert f"trt10-llama4-maverick-h100-tp8-1000-1000 [TRT_PO_V10]: {NEEDS_SERVE}" in out
    assert "not-in-the-mapping [ELSEWHERE]: no entry for this point in points.yaml" in out
    if not ENGINE_FIELD:  # the note says what this build's run config could not take
        assert "sgl-h20-decode-base: dropped engine" in out


def test_json_report(reference, no_serve, capsys):
    assert main(["validate", "--reference", str(reference), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"points", "summary", "not_expressed", "reference", "mfu_tables"} <= set(data)
    points = {p["id"]: p for p in data["points"]}
    assert list(points) == ["deepgemm-dense-m4096-n7168-k16384/tflops", "deepgemm-dense-m4096-n7168-k16384/GBps",
                            "sgl-h20-decode-base"]
    tflops = points["deepgemm-dense-m4096-n7168-k16384/tflops"]
    assert set(tflops) == {"id", "source", "kind", "measured", "predicted", "error_pct", "unit", "dominant_module",
                           "dominant_detail", "grade", "note", "accepted_outlier"}
    assert tflops["grade"] == "roofline"  # kernel points are priced on the roofline unless --mfu-tables names tables
    assert tflops["accepted_outlier"] is None
    assert (tflops["dominant_module"], tflops["dominant_detail"]) == ("gemm", "compute")
    assert tflops["kind"] == "kernel_gemm" and tflops["unit"] == "TFLOPS" and tflops["measured"] == 1358
    assert tflops["error_pct"] == pytest.approx(100 * (tflops["predicted"] - 1358) / 1358)
    decode = points["sgl-h20-decode-base"]
    assert decode["kind"] == "stage_decode" and decode["source"] == "ANT"
    assert decode["dominant_module"] in {"attn_core", "moe_experts", "dispatch", "combine", "draft"}
    assert decode["dominant_detail"].endswith("%") and 0 < float(decode["dominant_detail"][:-1]) <= 100
    summary = data["summary"]
    assert summary["overall"]["n"] == 3
    assert set(summary["by_source"]) == {"DEEPGEMM", "ANT"} and set(summary["by_kind"]) == {"kernel", "stage"}
    # every counted number sits in one grade group
    assert sum(g["n"] for g in summary["by_grade"].values()) == 3
    assert summary["by_grade"][decode["grade"]]["n"] == 1 + (decode["grade"] == "roofline") * 2
    assert set(summary["overall"]) == {"n", "median_abs_error_pct", "mean_abs_error_pct", "signed_mean_error_pct",
                                       "within_15pct_share_pct"}
    reasons = {n["id"]: n["reason"] for n in data["not_expressed"]}
    assert reasons["trt10-llama3.1-8b-h100-tp1-128-128"] == NEEDS_SERVE
    assert set(reasons) == {"trt10-llama3.1-8b-h100-tp1-128-128", "trt10-llama4-maverick-h100-tp8-1000-1000",
                            "not-in-the-mapping"}


def test_serving_points_run_through_the_request_level_simulator(reference, monkeypatch, capsys):
    calls = []
    books = []  # the step prices the validation's serving runs share

    def simulate_serving(config, options, prices=None):
        calls.append((config, options))
        books.append(prices)
        return {"output_throughput": 25000.0, "output_throughput_per_gpu": 25000.0, "mean_ttft_ms": 100.0}

    monkeypatch.setitem(sys.modules, "infersim.serve.api", types.SimpleNamespace(simulate_serving=simulate_serving))
    assert main(["validate", "--reference", str(reference), "--format", "json",
                 "--point", "trt10-llama3.1-8b-h100-tp1-128-128"]) == 0
    data = json.loads(capsys.readouterr().out)
    (point,) = data["points"]
    assert point["id"] == "trt10-llama3.1-8b-h100-tp1-128-128" and point["kind"] == "serving"
    assert point["predicted"] == 25000.0
    assert point["error_pct"] == pytest.approx(100 * (25000 - 28312) / 28312)
    assert ("dropped engine" in point["note"]) != ENGINE_FIELD
    (config, options), = calls
    assert options == {"mode": "offline", "num_requests": 30000, "isl": 128, "osl": 128, "seed": 0}
    assert config.model.name == "llama-3.1-8b" and config.hardware.name == "h100-sxm"
    assert config.deployment.precision.gemm == "fp8"
    assert data["summary"]["by_kind"]["serving"]["n"] == 1
    (book,) = books
    assert isinstance(book, StepPriceBook)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("infersim: error: "), err
    return err


@pytest.mark.parametrize("content, message", [
    ("data_points: [1, 2", "malformed YAML"),
    ("points: []", "expected a mapping with a `data_points` list"),
    ("data_points:\n- {id: a, value: fast, source: X}", "expected a positive number"),
    ("data_points:\n- {id: a, value: 1, source: X}\n- {id: a, value: 2, source: X}", "a second point with the same id"),
    ("data_points:\n- {id: a, value: {x: 0}, source: X}", "positive number for every sub-metric"),
    ("data_points:\n- {value: 3, source: X}", "every point needs an id"),
    ("data_points:\n- {id: a, value: 3}", "every point names its source"),
])
def test_bad_reference_files_give_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["validate", "--reference", str(path)]) == 2
    assert message in _error_line(capsys)


def test_unknown_point_ids_give_one_line(reference, capsys):
    assert main(["validate", "--reference", str(reference), "--point", "nope", "--point", "sgl-h20-decode-base/x"]) == 2
    err = _error_line(capsys)
    assert "unknown point id(s) nope, sgl-h20-decode-base/x" in err


def test_a_mapping_that_does_not_fit_the_point_gives_one_line(tmp_path, capsys):
    path = tmp_path / "reference.yaml"
    path.write_text(yaml.safe_dump({"data_points": [{"id": "sgl-h20-decode-base", "value": {"a": 1}, "source": "X"}]}))
    assert main(["validate", "--reference", str(path)]) == 2
    assert "the entry gives `metric` but the reference point's value is sub-metrics a" in _error_line(capsys)


def test_missing_reference_files(tmp_path, capsys, monkeypatch):
    assert main(["validate", "--reference", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in _error_line(capsys)
    import infersim.validate

    monkeypatch.setattr(infersim.validate, "DEFAULT_REFERENCES", (tmp_path / "gone.yaml",))
    assert main(["validate"]) == 2
    assert "the shipped public measurements are missing from this installation" in _error_line(capsys)


def test_several_reference_files_are_compared_together_and_ids_must_differ(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    point = {"value": 100.0, "source": "X", "unit": "TFLOPS, GB/s"}
    first.write_text(yaml.safe_dump({"data_points": [{"id": "deepgemm-dense-m64-n7168-k16384", **point,
                                                      "value": {"tflops": 336, "GBps": 2668}}]}))
    second.write_text(yaml.safe_dump({"data_points": [{"id": "deepgemm-dense-m128-n7168-k16384",
                                                       **point, "value": {"tflops": 500, "GBps": 2000}}]}))
    assert main(["validate", "--reference", str(first), "--reference", str(second), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["id"].split("/")[0] for p in data["points"]} == {"deepgemm-dense-m64-n7168-k16384",
                                                                "deepgemm-dense-m128-n7168-k16384"}
    assert data["reference"] == f"{first}, {second}"
    assert main(["validate", "--reference", str(first), "--reference", str(first)]) == 2
    assert "point id also in" in _error_line(capsys)


def test_bad_points_file_gives_one_line(reference, tmp_path, capsys):
    points = tmp_path / "points.yaml"
    points.write_text(yaml.safe_dump({"points": [{"id": "x", "kind": "stage", "why": "w"}]}))
    assert main(["validate", "--reference", str(reference), "--points", str(points)]) == 2
    assert "field 'points[0] (x).kind'" in _error_line(capsys)


@pytest.mark.slow  # the whole public set again: the README's `validate --summary` (docs tests) runs it by default
def test_the_shipped_reference_by_default(capsys):
    """Every point of the shipped public measurements is either compared or listed with a reason."""
    assert main(["validate", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ids = {p["id"]: p for name in ("validation.yaml", "energy.yaml")
           for p in yaml.safe_load(public_reference(name).read_text())["data_points"]}
    covered = {p["id"].split("/")[0] for p in data["points"]} | {n["id"].split("/")[0] for n in data["not_expressed"]}
    assert covered == set(ids)
    assert all(n["reason"] for n in data["not_expressed"])
    kinds = {p["kind"] for p in data["points"]}
    assert {"kernel_gemm", "kernel_grouped_gemm", "deepep", "stage_prefill", "stage_decode"} <= kinds
    # accepted outliers (points.yaml accepted_outlier) are listed with their reason, not counted
    excluded = {e["id"] for e in data["excluded"]}
    assert excluded == {"trt10-llama4-maverick-h100-tp8-1000-1000"}
    assert all(e["reason"] for e in data["excluded"])
    energy = [p for p in data["points"] if p["kind"] == "energy"]  # energy has its own overall
    assert data["summary"]["energy"]["n"] == len(energy) == 14
    assert data["summary"]["overall"]["n"] == len(data["points"]) - len(energy) - len(excluded) >= 59


def test_a_point_whose_run_does_not_fit_in_memory_says_so(tmp_path, capsys):
    """A mapping whose batch cannot fit (here: bf16 MLA cache for 1,408 requests of 2,050 tokens on
    a GB200) is still priced, with the memory limit it breaks in the point's note."""
    import importlib.resources

    points = yaml.safe_load((importlib.resources.files("infersim.validate") / "points.yaml").read_text())
    entry = next(p for p in points["points"] if p["id"] == "sgl-gb200-decode-p2-std")
    entry["run"]["deployment"]["precision"]["kv_cache"] = "bf16"
    entry["run"]["workload"]["decode_batch_per_gpu"] = 1408
    custom = tmp_path / "points.yaml"
    custom.write_text(yaml.safe_dump({"points": [entry]}, sort_keys=False))
    reference = tmp_path / "reference.yaml"
    reference.write_text(yaml.safe_dump({"data_points": [
        {"id": "sgl-gb200-decode-p2-std", "value": 9087, "source": "GB200_2", "unit": "tok/s/GPU"}]}))
    assert main(["validate", "--reference", str(reference), "--points", str(custom), "--format", "json"]) == 0
    [point] = json.loads(capsys.readouterr().out)["points"]
    assert "does not fit" in point["note"] and "KV cache" in point["note"]


def test_notes_every_point_shares_are_said_once() -> None:
    """Three or more notes holding the same parts ("; "-separated): those parts once, first, and each
    point with what is its own; fewer notes, or nothing shared, are listed as they are."""
    from infersim.validate.report import _notes_lines

    notes = [("p1", "own 1; cut to 120 s; fixed rounds"), ("p2", "own 2; cut to 120 s; fixed rounds"),
             ("p3", "cut to 120 s; fixed rounds")]
    assert _notes_lines(notes) == ["  shared by all 3 noted points: cut to 120 s; fixed rounds", "  p1: own 1", "  p2: own 2"]
    assert _notes_lines(notes[:2]) == ["  p1: own 1; cut to 120 s; fixed rounds", "  p2: own 2; cut to 120 s; fixed rounds"]
    different = [("a", "x; y"), ("b", "z"), ("c", "y")]
    assert _notes_lines(different) == ["  a: x; y", "  b: z", "  c: y"]
