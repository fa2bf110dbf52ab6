"""Dense-attention cards give the same results as before the architecture-breadth change.

tests/data/golden_dense.json was written by tests/data/record_golden_dense.py before any of the new
layer kinds existed; every number (step times, per-operation time/FLOPs/bytes, memory) must match
to a relative 1e-12.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from infersim.run.config import load_run_config
from infersim.run.simulate import simulate

REPO = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((REPO / "tests" / "data" / "golden_dense.json").read_text())


# config fields the golden numbers were recorded with that the config has since changed
RECORDED_WITH = {"configs/qwen3-30b.yaml": ("workload.decode_batch_per_gpu=100", "deployment.moe_comm=all-to-all")}


def _recorded_with(case: dict) -> list[str]:
    """RECORDED_WITH's fields of the case's config that the case's own overrides do not set."""
    own = {text.split("=", 1)[0] for text in case["overrides"]}
    return [text for text in RECORDED_WITH.get(case["config"], ()) if text.split("=", 1)[0] not in own]


def _close(a: float, b: float) -> bool:
    return a == pytest.approx(b, rel=1e-12, abs=0.0) if b else a == b


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_dense_results_unchanged(key):
    case = GOLDEN[key]
    # the golden numbers predate expert-load imbalance (deployment.moe): compare at even load; and
    # SGLang's gathered LM head under DP attention (deployment.lm_head): compare per rank
    # and the engine's default MoE path (SGLang's all-gather): configs that name none ran all-to-all;
    # and Qwen3's QK-norm kernel (model.qk_norm), which the cards did not have; and every table in use
    # (kernel_libraries: the DeepSeek decode case now times attention by FlashMLA's roofline)
    # and the example config's fixed decode batch of 100, which became 'max'
    named = "moe_comm" in (yaml.safe_load((REPO / case["config"]).read_text()).get("deployment") or {})
    result = simulate(load_run_config(str(REPO / case["config"]),
                                      [*case["overrides"], *_recorded_with(case),
                                       "deployment.moe.load_balance=ideal",
                                       "deployment.moe.redundant_experts=0", "deployment.lm_head=per-rank",
                                       "model.qk_norm=false", "kernel_libraries.attention=FlashInfer",
                                       *([] if named else ["deployment.moe_comm=all-to-all"])]))
    # DeepEP's exchanges are priced as its kernels work (normal mode bound by the SMs it
    # holds, low-latency mode's receive pass, fp8 tokens with their scales): the golden numbers predate
    # that, so DeepEP runs compare every other operation but not the exchanges nor the step totals
    deepep = result.config.deployment.moe_comm.startswith("deepep")
    for stage_name in ("prefill", "decode"):
        stage, want = getattr(result, stage_name), case[stage_name]
        if not deepep:
            assert _close(stage.step_time_s, want["step_time_s"]), (stage_name, stage.step_time_s, want["step_time_s"])
            assert _close(stage.tgs, want["tgs"])
        got_ops = [[op.group, op.name, op.time_s, op.flops, op.bytes] for op in stage.operations]
        assert [o[:2] for o in got_ops] == [o[:2] for o in want["operations"]], stage_name
        for got, exp in zip(got_ops, want["operations"]):
            if deepep and got[1] in ("dispatch", "combine"):
                continue
            for g, e in zip(got[2:], exp[2:]):
                assert _close(g, e), (stage_name, got[:2], g, e)
    mem = result.memory
    for name, value in case["memory"].items():
        assert _close(getattr(mem, name), value), (name, getattr(mem, name), value)
