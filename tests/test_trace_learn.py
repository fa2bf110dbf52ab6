"""`infersim mfu from-trace`: kernel tables learned from a trace, and what they predict.

On the HF traces of tests/data/traces (real CPU recordings, synthesised H100 GPU side: see its
README): the tables reproduce the trace they came from and predict the same model at another
prompt length and batch. The rows are checked against sums computed here from the JSON.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from statistics import fmean

import pytest
from conftest import REPO_ROOT

from infersim.cli import main
from infersim.mfu.format import read_table_dir
from infersim.mfu.lookup import load_tables
from infersim.modules import categories as cat

TRACES = REPO_ROOT / "tests" / "data" / "traces"
TABLE_TIMED = (cat.ATTN_PROJ, cat.ATTN_CORE, cat.DENSE_FFN, cat.SHARED_EXPERT, cat.MOE_EXPERTS)


def trace(model: str, mode: str, shapes: str) -> Path:
    return TRACES / f"{model}-2l-{mode}-h100-synthesised-{shapes}.json.gz"


def run_config(model: str, shapes: str) -> Path:
    return TRACES / f"{model}-2l-{shapes}.run.yaml"


def from_trace(path: Path, config: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["mfu", "from-trace", str(path), "--config", str(config), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module", params=["llama-2-7b", "mixtral-8x7b"])
def learned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, str]:
    model = request.param
    out = tmp_path_factory.mktemp("tables") / model
    code = main(["mfu", "from-trace", str(trace(model, "eager", "p1x128-d2")), "--config",
                 str(run_config(model, "p1x128-d2")), "--out", str(out)])
    assert code == 0
    return model, out, ""


def _compare(path: Path, config: Path, tables: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    code = main(["compare", "--trace", str(path), "--config", str(config), "--mfu-tables", str(tables),
                 "--format", "json"])
    assert code == 0
    return json.loads(capsys.readouterr().out)["lanes"][0]


def _table_error(comparison: dict) -> float:
    rows = {m["module"]: m for m in comparison["modules"]}
    measured = sum(rows[m]["measured_s"] for m in TABLE_TIMED if m in rows)
    predicted = sum(rows[m]["predicted_s"] for m in TABLE_TIMED if m in rows)
    return (predicted - measured) / measured


def test_tables_reproduce_the_trace_they_came_from(learned: tuple[str, Path, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model, out, _ = learned
    lane = _compare(trace(model, "eager", "p1x128-d2"), run_config(model, "p1x128-d2"), out, capsys)
    for comparison in lane["comparisons"]:
        assert abs(_table_error(comparison)) < 0.05, comparison["stage"]
        # every GEMM, attention and expert operation of the prediction came from the learned tables
        rows = {m["module"]: m for m in comparison["modules"]}
        for module in TABLE_TIMED:
            if module in rows and rows[module]["measured_s"] > 0:
                assert rows[module]["error"] == pytest.approx(0.0, abs=0.01), module


def test_tables_predict_another_prompt_length_and_batch(learned: tuple[str, Path, str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Learned at prefill 1 x 128 and decode batch 2; predicting prefill 1 x 64 and decode batch 4."""
    model, out, _ = learned
    lane = _compare(trace(model, "eager", "p1x64-d4"), run_config(model, "p1x64-d4"), out, capsys)
    assert [c["stage"] for c in lane["comparisons"]] == ["prefill", "decode"]
    for comparison in lane["comparisons"]:
        assert abs(_table_error(comparison)) < 0.15, comparison["stage"]


def test_provenance_names_the_trace_device_and_date(learned: tuple[str, Path, str]) -> None:
    model, out, _ = learned
    tables = read_table_dir(out)
    prov = tables.provenance
    assert prov.origin == "measured"
    assert prov.device.name == "NVIDIA H100 80GB HBM3" and prov.device.sm_count == 132
    assert prov.measured_on == "2026-10-01"  # baseTimeNanoseconds of the recording
    assert prov.source["trace"].endswith(f"{model}-2l-eager-h100-synthesised-p1x128-d2.json.gz")
    assert prov.command.startswith("python -m infersim mfu from-trace ")
    assert any("synthesised test data" in n for n in prov.notes)
    assert prov.tables["gemm_bf16.csv"].library.startswith("cuBLAS")
    assert prov.tables["attention.csv"].library.startswith("cuDNN SDPA")
    assert 0 < prov.elementwise_memory_efficiency <= 1
    load_tables(out)  # the simulator reads them


def _linear_calls(path: Path, region: str, k: int, n: int, m: int) -> list[float]:
    """Kernel µs of each aten::linear call of that shape inside the named regions (one GEMM each)."""
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    regions = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == region]
    calls = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::linear"
             and e["args"]["Input Dims"][1] == [n, k] and e["args"]["Input Dims"][0][0] * e["args"]["Input Dims"][0][1] == m
             and any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in regions)]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    out = []
    for call in calls:
        inside = [k_["dur"] for k_ in kernels
                  if call["ts"] <= launches[k_["args"]["correlation"]]["ts"] <= call["ts"] + call["dur"]]
        out.append(sum(inside))
    return out


