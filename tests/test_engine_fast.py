"""The sweep's lean decode timing (stage_time, decode_time) gives exactly run_stage's / run_decode's
numbers: same step time, same dominant bound, same TPOT and throughput, to the last bit, with the
sweep's PricingMemo or without one."""

from __future__ import annotations

import pytest

from infersim.costing.memo import PricingMemo
from infersim.run.config import load_run_config
from infersim.engine.stage import run_stage, stage_time
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import decode_time, run_decode

CASES = [
    ("qwen3-30b.yaml", []),
    ("qwen3-30b.yaml", ["engine=trtllm"]),  # fused operations
    ("qwen3-30b.yaml", ["engine=vllm", "deployment.ffn.ep=1"]),
    ("qwen3-30b.yaml", ["deployment.overlap=two-batch", "deployment.moe_comm=deepep-normal"]),  # SM sharing
    ("qwen3-30b.yaml", ["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.dp=0", "deployment.pp=2"]),
    ("qwen3-next.yaml", []),  # hybrid layers
    ("deepseek-v3.2.yaml", []),
    ("gpt-oss-120b.yaml", []),
]


@pytest.mark.parametrize("config,sets", CASES)
def test_decode_time_equals_run_decode(config, sets):
    cfg = load_run_config(config, sets)
    model, hw, dep, work = cfg.model, cfg.hardware, cfg.deployment, cfg.workload
    memo = PricingMemo()
    for batch in (1, 2, 3, 17, 64, 100, 255, 512, 1000):
        if dep.overlap == "two-batch" and batch % 2:
            continue
        full = run_decode(model, hw, dep, work, batch, cfg.tables, cfg.engine)
        assert decode_time(model, hw, dep, work, batch, cfg.tables, cfg.engine) == (full.tpot_s, full.tgs, full.bound)
        assert decode_time(model, hw, dep, work, batch, cfg.tables, cfg.engine, memo=memo) == \
            (full.tpot_s, full.tgs, full.bound)


@pytest.mark.parametrize("config,sets", CASES[:4])
def test_stage_time_equals_run_stage_prefill_and_without_engine(config, sets):
    cfg = load_run_config(config, sets)
    model, hw, dep, work = cfg.model, cfg.hardware, cfg.deployment, cfg.workload
    memo = PricingMemo()
    for tokens in (2048, 8192):
        plan = build_stage_plan("prefill", model, dep, work, tokens, hw.derates.deepep_normal_sms)
        kept = build_stage_plan("prefill", model, dep, work, tokens, hw.derates.deepep_normal_sms, memo=memo)
        for engine in (cfg.engine, None):
            full = run_stage(plan, hw, cfg.tables, engine)
            assert stage_time(plan, hw, cfg.tables, engine) == (full.step_time_s, full.bound)
            assert stage_time(kept, hw, cfg.tables, engine, memo) == (full.step_time_s, full.bound)
