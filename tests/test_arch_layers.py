"""Hand-derived costs and cache memory of the newer layer kinds: sliding-window attention,
Gated DeltaNet and Mamba-2 mixers, DeepSeek sparse attention (indexer + top-k MLA).

Cards are the round-number ones of core_fixtures (hidden 64, 4 query heads of 16, 2 KV heads)
with the new fields added; the GPU does 100 TFLOP/s and 1 TB/s with no overheads, so a roofline
time is max(FLOPs / 1e14, bytes / 1e12).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import FREE_ENGINE, ROUND_GPU, TINY_MLA, TINY_MODEL, TINY_MOE, make_config
from infersim.cards.engine import EngineCard, validate_engine
from infersim.cards.hardware import HardwareCard
from infersim.cards.schema import build
from infersim.run.config import load_hardware_card, load_model_card
from infersim.base.errors import ConfigError
from infersim.shapes.kernels import AttentionShape, IndexerShape, LinearAttentionShape
from infersim.run.memory import (bounded_bytes_per_request, kv_bytes_per_token, memory_budget, request_bytes,
                                 weights_per_gpu)
from infersim.run.memory_pools import WindowPool
from infersim.modules.linear_attention import linear_mixer_weight_params, state_bytes_per_request_per_layer
from infersim.modules.step import build_stage_plan
from infersim.run.simulate import simulate
from infersim.costing.timing import roofline_cost

HW = build(HardwareCard, ROUND_GPU, "test")
WORKLOAD = {"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 8, "decode_batch_per_gpu": 2}

SLIDING = {**TINY_MODEL, "name": "tiny-swa", "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}
GDN = {**TINY_MODEL, "name": "tiny-gdn", "layer_types": ["linear_attention", "full_attention"],
       "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
       "linear_conv_kernel_dim": 4, "linear_chunk_size": 4}
MAMBA = {**TINY_MODEL, "name": "tiny-mamba", "layer_types": ["mamba", "full_attention"], "mamba_d_state": 4,
         "mamba_head_dim": 8, "mamba_expand": 2, "mamba_n_groups": 2, "mamba_chunk_size": 4}
DSA = {**TINY_MLA, "name": "tiny-dsa", "index_n_heads": 2, "index_head_dim": 8, "index_topk": 4}


def config(model, **deployment):
    return make_config(model, workload=dict(WORKLOAD), **deployment)


def plan(cfg, stage, tokens, q_len=1):
    return build_stage_plan(stage, cfg.model, cfg.deployment, cfg.workload, tokens, 0, q_len=q_len)


def group_ops(p, name):
    (group,) = [g for g in p.groups if g.name == name]
    return {op.name: op for op in group.operations}


# ---------------------------------------------------------------------------------------------
# Sliding window


def test_sliding_window_pairs_and_bytes():
    # prefill of 8 tokens, window 4: query p sees min(p, 4) keys -> 1+2+3+4+4+4+4+4 = 26 pairs
    s = AttentionShape("mha", "prefill", 1, 8, 8, 4, 2, 16, 16, window=4)
    assert s.attended_pairs == 26
    assert s.flops == 2 * 4 * 26 * (16 + 16) == 6656
    # reads only the 4 tokens inside the window: q+out 8*4*32*2, K/V 4 tokens * 2 heads * 32 * 2
    assert s.bytes == 8 * 4 * 32 * 2 + 4 * 2 * 32 * 2 == 2560
    # decode at context 10: one query reads 4 of 10 cached tokens
    d = AttentionShape("mha", "decode", 3, 1, 10, 4, 2, 16, 16, window=4)
    assert d.attended_pairs == 4
    assert d.bytes == 3 * (1 * 4 * 32 * 2 + 4 * 2 * 32 * 2) == 2304
    # a window longer than the context changes nothing
    assert AttentionShape("mha", "decode", 3, 1, 10, 4, 2, 16, 16, window=64).bytes == \
        AttentionShape("mha", "decode", 3, 1, 10, 4, 2, 16, 16).bytes


def test_sliding_layers_get_their_own_group_with_the_window():
    cfg = config(SLIDING)
    p = plan(cfg, "decode", 2)
    assert [(g.name, g.layers) for g in p.groups] == [("dense layers (sliding window)", 1),
                                                      ("dense layers (full attention)", 1)]
    local = group_ops(p, "dense layers (sliding window)")["attn_core"].shape
    full = group_ops(p, "dense layers (full attention)")["attn_core"].shape
    assert (local.window, full.window) == (4, 0)
    assert local.kv_len == full.kv_len == 10  # decode context ISL + OSL/2
    assert local.kv_tokens_read == 4 and full.kv_tokens_read == 10


def test_sliding_kv_memory_is_bounded_by_the_window():
    cfg = config(SLIDING)
    per_layer = 2 * 2 * 16 * 2  # K and V, 2 heads of 16, bf16 = 128 bytes per token
    assert kv_bytes_per_token(cfg.model, "bf16") == 1 * per_layer  # only the full layer grows
    # one request of 12 tokens: the sliding layer keeps 4 of them
    assert bounded_bytes_per_request(cfg.model, "bf16", 12) == 1 * 4 * per_layer == 512
    assert bounded_bytes_per_request(cfg.model, "bf16", 3) == 3 * per_layer  # shorter than the window
    mem = memory_budget(cfg.model, cfg.hardware, cfg.deployment, cfg.workload)
    assert mem.bounded_bytes_per_request == 512
    assert mem.max_batch_per_gpu == int(mem.kv_capacity_bytes // (12 * per_layer + 512))


def _engine_with_window_pool(ratio: float):
    data = copy.deepcopy(FREE_ENGINE)
    data["memory"]["sliding_window_pool_ratio"] = ratio
    return validate_engine(build(EngineCard, data, "e.yaml"), "e.yaml")


@pytest.mark.parametrize("isl, osl, pool_tokens", [
    (8, 4, 12),  # 12 tokens: 4 in the window, 8 pool tokens' share of it: the context fills the pool first
    (2, 1, 6),   # 3 tokens, all in the window: they fill its half-share of the pool at 6 pool tokens
])
def test_a_hybrid_sliding_window_pool_allots_window_kv_to_every_token(isl, osl, pool_tokens):
    """SGLang's hybrid SWA pool (ratio 0.5 here): each token of the full layer's pool comes with half a
    token of the sliding layer's KV, used or not: 128 + 0.5 x 128 = 192 bytes a pool token."""
    cfg = config(SLIDING)
    work = replace(cfg.workload, isl=isl, osl=osl, prefill_tokens_per_gpu=isl)
    mem = memory_budget(cfg.model, cfg.hardware, cfg.deployment, work, None, _engine_with_window_pool(0.5))
    assert mem.pool_token_bytes_per_gpu == 192
    assert mem.request_bytes_per_gpu == pool_tokens * 192
    assert mem.kv_fit_batch_per_gpu == int(mem.kv_capacity_bytes // (pool_tokens * 192))
    assert mem.pool_tokens(1) == int(mem.kv_capacity_bytes / (pool_tokens * 192 / (isl + osl)))
    without = memory_budget(cfg.model, cfg.hardware, cfg.deployment, work, None, _engine_with_window_pool(0.0))
    assert without.window_pool is None and without.request_bytes_per_gpu == (isl + osl) * 128 + min(isl + osl, 4) * 128
    # a model without full-attention layers has no full pool to size: the window alone
    only_sliding = config({**SLIDING, "layer_types": ["sliding_attention"]})
    assert memory_budget(only_sliding.model, cfg.hardware, cfg.deployment, work, None,
                         _engine_with_window_pool(0.5)).window_pool is None


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet
# ---------------------------------------------------------------------------------------------
# Gated DeltaNet


def test_gdn_prefill_phases_hand_derived():
    # 8 tokens of one sequence, 4 value heads / 2 key heads of 8, chunk 4 (2 chunks), fp32 state
    kw = dict(kind="gdn", stage="prefill", batch=1, q_len=8, num_heads=4, num_key_heads=2, key_dim=8, value_dim=8,
              chunk=4)
    intra = LinearAttentionShape(phase="intra_chunk", **kw)
    # per token and head: K K^T 2*4*8 = 64, solve 4*4/3, W/U 2*4*(8+8) = 128
    assert intra.flops == pytest.approx(8 * 4 * (64 + 16 / 3 + 128))
    # per token: k 2*8*2 = 32, v 4*8*2 = 64, g/beta 4*8 = 32, A fp32 w+r and its inverse bf16 w+r 4*4*(8+4) = 192,
    # W and U 4*(8+8)*2 = 128 -> 448
    assert intra.bytes == 8 * 448 == 3584
    assert intra.kernels == 3
    state = LinearAttentionShape(phase="state", **kw)
    assert state.flops == 8 * 4 * 4 * 8 * 8 == 8192
    # per token k 32 + W 64 + U 64 + V_new 64 = 224; chunk states 2 * 256 * 2; first and last state 256 * 4 * 2
    assert state.bytes == 8 * 224 + 2 * 256 * 2 + 256 * 4 * 2 == 4864
    out = LinearAttentionShape(phase="output", **kw)
    assert out.flops == 8 * 4 * (2 * 64 + 2 * 4 * 16) == 8192
    # q and k 64, V_new and o 128 per token; chunk states read 2 * 256 * 2
    assert out.bytes == 8 * 192 + 2 * 256 * 2 == 2560
    assert roofline_cost(out, HW).seconds == pytest.approx(2560 / 1e12)


def test_gdn_decode_recurrence_reads_and_writes_the_state_once():
    r = LinearAttentionShape("gdn", "decode", "recurrent", 3, 1, 4, 2, 8, 8)
    assert r.flops == 3 * 4 * 7 * 64 == 5376
    # per token q, k 64 + v, o 128 + g, beta 32; state 256 fp32 read and written per request
    assert r.bytes == 3 * 224 + 3 * 256 * 4 * 2 == 6816
    # verifying 3 tokens per request: 3x the FLOPs, the state still once
    r3 = LinearAttentionShape("gdn", "decode", "recurrent", 3, 3, 4, 2, 8, 8)
    assert r3.flops == 3 * r.flops
    assert r3.bytes == 9 * 224 + 3 * 256 * 4 * 2


def test_mamba2_phases_hand_derived():
    # 2 heads of P = 8, 1 group, state N = 4, chunk 4, 8 tokens (2 chunks), fp32 states
    kw = dict(kind="mamba2", stage="prefill", batch=1, q_len=8, num_heads=2, num_key_heads=1, key_dim=4, value_dim=8,
              chunk=4)
    intra = LinearAttentionShape(phase="intra_chunk", **kw)
    assert intra.flops == 8 * 1 * 2 * 4 * 4 == 256  # C B^T per group
    assert intra.bytes == 8 * (2 * 8 + 2 * 4 + 1 * 4 * 4) == 320  # B, C; dt; C B^T fp32
    state = LinearAttentionShape(phase="state", **kw)
    assert state.flops == 8 * 2 * 2 * 4 * 8 == 1024
    assert state.bytes == 8 * (8 + 32 + 8) + 2 * 2 * 64 * 4 + 64 * 4 * 2 == 1920
    out = LinearAttentionShape(phase="output", **kw)
    assert out.flops == 8 * 2 * (2 * 32 + 2 * 4 * 8) == 2048
    assert out.bytes == 8 * (16 + 8 + 64 + 8) + 2 * 64 * 4 == 1280
    rec = LinearAttentionShape("mamba2", "decode", "recurrent", 2, 1, 2, 1, 4, 8)
    assert rec.flops == 2 * 2 * 5 * 32 == 640
    assert rec.bytes == 2 * (16 + 64 + 8) + 2 * 64 * 4 * 2 == 1200


def test_gdn_layer_operations_state_memory_and_weights():
    cfg = config(GDN)
    p = plan(cfg, "prefill", 8)
    ops = group_ops(p, "dense layers (Gated DeltaNet)")
    assert [n for n in ops if n.startswith("gdn")] == ["gdn_in_proj", "gdn_conv1d", "gdn_intra_chunk", "gdn_state",
                                                       "gdn_output", "gdn_gated_norm", "gdn_out_proj"]
    # in_proj: q, k (2 heads of 8), v, z (4 heads of 8), b, a (4 each) = 104 columns
    assert (ops["gdn_in_proj"].shape.k, ops["gdn_in_proj"].shape.n) == (64, 104)
    assert ops["gdn_state"].shape == LinearAttentionShape("gdn", "prefill", "state", 1, 8, 4, 2, 8, 8, chunk=4)
    # conv over q, k, v (2*2*8 + 4*8 = 64 channels), width 4: in/out per token, state 3 * 64 bf16 read and written
    assert ops["gdn_conv1d"].shape.bytes == 2 * 8 * 64 * 2 + 2 * 3 * 64 * 2
    assert "attn_core" in group_ops(p, "dense layers (full attention)")
    decode = group_ops(plan(cfg, "decode", 2), "dense layers (Gated DeltaNet)")
    assert decode["gdn_recurrent"].shape == LinearAttentionShape("gdn", "decode", "recurrent", 2, 1, 4, 2, 8, 8, chunk=4)
    # state: 4 heads of 8x8 fp32 + conv 3 x 64 bf16
    assert state_bytes_per_request_per_layer(cfg.model, "linear_attention", 1) == 4 * 64 * 4 + 3 * 64 * 2 == 1408
    assert state_bytes_per_request_per_layer(cfg.model, "linear_attention", 2) == 2 * 64 * 4 + 3 * 32 * 2 == 704
    # weights: in_proj 64*104, conv 64*4, out_proj 32*64, A_log + dt_bias 2*4, norm 8
    assert linear_mixer_weight_params(cfg.model, "linear_attention", 1) == 6656 + 256 + 2048 + 8 + 8 == 8976
    # memory: the GDN layer keeps 1408 bytes per request whatever the context, the full layer 128 per token
    assert kv_bytes_per_token(cfg.model, "bf16") == 128
    assert bounded_bytes_per_request(cfg.model, "bf16", 12) == 1408
    mem = memory_budget(cfg.model, cfg.hardware, cfg.deployment, cfg.workload)
    assert mem.max_batch_per_gpu == int(mem.kv_capacity_bytes // (12 * 128 + 1408))


def test_mamba_layer_operations_and_state():
    cfg = config(MAMBA)
    ops = group_ops(plan(cfg, "prefill", 8), "dense layers (Mamba-2)")
    # 2 x 64 / 8 = 16 heads, inner 128; in_proj z, x (128 each), B, C (2 groups of 4), dt (16)
    assert ops["mamba_in_proj"].shape.n == 2 * 128 + 2 * 2 * 4 + 16
    assert ops["mamba_state"].shape == LinearAttentionShape("mamba2", "prefill", "state", 1, 8, 16, 2, 4, 8, chunk=4)
    # state 16 heads of 8 x 4 fp32 + conv 3 x (128 + 2*2*4) bf16
    assert state_bytes_per_request_per_layer(cfg.model, "mamba", 1) == 16 * 32 * 4 + 3 * 144 * 2
    assert "mamba_recurrent" in group_ops(plan(cfg, "decode", 2), "dense layers (Mamba-2)")


def test_interleave_patterns():
    n8 = {**GDN, "num_hidden_layers": 8, "layer_types": []}
    interval, _ = load_model_card({**n8, "full_attention_interval": 4})
    assert interval.layer_kinds == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",)
    pattern, _ = load_model_card({**n8, "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    assert pattern.layer_kinds == interval.layer_kinds
    cfg = config({**n8, "full_attention_interval": 4})
    assert [(g.name, g.layers) for g in plan(cfg, "decode", 2).groups] == [
        ("dense layers (Gated DeltaNet)", 6), ("dense layers (full attention)", 2)]
    moe = {**TINY_MOE, **{k: v for k, v in GDN.items() if k.startswith("linear")}, "num_hidden_layers": 4,
           "layer_types": ["linear_attention", "full_attention"], "first_k_dense_replace": 1, "intermediate_size": 128}
    cfg = config(moe)
    assert [(g.name, g.layers) for g in plan(cfg, "decode", 2).groups] == [
        ("dense layers (Gated DeltaNet)", 1), ("MoE layers (full attention)", 2), ("MoE layers (Gated DeltaNet)", 1)]


@pytest.mark.parametrize("change, field", [
    ({"layer_types": ["linear_attention", "full_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_window"),
    ({"linear_num_value_heads": 0}, "linear_num_value_heads"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"full_attention_interval": 1}, "full_attention_interval"),
])
def test_bad_layer_fields_are_one_clear_error(change, field):
    with pytest.raises(ConfigError) as err:
        load_model_card({**GDN, **change})
    assert err.value.field == field


def test_linear_heads_must_split_over_attention_tp():
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        config({**GDN, "linear_num_value_heads": 6, "linear_num_key_heads": 2}, num_gpus=4,
               attention={"tp": 4}, ffn={"tp": 4})


# ---------------------------------------------------------------------------------------------
# DeepSeek sparse attention


def test_indexer_hand_derived():
    # decode: 2 requests, context 10, 2 heads of 8: 10 pairs each
    d = IndexerShape("decode", 2, 1, 10, 2, 8)
    assert d.flops == 2 * 2 * 10 * 2 * 8 == 640
    # per request: keys 10 x (8 fp8 + 4 scale), query 2 x (8 fp8 + 4 weight), logits 10 x 4
    assert d.bytes == 2 * (10 * 12 + 2 * 12 + 10 * 4) == 368
    # prefill of 8: causal 36 pairs
    p = IndexerShape("prefill", 1, 8, 8, 2, 8)
    assert p.flops == 2 * 36 * 2 * 8 == 1152
    assert p.bytes == 8 * 12 + 8 * 2 * 12 + 36 * 4 == 432
    assert roofline_cost(p, HW).seconds == pytest.approx(max(1152 / 200e12, 432 / 1e12))  # fp8 rate


def test_sparse_mla_attends_topk_only():
    # decode, 2 requests at context 10, 4 heads, absorbed dims 40 (latent 32 + rope 8) / 32, top-4
    d = AttentionShape("mla_sparse", "decode", 2, 1, 10, 4, 1, 40, 32, 8, topk=4)
    assert d.attended_pairs == 4
    assert d.flops == 2 * 2 * 4 * 4 * (40 + 32) == 4608
    assert d.bytes == 2 * 1 * 4 * 72 * 2 + 2 * 4 * 40 * 2 == 1792  # q + out, 4 gathered latents
    # the top-k list is padded when fewer tokens are cached, but only real ones are read
    short = AttentionShape("mla_sparse", "decode", 2, 1, 2, 4, 1, 40, 32, 8, topk=4)
    assert short.attended_pairs == 4 and short.kv_tokens_read == 2
    # prefill: 8 queries x 4 keys; the sequence's 8 cached tokens are read once
    p = AttentionShape("mla_sparse", "prefill", 1, 8, 8, 4, 1, 40, 32, 8, topk=4)
    assert p.attended_pairs == 32 and p.kv_tokens_read == 8


def test_dsa_layer_operations_and_kv_memory():
    cfg = config(DSA)
    for stage, tokens in (("prefill", 8), ("decode", 2)):
        ops = group_ops(plan(cfg, stage, tokens), "dense layers")
        assert ops["attn_core"].shape.kind == "mla_sparse" and ops["attn_core"].shape.topk == 4
        assert "q_absorb" in ops and "v_absorb" in ops and "kv_b_proj" not in ops  # absorbed in both stages
        assert ops["indexer_logits"].shape == IndexerShape(stage, tokens // (8 if stage == "prefill" else 1),
                                                           8 if stage == "prefill" else 1, 8 if stage == "prefill" else 10,
                                                           2, 8)
        assert (ops["indexer_q_proj"].shape.k, ops["indexer_q_proj"].shape.n) == (48, 16)  # from the q latent
    # per token and layer: latent 32 + rope 8 in the KV format, index key 8 fp8 + 4 scale
    assert kv_bytes_per_token(cfg.model, "bf16") == 2 * (40 * 2 + 12) == 184
    assert kv_bytes_per_token(cfg.model, "fp8") == 2 * (40 + 12) == 104
    dense, _ = load_model_card(TINY_MLA)
    # indexer weights: wq_b 48*16, wk 64*8, head weights 64*2, key norm 2*8, per layer (bf16)
    assert weights_per_gpu(cfg.model, cfg.deployment) - weights_per_gpu(dense, cfg.deployment) == \
        2 * (48 * 16 + 64 * 8 + 64 * 2 + 16) * 2


def test_dsa_needs_fp8_on_the_gpu():
    no_fp8 = {**ROUND_GPU, "peak": {**ROUND_GPU["peak"], "flops": {"bf16": 100e12}},
              "derates": {**ROUND_GPU["derates"], "compute_efficiency": {"bf16": 1.0}}}
    with pytest.raises(ConfigError, match="fp8"):
        make_config(DSA, no_fp8, workload=dict(WORKLOAD))


# ---------------------------------------------------------------------------------------------
# Sanity against the published kernel timings (../shared/reference/infersim_bench_data)


def test_new_kernels_against_published_timings():
    """The roofline never beats the measured kernel by more than the hardware allows and stays
    within a small factor of it (GDN chunk kernels at batch 1 reach ~40% of the roofline)."""
    h20, _ = load_hardware_card("h20")
    h800, _ = load_hardware_card("h800")
    # gdn/prefill/h20/4-16-128-32-128.csv: 4096 tokens; kkt+solve_tril+wu 210 us, chunk_gdn 188, chunk_o 129
    for phase, measured in (("intra_chunk", 210e-6), ("state", 188e-6), ("output", 129e-6)):
        t = roofline_cost(LinearAttentionShape("gdn", "prefill", phase, 1, 4096, 32, 16, 128, 128), h20).seconds
        assert measured / 3 < t < measured, phase
    # gdn/decode/h20: gdn_update 246 us at batch 128, 1914 us at 1024
    for batch, measured in ((128, 246e-6), (1024, 1914e-6)):
        t = roofline_cost(LinearAttentionShape("gdn", "decode", "recurrent", batch, 1, 32, 16, 128, 128), h20).seconds
        assert 0.6 * measured < t < measured
    # dsa/decode/h800/logits-64-128.csv: batch 64, next_n 1
    for kv, measured in ((1024, 9.108e-6), (16384, 61.446e-6), (131072, 394.036e-6)):
        t = roofline_cost(IndexerShape("decode", 64, 1, kv, 64, 128), h800).seconds
        assert 0.7 * measured < t < 1.1 * measured, kv
    # dsa/prefill/h800/logits-64-128.csv: s_q 2048 over s_kv 4096 -> 101 us; 4096 over 131072 -> 8143 us
    for sq, skv, measured in ((2048, 4096, 101e-6), (4096, 131072, 8143e-6)):
        t = roofline_cost(IndexerShape("prefill", 1, sq, skv, 64, 128), h800).seconds
        assert 0.7 * measured < t < 1.1 * measured
    # dsa/*/h800/attn-128-576-2048.csv: flat in kv_len; decode batch 64 ~91-97 us, prefill 4096 queries ~3.6-3.8 ms
    for kv in (1024, 131072):
        t = roofline_cost(AttentionShape("mla_sparse", "decode", 64, 1, kv, 128, 1, 576, 512, 64, kv_dtype="fp8",
                                         topk=2048), h800).seconds
        assert 0.5 * 96e-6 < t < 96e-6
        t = roofline_cost(AttentionShape("mla_sparse", "prefill", 1, 4096, kv, 128, 1, 576, 512, 64, topk=2048),
                          h800).seconds
        assert 0.8 * 3.7e-3 < t < 1.2 * 3.7e-3


def test_lookup_tables_do_not_match_new_kernels():
    """The measured-table lookup (keyed on the existing kinds) falls back to the roofline for
    every new kernel, even where the head layout matches a measured table."""
    from pathlib import Path

    from infersim.tables.lookup import load_tables

    tables = load_tables(Path(__file__).resolve().parent.parent / "mfu_tables" / "imported" / "h800")
    dense_mla = AttentionShape("mla", "decode", 64, 1, 4096, 128, 1, 576, 512, 64)
    assert tables.lookup(dense_mla, 989.4e12) is not None  # the layout is in the tables ...
    for shape in (AttentionShape("mla_sparse", "decode", 64, 1, 4096, 128, 1, 576, 512, 64, topk=2048),
                  AttentionShape("mla", "decode", 64, 1, 4096, 128, 1, 576, 512, 64, window=128),
                  IndexerShape("decode", 64, 1, 4096, 64, 128),
                  LinearAttentionShape("gdn", "decode", "recurrent", 64, 1, 32, 16, 128, 128)):
        assert tables.lookup(shape, 989.4e12) is None  # ... but not these kernels


def test_real_hybrid_cards_simulate():
    for name in ("gpt-oss-120b.yaml", "qwen3-next.yaml", "deepseek-v3.2.yaml"):
        from infersim.run.config import load_run_config

        result = simulate(load_run_config(name))
        assert result.prefill.step_time_s > 0 and result.decode.step_time_s > 0
        assert result.memory.fits


# ---------------------------------------------------------------------------------------------
# QK-norm (Qwen3 family)


def test_qk_norm_adds_one_kernel_reading_and_writing_q_and_k():
    # 8 prefill tokens, 4 query + 2 KV heads of 16: q and k read and written once in bf16
    p = plan(config({**TINY_MODEL, "name": "tiny-qknorm", "qk_norm": True}), "prefill", 8)
    ops = list(p.groups[0].operations)
    names = [op.name for op in ops]
    assert names.index("qkv_proj") < names.index("qk_norm") < names.index("rope_kv_store")
    shape = ops[names.index("qk_norm")].shape
    assert shape.bytes == 2 * 8 * (4 + 2) * 16 * 2 == 3072 and shape.kernels == 1
    assert "qk_norm" not in [op.name for op in plan(config(TINY_MODEL), "prefill", 8).groups[0].operations]


def test_importer_marks_the_architectures_with_qk_norm():
    from infersim.cards.hf_import import card_fields_from_hf

    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 128, "intermediate_size": 128}
    experts = {"num_experts": 4, "num_experts_per_tok": 2}  # an MoE family's config names its experts
    for model_type, expected in (("qwen3", True), ("qwen3_moe", True), ("olmo2", True), ("llama", False)):
        fields = card_fields_from_hf({**base, "model_type": model_type, **(experts if "moe" in model_type else {})},
                                     "t.json", "t")
        assert fields.get("qk_norm", False) is expected, model_type
    assert card_fields_from_hf({**base, **experts, "model_type": "llama4_text", "use_qk_norm": True}, "t.json",
                               "t")["qk_norm"]
    assert "qk_norm" not in card_fields_from_hf({**base, "model_type": "qwen3", "use_qk_norm": False}, "t.json", "t")
    assert load_model_card("qwen3-30b-a3b")[0].qk_norm and not load_model_card("llama-3.1-8b")[0].qk_norm


@settings(max_examples=200, deadline=None)
@given(context=st.integers(1, 1 << 20), window=st.integers(1, 1 << 16), ratio=st.floats(0.01, 1.0),
       full=st.floats(1.0, 1e6), sliding=st.floats(1.0, 1e6), states=st.floats(0.0, 1e8))
def test_a_hybrid_pool_never_holds_a_request_in_less_than_its_window_and_context_take(context, window, ratio, full,
                                                                                      sliding, states):
    """A request's share of a hybrid pool is at least what it keeps (its context in the full layers,
    its window in the sliding ones), and exactly that with a ratio of 1 and a context within the
    window's share."""
    kept = min(context, window)
    pool = WindowPool(ratio, sliding, kept)
    bounded = kept * sliding + states
    alone = request_bytes(context, full, bounded, None)
    assert alone == context * full + bounded
    assert request_bytes(context, full, bounded, pool) >= alone * (1 - 1e-12)
    if ratio == 1.0:
        assert request_bytes(context, full, bounded, pool) == pytest.approx(context * (full + sliding) + states)


def test_sglang_pools_gpt_oss_sliding_layers_at_0_8_of_its_full_tokens_and_vllm_by_the_window(capsys):
    """gpt-oss-120b on two H100s (TP2): 18 full and 18 sliding (128-token window) layers, each 4 KV
    heads of 64 on a GPU: 1,024 bytes a token a layer. SGLang allots a 2,500-token request 2,500 pool
    tokens of 18,432 + 0.8 x 18,432 bytes; vLLM its context in the full layers and its window in the
    sliding ones."""
    from infersim.cli.main import main

    run = ["--model", "gpt-oss-120b", "--hardware", "h100", "--num-gpus", "2", "--tp", "2", "--isl", "2000",
           "--osl", "500"]
    for engine, request in (("sglang", 2500 * (18432 + 0.8 * 18432)), ("vllm", 2500 * 18432 + 128 * 18432)):
        assert main([*run, "--engine", engine, "--format", "json"]) == 0
        mem = json.loads(capsys.readouterr().out)["memory"]
        assert mem["kv_fit_batch_per_gpu"] == int(mem["kv_capacity_gb"] * 1e9 // (2 * request))
        assert ("sliding_window_pool" in mem) == (engine == "sglang")
    assert main([*run, "--engine", "sglang"]) == 0
    assert ("  KV pool: sglang sizes it in tokens of the full-attention layers, each with 0.8 tokens of the "
            "sliding-window layers' KV beside it (engine card memory.sliding_window_pool_ratio): 33,178 bytes per pool "
            "token on each GPU; a request of 2,500 tokens takes 82,944,000 bytes of it on each GPU\n") in capsys.readouterr().out
