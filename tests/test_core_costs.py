"""Hand-derived FLOPs, bytes, times and memory for small cards (see core_fixtures for the cards)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import ROUND_GPU, TINY_MLA, TINY_MOE, make_config
from infersim.cards.hardware import HardwareCard
from infersim.cards.schema import build
from infersim.modules.comm import collective_cost, token_exchange_cost
from infersim.shapes.comm_shapes import CollectiveShape, TokenExchangeShape
from infersim.shapes.kernels import AttentionShape, GemmShape
from infersim.run.memory import kv_bytes_per_token, memory_budget, total_parameters, weights_per_gpu
from infersim.modules.ffn import expected_active_experts
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate
from infersim.costing.timing import roofline_cost

HW = build(HardwareCard, ROUND_GPU, "test")


def ops_by_name(plan, group_index=0):
    return {op.name: op for op in plan.groups[group_index].operations}


def plan_for(config, stage, tokens):
    return build_stage_plan(stage, config.model, config.deployment, config.workload, tokens,
                            config.hardware.derates.deepep_normal_sms)


def test_gemm_flops_bytes_and_roofline_time():
    g = GemmShape(16, 64, 128)
    assert g.flops == 2 * 16 * 64 * 128 == 262144
    assert g.bytes == 16 * 64 * 2 + 64 * 128 * 2 + 16 * 128 * 2 == 22528
    cost = roofline_cost(g, HW)
    assert cost.seconds == pytest.approx(22528 / 1e12)  # memory-bound at 1 TB/s
    assert cost.bound.value == "memory"
    big = GemmShape(4096, 4096, 4096)
    assert roofline_cost(big, HW).seconds == pytest.approx(2 * 4096**3 / 100e12)
    assert roofline_cost(big, HW).bound.value == "compute"


def test_fp8_gemm_uses_fp8_rate_and_one_byte_weights():
    g = GemmShape(4096, 4096, 4096, dtype="fp8", weight_dtype="fp8")
    assert g.bytes == 4096 * 4096 * (1 + 1 + 2)
    assert roofline_cost(g, HW).seconds == pytest.approx(2 * 4096**3 / 200e12)


def test_tile_padding_rounds_rows_up():
    padded = build(HardwareCard, {**ROUND_GPU, "derates": {**ROUND_GPU["derates"], "gemm_tile_m": 64}}, "t")
    g = GemmShape(1, 8192, 8192)
    # compute runs 64 rows, memory is still the weights: 2*64*8192^2/1e14 = 85.9 us > 134 MB / 1 TB/s
    assert roofline_cost(g, padded).seconds == pytest.approx(max(2 * 64 * 8192**2 / 100e12, g.bytes / 1e12))


def test_causal_attention_pairs_and_gqa_bytes():
    prefill = AttentionShape("mha", "prefill", batch=2, q_len=8, kv_len=8, num_heads=4, num_kv_heads=2,
                             qk_head_dim=16, v_head_dim=16)
    assert prefill.attended_pairs == 8 * 8 - 8 * 7 / 2 == 36
    assert prefill.flops == 2 * 2 * 4 * 36 * 32
    assert prefill.bytes == 2 * 8 * 4 * 32 * 2 + 2 * 8 * 2 * 32 * 2
    decode = AttentionShape("mha", "decode", batch=4, q_len=1, kv_len=10, num_heads=4, num_kv_heads=2,
                            qk_head_dim=16, v_head_dim=16)
    assert decode.flops == 2 * 4 * 4 * 10 * 32  # R_mask = 1 in decode: 4 n_h S_kv d_h per token
    assert decode.bytes == 4 * 10 * (2 * 32) * 2 + 4 * 4 * 32 * 2


def test_mla_decode_reads_latent_once():
    mla = AttentionShape("mla", "decode", batch=1, q_len=1, kv_len=100, num_heads=128, num_kv_heads=1,
                         qk_head_dim=576, v_head_dim=512, rope_dim=64)
    assert mla.kv_elements_per_token == 576
    assert mla.flops == 2 * 128 * 100 * (576 + 512)
    assert mla.bytes == 100 * 576 * 2 + 128 * (576 + 512) * 2


def test_tiny_model_plan_operations_hand_derived():
    config = make_config()
    prefill = ops_by_name(plan_for(config, "prefill", 16))
    assert prefill["qkv_proj"].shape == GemmShape(16, 64, (4 + 2 * 2) * 16)
    assert prefill["o_proj"].shape == GemmShape(16, 64, 64)
    core = prefill["attn_core"].shape
    assert (core.batch, core.q_len, core.kv_len, core.num_heads, core.num_kv_heads) == (2, 8, 8, 4, 2)
    assert prefill["ffn_up_proj"].shape == GemmShape(16, 64, 256)
    assert prefill["ffn_down_proj"].shape == GemmShape(16, 128, 64)
    decode = ops_by_name(plan_for(config, "decode", 4))
    assert decode["attn_core"].shape.kv_len == 8 + 4 // 2  # average context ISL + OSL/2
    assert decode["qkv_proj"].shape.m == 4


def test_stage_time_is_sum_of_operation_times_plus_overhead():
    result = simulate(make_config())
    for stage in (result.prefill, result.decode):
        assert stage.step_time_s == pytest.approx(sum(op.time_s for op in stage.operations))
        assert stage.tgs == pytest.approx(stage.tokens_per_gpu / stage.step_time_s)
    qkv = next(op for op in result.prefill.operations if op.name == "qkv_proj")
    assert qkv.layers == 2
    assert qkv.time_s == pytest.approx(2 * GemmShape(16, 64, 128).bytes / 1e12)
    assert qkv.flops == 2 * 262144


def test_kv_bytes_per_token_gqa_and_mla():
    gqa = make_config().model
    assert kv_bytes_per_token(gqa, "bf16") == 2 * 2 * 2 * 16 * 2  # layers * (K,V) * kv heads * d * bytes
    assert kv_bytes_per_token(gqa, "fp8") == 2 * 2 * 2 * 16 * 1
    mla = make_config(TINY_MLA).model
    assert kv_bytes_per_token(mla, "bf16") == 2 * (32 + 8) * 2  # latent + rope, K and V share it


def test_real_model_kv_bytes():
    from infersim.run.config import load_model_card

    qwen, _ = load_model_card("qwen3-8b")
    assert kv_bytes_per_token(qwen, "bf16") == 36 * 2 * 8 * 128 * 2 == 147456
    ds, _ = load_model_card("deepseek-v3")
    assert kv_bytes_per_token(ds, "bf16") == 61 * 576 * 2 == 70272


def test_weights_and_max_batch_hand_derived():
    config = make_config()
    per_layer = 64 * 8 * 16 + 64 * 64 + 3 * 64 * 128  # qkv + o + SwiGLU
    params = 2 * per_layer + 2 * 2 * 64 + 2 * 128 * 64  # layers + norms + embedding and LM head
    assert total_parameters(config.model) == params
    assert weights_per_gpu(config.model, config.deployment) == params * 2
    mem = memory_budget(config.model, config.hardware, config.deployment, config.workload, None, config.engine)
    # the engine reserves 1 GB plus the activations of one prefill step of 8 tokens: residual and
    # normed copy (2 x 64) plus the widest intermediate, SwiGLU gate+up+output (3 x 128), in bf16
    activations = 8 * (2 * 64 + 3 * 128) * 2
    assert mem.activation_bytes == activations
    capacity = 10e9 - 1e9 - activations - params * 2
    assert mem.kv_capacity_bytes == pytest.approx(capacity)
    assert mem.max_batch_per_gpu == int(capacity // ((8 + 4) * 256))
    assert mem.fits


def test_weights_that_do_not_fit_are_reported_with_numbers():
    config = make_config(overrides=("hardware.peak.hbm_bytes=1.0001e9",))
    result = simulate(config)
    assert not result.memory.fits
    assert not result.fits and result.unfit[0].startswith("weights need")


def test_tensor_parallel_two_halves_gemm_flops_per_gpu():
    one = make_config(workload={"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 16, "decode_batch_per_gpu": 4})
    two = make_config(num_gpus=2, attention={"tp": 2}, ffn={"tp": 2},
                      workload={"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 8, "decode_batch_per_gpu": 2})
    for stage, t1, t2 in (("prefill", 16, 8), ("decode", 4, 2)):
        a, b = ops_by_name(plan_for(one, stage, t1)), ops_by_name(plan_for(two, stage, t2))
        for name in ("qkv_proj", "o_proj", "ffn_up_proj", "ffn_down_proj"):
            assert b[name].shape.flops == a[name].shape.flops / 2, name
        assert "attn_all_reduce" in b and "ffn_all_reduce" in b


def test_all_reduce_ring_bytes_over_nvlink():
    shape = CollectiveShape("all_reduce", 1e6, ranks=8, ranks_per_node=8)
    # zero latency card: 2 (n-1)/n of the buffer over 100 GB/s NVLink
    assert collective_cost(shape, HW).seconds == pytest.approx(2 * 1e6 * 7 / 8 / 100e9)
    h800 = build(HardwareCard, __import__("yaml").safe_load(open("hardware/h800.yaml")), "h800")
    small = collective_cost(CollectiveShape("all_reduce", 1024, 8, 8), h800)
    # LL wins for tiny buffers: 6.8 us base + 2 * 7 * 0.6 us hops + bytes at half of 0.8 * 200 GB/s
    assert small.seconds == pytest.approx(6.8e-6 + 2 * 7 * 0.6e-6 + 2 * 1024 * 7 / 8 / (200e9 * 0.8 * 0.5))
    assert "LL protocol" in small.detail


def test_token_exchange_merges_copies_per_gpu():
    shape = TokenExchangeShape("dispatch", tokens=100, token_bytes=64, num_experts=8, topk=2, ep=4, ranks_per_node=8)
    p_gpu = 1 - (6 / 8) * (5 / 7)  # a GPU with 2 of 8 experts is hit unless both picks miss it
    assert shape.gpu_hit == pytest.approx(p_gpu)
    intra, inter = shape.traffic()
    assert intra == pytest.approx(100 * p_gpu * 64 * 3) and inter == 0
    assert token_exchange_cost(shape, HW).seconds == pytest.approx(100 * p_gpu * 64 * 3 / 100e9)


def test_expected_active_experts():
    assert expected_active_experts(8, 8, 2, 1) == pytest.approx(8 * (1 - (1 - 2 / 8)))
    assert expected_active_experts(2, 256, 8, 10_000) == pytest.approx(2.0)
    assert expected_active_experts(32, 128, 8, 4) == pytest.approx(32 * (1 - (1 - 8 / 128) ** 4))


def test_moe_plan_uses_grouped_gemm_and_exchange():
    config = make_config(TINY_MOE, num_gpus=4, attention={"tp": 1, "dp": 4}, ffn={"ep": 4})
    ops = ops_by_name(plan_for(config, "decode", 4))
    up = ops["experts_up"].shape
    mean = up.balanced()  # the mean EP rank; `up` is the most loaded one (deployment.moe, statistical)
    assert (mean.local_experts, mean.routed_tokens, mean.k, mean.n) == (2, 8, 64, 64)
    assert mean.active_experts == pytest.approx(expected_active_experts(2, 8, 2, 16))
    assert up.load_factor > 1 and up.routed_tokens == pytest.approx(8 * up.load_factor)
    assert up.active_experts >= mean.active_experts
    assert ops["dispatch"].shape.ep == 4 and ops["combine"].shape.direction == "combine"


def test_mla_decode_is_absorbed_and_prefill_is_not():
    config = make_config(TINY_MLA)
    decode = ops_by_name(plan_for(config, "decode", 4))
    assert decode["attn_core"].shape.kind == "mla"
    assert decode["attn_core"].shape.qk_head_dim == 32 + 8
    assert "q_absorb" in decode and "kv_b_proj" not in decode
    prefill = ops_by_name(plan_for(config, "prefill", 16))
    assert prefill["attn_core"].shape.kind == "mha" and prefill["attn_core"].shape.qk_head_dim == 24
    assert "kv_b_proj" in prefill


def test_two_batch_overlap_hides_communication():
    from infersim.engine.stage import two_batch_schedule

    # per micro-batch: compute 3, comm 2, compute 3, comm 2 -> compute stream busy 12 per layer
    layer = [(False, 3.0), (True, 2.0), (False, 3.0), (True, 2.0)]
    assert two_batch_schedule([(layer, 1)]) == pytest.approx(3 + 3 + 3 + 3 + 2)  # last comm of B is exposed
    # from the second layer on the compute stream never waits: 12 a layer, and B's last comm after it
    assert two_batch_schedule([(layer, 10)]) == pytest.approx(10 * 12 + 2)  # serial: 20 a layer
    assert two_batch_schedule([([(False, 1.0)], 3)]) == pytest.approx(6.0)  # nothing to hide


def _two_batch_layer_by_layer(runs: list[tuple[list[tuple[bool, float]], int]]) -> float:
    """The two-stream schedule of every layer, one after another (what two_batch_schedule shortens)."""
    free = {False: 0.0, True: 0.0}
    ready = [0.0, 0.0]
    for phases, layers in runs:
        for _ in range(layers):
            for is_comm, seconds in phases:
                for mb in (0, 1):
                    free[is_comm] = ready[mb] = max(free[is_comm], ready[mb]) + seconds
    return max(ready)


_phase = st.tuples(st.booleans(), st.floats(1e-7, 1e-2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(_phase, max_size=8), st.integers(1, 80)), min_size=1, max_size=4))
def test_two_batch_schedule_is_the_layer_by_layer_schedule(runs):
    from infersim.engine.stage import two_batch_schedule

    assert two_batch_schedule(runs) == pytest.approx(_two_batch_layer_by_layer(runs), rel=1e-12, abs=1e-15)


def test_decode_step_time_rises_with_context():
    short = simulate(make_config(workload={"isl": 8, "osl": 4, "decode_batch_per_gpu": 4}))
    long = simulate(make_config(workload={"isl": 8000, "osl": 4, "decode_batch_per_gpu": 4}))
    assert long.decode.step_time_s > short.decode.step_time_s
    assert math.isclose(long.decode.tokens_per_gpu, 4)
