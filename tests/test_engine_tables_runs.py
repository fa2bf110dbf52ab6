"""A run takes its engine's own bundled kernel tables on every GPU aiconfigurator measured, end to end
through the CLI, and the new GPUs' cards run a single-GPU deployment."""

from __future__ import annotations

import pytest

from infersim.cli.main import main

BRIEF_RUN = ("--isl", "2000", "--osl", "500", "--batch-per-gpu", "8")


def report_of(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


# A100 in the default run (an older vLLM table set, the smallest to index); L40S and the Blackwell
# cards, which run the same code on other tables (~6 CPU-s each to index), with `-m slow`
@pytest.mark.parametrize(("hardware", "card", "tables"), [
    pytest.param("l40s", "l40s", "l40s/vllm-0.24.0", marks=pytest.mark.slow),
    ("a100", "a100-sxm-80g", "a100-sxm-80g/vllm-0.14.0"),
    pytest.param("b300", "b300", "b300/vllm-0.24.0", marks=pytest.mark.slow),
    pytest.param("gb300", "gb300", "gb300/vllm-0.24.0", marks=pytest.mark.slow),
    pytest.param("rtx-pro-6000", "rtx-pro-6000", "rtx-pro-6000/vllm-0.24.0", marks=pytest.mark.slow),
])
def test_single_gpu_vllm_runs_with_that_gpus_vllm_tables(capsys: pytest.CaptureFixture, hardware: str, card: str,
                                                         tables: str) -> None:
    out = report_of(capsys, "--model", "llama-3.1-8b", "--hardware", hardware, "--engine", "vllm", *BRIEF_RUN)
    assert f"llama-3.1-8b on {card} " in out
    assert f"kernel times: mfu_tables/aiconfigurator/{tables} (bundled)" in out
    assert f"kernel tables for {card} and engine vllm: vllm " in out and "took" not in out
    # the dense model's projections are priced from the tables, not the roofline
    decode = out[out.index("DECODE"):out.index("MEMORY")]
    assert "attn_proj" in decode and " table" in decode


def test_a100_40g_runs_on_the_roofline_and_says_why(capsys: pytest.CaptureFixture) -> None:
    out = report_of(capsys, "--model", "llama-3.1-8b", "--hardware", "a100-sxm-40g", "--engine", "vllm", *BRIEF_RUN)
    assert "kernel times: none (roofline fallback for every kernel)" in out


def test_vllm_on_h100_takes_vllm_tables_not_trtllm(capsys: pytest.CaptureFixture) -> None:
    out = report_of(capsys, "--model", "llama-3.1-70b", "--hardware", "h100", "--num-gpus", "8", "--tp", "8",
                    "--engine", "vllm", "--isl", "2000", "--osl", "500")
    assert "kernel times: mfu_tables/aiconfigurator/h100-sxm/vllm-0.24.0 (bundled)" in out
    assert "took trtllm" not in out
