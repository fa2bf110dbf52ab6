"""Quantised weights and KV: bytes follow the storage format, the tensor-core rate
follows the compute (gemm / attention) format; routed experts can be stored in their own format."""

from __future__ import annotations

import pytest

from core_fixtures import ROUND_GPU, TINY_MOE, TINY_MODEL, make_config
from infersim.cards.hardware import HardwareCard
from infersim.cards.schema import build
from infersim.base.errors import ConfigError
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape
from infersim.run.memory import kv_bytes_per_token, total_parameters, weights_per_gpu
from infersim.modules.step import build_stage_plan
from infersim.costing.timing import roofline_cost

HW = build(HardwareCard, ROUND_GPU, "test")
WORKLOAD = {"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 8, "decode_batch_per_gpu": 4}


@pytest.mark.parametrize("weights, per_weight", [("bf16", 2.0), ("fp8", 1.0), ("int8", 1.0), ("int4", 0.5), ("fp4", 0.5)])
def test_weight_only_gemm_bytes_follow_the_weight_format(weights, per_weight):
    g = GemmShape(16, 64, 128, dtype="bf16", weight_dtype=weights)
    assert g.bytes == 16 * 64 * 2 + 64 * 128 * per_weight + 16 * 128 * 2
    assert g.flops == 2 * 16 * 64 * 128
    # small M: memory-bound, so narrower weights are proportionally faster
    assert roofline_cost(g, HW).seconds == pytest.approx(g.bytes / 1e12)


def test_weight_only_gemm_computes_at_the_activation_rate():
    big = dict(m=8192, k=4096, n=4096)
    w4a16 = roofline_cost(GemmShape(**big, dtype="bf16", weight_dtype="int4"), HW)
    bf16 = roofline_cost(GemmShape(**big, dtype="bf16", weight_dtype="bf16"), HW)
    fp8 = roofline_cost(GemmShape(**big, dtype="fp8", weight_dtype="fp8"), HW)
    assert w4a16.seconds == bf16.seconds == pytest.approx(2 * 8192 * 4096 * 4096 / 100e12)  # bf16 tensor cores
    assert fp8.seconds == pytest.approx(2 * 8192 * 4096 * 4096 / 200e12)  # weight + activation fp8: fp8 rate


def test_fp4_gemm_needs_an_fp4_rate():
    with pytest.raises(ConfigError, match="no fp4 tensor-core rate"):
        make_config(TINY_MODEL, precision={"gemm": "fp4"}, workload=dict(WORKLOAD))


def test_weights_per_gpu_in_each_format():
    bf16 = make_config(TINY_MODEL, workload=dict(WORKLOAD))
    int4 = make_config(TINY_MODEL, precision={"gemm": "bf16", "weights": "int4"}, workload=dict(WORKLOAD))
    # linear weights: 2 layers x (attention 64*(4+2*2)*16 + 4*16*64 + MLP 3*64*128) = 2 * 36864
    linear = 2 * (64 * 8 * 16 + 64 * 64 + 3 * 64 * 128)
    other = (2 * 64 * 2 + 2 * 128 * 64) * 2  # norms and embedding + LM head stay bf16
    assert weights_per_gpu(bf16.model, bf16.deployment) == linear * 2 + other
    assert weights_per_gpu(int4.model, int4.deployment) == linear * 0.5 + other
    plan = build_stage_plan("decode", int4.model, int4.deployment, int4.workload, 4, 0)
    ops = {op.name: op.shape for op in plan.groups[0].operations}
    assert (ops["ffn_up_proj"].dtype, ops["ffn_up_proj"].weight_dtype) == ("bf16", "int4")
    lm_head = {op.name: op.shape for op in plan.per_step}["lm_head"]
    assert lm_head.weight_dtype == "bf16"  # embeddings and LM head are not quantised


def test_expert_weights_have_their_own_format():
    cfg = make_config(TINY_MOE, precision={"gemm": "bf16", "expert_weights": "fp4"}, workload=dict(WORKLOAD))
    plain = make_config(TINY_MOE, workload=dict(WORKLOAD))
    routed = 2 * 8 * 3 * 64 * 32  # 2 layers x 8 experts x 3 matrices x 64 x 32
    assert weights_per_gpu(plain.model, plain.deployment) - weights_per_gpu(cfg.model, cfg.deployment) == \
        routed * (2 - 0.5)
    assert total_parameters(cfg.model) == total_parameters(plain.model)
    plan = build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, 4, 0)
    ops = {op.name: op.shape for op in plan.groups[0].operations}
    up = ops["experts_up"]
    assert isinstance(up, GroupedGemmShape) and (up.dtype, up.weight_dtype) == ("bf16", "fp4")
    assert ops["qkv_proj"].weight_dtype == "bf16"  # attention keeps the weights format
    assert up.bytes == up.active_experts * 64 * 64 * 0.5 + up.routed_tokens * 64 * 2 + up.routed_tokens * 64 * 2


def test_fp8_kv_cache_halves_kv_bytes_not_the_attention_rate():
    cfg = make_config(TINY_MODEL, precision={"kv_cache": "fp8"}, workload=dict(WORKLOAD))
    assert kv_bytes_per_token(cfg.model, "fp8") == kv_bytes_per_token(cfg.model, "bf16") / 2 == 2 * 2 * 2 * 16
    plan = build_stage_plan("decode", cfg.model, cfg.deployment, cfg.workload, 4, 0)
    core = {op.name: op.shape for op in plan.groups[0].operations}["attn_core"]
    assert (core.dtype, core.kv_dtype) == ("bf16", "fp8")
    bf16_core = AttentionShape("mha", "decode", 4, 1, 10, 4, 2, 16, 16)
    assert bf16_core.bytes - core.bytes == 4 * 10 * 2 * 32 * (2 - 1)
    assert core.flops == bf16_core.flops
