"""A single prompt's prefill under attention TP is that prompt: ceil(isl / tp) tokens per GPU must
not leave the group a phantom prompt of the rounding (489 tokens on TP4 used to add a 3-token
prompt, with its own attention kernel per layer)."""

from __future__ import annotations

import pytest

from infersim.run.config import load_run_config
from infersim.run.flags import RunFlags
from infersim.run.simulate import simulate


def _prefill(isl: int, tp: int = 4, model: str = "llama-3.1-70b"):
    flags = RunFlags(model=model, hardware="h100-sxm", engine="vllm@0.15", tp=tp, isl=isl, osl=16)
    return simulate(load_run_config(None, [], None, flags)).prefill


@pytest.mark.parametrize("isl", [489, 490, 491])
def test_one_prompt_is_one_sequence_whatever_the_rounding(isl: int) -> None:
    prefill = _prefill(isl)
    cores = [op for op in prefill.operations if op.module == "attn_core"]
    assert [op.name for op in cores] == ["attn_core"]  # one attention kernel per layer, not a second one
    assert prefill.tokens_per_gpu == -(-isl // 4)


def test_a_prompt_costs_between_its_divisible_neighbours() -> None:
    low, mid, high = (_prefill(isl).step_time_s for isl in (488, 490, 492))
    assert low < mid < high
    assert (high - low) / low < 0.01  # four tokens more of 488: well under 1% (the phantom prompt cost ~2.5%)