def test_fused_rows_are_the_sum_of_the_engines_gemms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """HF runs q, k and v as three GEMMs where the simulator prices one fused qkv_proj: the row
    of k=4096, n=3 x 4096 is three mean q/k/v call times at that M."""
    path = trace("llama-2-7b", "eager", "p1x128-d2")
    code, out, _ = from_trace(path, run_config("llama-2-7b", "p1x128-d2"), tmp_path / "t", capsys)
    assert code == 0
    assert "qkv_proj (k=4096, n=12288): the traced engine runs it as separate GEMMs (3 x n=4096)" in out
    rows = {(r.m, r.k, r.n): r.latency_us for r in read_table_dir(tmp_path / "t").tables["gemm_bf16.csv"]}
    decode = _linear_calls(path, "decode", 4096, 4096, 2)  # q, k, v and o: one shape in Llama-2-7B
    assert len(decode) == 4 * 4 * 2  # four projections, four steps, two layers
    assert rows[(2, 4096, 12288)] == pytest.approx(3 * fmean(decode), rel=1e-4)
    assert rows[(2, 4096, 4096)] == pytest.approx(fmean(decode), rel=1e-4)
    prefill = _linear_calls(path, "prefill", 4096, 11008, 128)  # gate and up
    assert rows[(128, 4096, 22016)] == pytest.approx(2 * fmean(prefill), rel=1e-4)


def test_prefill_attention_rows_are_per_sequence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = from_trace(trace("mixtral-8x7b", "eager", "p1x128-d2"), run_config("mixtral-8x7b", "p1x128-d2"),
                            tmp_path / "t", capsys)
    assert code == 0
    tables = read_table_dir(tmp_path / "t")
    prefill = [r for r in tables.tables["attention.csv"] if r.stage == "prefill"]
    decode = [r for r in tables.tables["attention.csv"] if r.stage == "decode"]
    assert [(r.batch, r.q_len, r.kv_len, r.num_heads, r.num_kv_heads) for r in prefill] == [(1, 128, 128, 32, 8)]
    # four decode steps of batch 2: contexts 129 .. 132
    assert [(r.batch, r.kv_len) for r in decode] == [(2, 129), (2, 130), (2, 131), (2, 132)]
    experts = tables.tables["grouped_gemm.csv"]
    assert {(r.stage, r.projection, r.tokens_per_gpu) for r in experts} == {
        ("prefill", "up", 128), ("prefill", "down", 128), ("decode", "up", 2), ("decode", "down", 2)}


def _strip_shapes(path: Path, out: Path) -> Path:
    with gzip.open(path, "rt") as handle:
        doc = json.load(handle)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
                e.get("args", {}).pop(key, None)
    doc["record_shapes"] = 0
    with gzip.open(out, "wt") as handle:
        json.dump(doc, handle)
    return out


def test_a_trace_without_shapes_cannot_teach_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = _strip_shapes(trace("llama-2-7b", "eager", "p1x128-d2"), tmp_path / "bare.json.gz")
    code, _, err = from_trace(bare, run_config("llama-2-7b", "p1x128-d2"), tmp_path / "t", capsys)
    assert code == 1
    assert "no GEMM, attention or grouped-GEMM operator with recorded shapes" in err
    assert "record_shapes=True" in err
    assert not (tmp_path / "t").exists()


def test_cuda_graph_replays_carry_no_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = from_trace(trace("llama-2-7b", "graphs", "p1x128-d2"), run_config("llama-2-7b", "p1x128-d2"),
                              tmp_path / "t", capsys)
    assert code == 1
    assert "CUDA-graph replays" in err


def test_compiled_trace_keeps_its_extern_gemms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch.compile leaves GEMMs and attention to ATen (extern kernels, their operators with shapes):
    the same rows as the eager trace's."""
    code, _, _ = from_trace(trace("llama-2-7b", "compiled", "p1x128-d2"), run_config("llama-2-7b", "p1x128-d2"),
                            tmp_path / "compiled", capsys)
    assert code == 0
    code, _, _ = from_trace(trace("llama-2-7b", "eager", "p1x128-d2"), run_config("llama-2-7b", "p1x128-d2"),
                            tmp_path / "eager", capsys)
    assert code == 0
    compiled = read_table_dir(tmp_path / "compiled").tables
    eager = read_table_dir(tmp_path / "eager").tables
    assert compiled["gemm_bf16.csv"] == eager["gemm_bf16.csv"]
    assert compiled["attention.csv"] == eager["attention.csv"]
