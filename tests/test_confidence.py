"""The grade of every result (measured tables of this GPU and engine / another engine's or GPU's
tables, transferred / roofline), per operation, module and headline; and the prefill step kept
apart from the TTFT of one request."""

from __future__ import annotations


import pytest
from conftest import REPO_ROOT

from cli_helpers import run_json

from infersim.cli.main import main

H100_TRTLLM = REPO_ROOT / "mfu_tables" / "aiconfigurator" / "h100-sxm" / "trtllm-1.3.0rc20"
LLAMA_70B = ["--model", "llama-3.1-70b", "--tp", "8", "--isl", "2000", "--osl", "500"]


def _check_shares(stage: dict) -> None:
    """The grade shares are the operations' times by grade over the step's operation time, and the
    headline grade is the one carrying the most."""
    total = sum(m["time_us"] for m in stage["modules"])
    for grade, share in stage["confidence"]["shares"].items():
        mine = sum(m["time_us"] for m in stage["modules"] if m["grade"] == grade)
        assert share == pytest.approx(mine / total)
    shares = stage["confidence"]["shares"]
    assert stage["confidence"]["grade"] == max(shares, key=shares.__getitem__)


@pytest.mark.parametrize("engine, borrowed, grade", [("trtllm", False, "measured"), ("vllm", False, "measured"),
                                                     ("sglang", False, "measured"), ("vllm", True, "transferred")])
def test_bundled_tables_are_measured_for_their_own_engine_only(capsys: pytest.CaptureFixture[str], engine: str,
                                                               borrowed: bool, grade: str) -> None:
    tables = ["--mfu-tables", str(H100_TRTLLM)] if borrowed else []
    data = run_json(capsys, *LLAMA_70B, "--hardware", "h100", "--engine", engine, *tables)
    for name in ("prefill", "decode"):
        stage = data[name]
        _check_shares(stage)
        assert stage["confidence"]["grade"] == grade
        # every table-timed operation carries the tables' grade, everything else the roofline's
        assert {m["grade"] for m in stage["modules"] if m["source"] == "table"} == {grade}
        assert {m["grade"] for m in stage["modules"] if m["source"] != "table"} == {"roofline"}
        assert stage["confidence"]["modules"]["dense_ffn"] == grade
        assert stage["confidence"]["modules"]["elementwise"] == "roofline"
    tables = data["decode"]["confidence"]["tables"]
    # each serving engine has aiconfigurator's tables of its own on the H100
    assert tables.startswith(f"{'trtllm' if borrowed else engine} ") and "tables of h100-sxm" in tables
    assert (f"not {engine}'s" in tables) == (grade == "transferred")


def test_a_run_without_tables_is_roofline_and_names_its_efficiencies(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, *LLAMA_70B, "--hardware", "h100", "--engine", "vllm", "--mfu-tables", "none")
    decode = data["decode"]["confidence"]
    assert decode["grade"] == "roofline" and decode["shares"] == {"measured": 0.0, "transferred": 0.0,
                                                                   "roofline": 1.0}
    assert decode["tables"] is None
    hw = data["hardware_peaks"]
    # the dense FFN's decode GEMMs are memory-bound at 71 requests: the card's memory efficiency
    assert f"memory_efficiency {hw['memory_efficiency']:g}" in decode["assumed"]
    assert f"elementwise_memory_efficiency {hw['elementwise_memory_efficiency']:g}" in decode["assumed"]
    assert "vllm card overheads" in decode["assumed"]


def test_another_gpus_tables_are_transferred(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--model", "llama-3.1-8b", "--hardware", "h200", "--engine", "trtllm",
                    "--mfu-tables", str(H100_TRTLLM))
    confidence = data["prefill"]["confidence"]
    assert confidence["grade"] == "transferred"
    assert confidence["tables"] == "trtllm 1.3.0rc20 tables of h100-sxm: measured on h100-sxm, not h200"


def test_the_text_report_shows_the_grade_per_module_and_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LLAMA_70B, "--hardware", "h100", "--engine", "vllm", "--mfu-tables", str(H100_TRTLLM)]) == 0
    out = capsys.readouterr().out
    assert out.count("  grade: transferred, tables of another engine or GPU (trtllm 1.3.0rc20 tables of h100-sxm: "
                     "trtllm kernels, not vllm's): ") == 2
    assert out.count("| roofline, efficiencies assumed (elementwise at 0.80 of HBM bandwidth + 3 us per kernel "
                     "(the tables' rule); vllm card overheads") == 2
    header = next(line for line in out.splitlines() if line.strip().startswith("module"))
    assert header.split()[-1] == "grade"
    ffn = next(line for line in out.splitlines() if line.strip().startswith("dense_ffn"))
    assert ffn.split()[-2:] == ["table", "transferred"]


def test_the_prefill_step_and_the_single_request_ttft(capsys: pytest.CaptureFixture[str]) -> None:
    # the example packs 16,384 prompt tokens per GPU in one step: four 4,096-token prompts per GPU
    packed = run_json(capsys, "--config", "qwen3-30b.yaml")["prefill"]
    assert packed["prompts_per_step"] == 4
    assert packed["step_time_ms"] == packed["ttft_ms"]  # the old key keeps its number
    # one prompt alone is the same run with the engine's own step of one prompt (SGLang cuts it to
    # its chunked-prefill budget)
    alone = run_json(capsys, "--config", "qwen3-30b.yaml", "--set", "workload.prefill_tokens_per_gpu=0")["prefill"]
    assert alone["prompts_per_step"] == 1
    assert packed["single_request_ttft_ms"] == pytest.approx(alone["step_time_ms"])
    assert alone["single_request_ttft_ms"] == alone["step_time_ms"]
    assert packed["single_request_ttft_ms"] < packed["step_time_ms"] / 2


def test_the_text_report_names_the_prefill_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LLAMA_70B, "--hardware", "h100", "--engine", "vllm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("PREFILL"))
    assert lines[head].startswith("PREFILL  step ") and "TTFT" not in lines[head]
    assert lines[head + 1].startswith("  single-request TTFT ") and "the step above" in lines[head + 1]
