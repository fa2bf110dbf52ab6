"""HF transformers' eager and compiled model code as the kernels it launches (infersim.modules.eager,
engines/huggingface.yaml, engines/huggingface-compiled.yaml): counts and bytes derived by hand from the
transformers 5.17 source, and the host cost that makes an eager decode step CPU-bound."""

from __future__ import annotations

import pytest

from infersim.run.config import config_from_mapping
from infersim.engine.stage import kernels_launched, operation_kernels, run_stage
from infersim.shapes.kernels import AttentionShape, GemmShape, MemoryBoundShape
from infersim.modules import eager
from infersim.modules.step import build_stage_plan


def plan(model: str, engine: str, stage: str, batch: int = 2, isl: int = 100, osl: int = 20):
    config = config_from_mapping({"model": model, "hardware": "h100-sxm", "engine": engine,
                                  "deployment": {"num_gpus": 1}, "mfu_tables": "none",
                                  "workload": {"isl": isl, "osl": osl, "decode_batch_per_gpu": batch}}, "test")
    tokens = batch if stage == "decode" else isl
    return config, build_stage_plan(stage, config.model, config.deployment, config.workload, tokens, 0)


def test_an_eager_rms_norm_is_eight_kernels_streaming_fp32() -> None:
    ops = eager.rms_norm("n", rows=3, width=4, code=eager.EAGER)
    assert [op.shape.op for op in ops] == ["add", "to_fp32", "pow", "mean", "add_scalar", "rsqrt", "mul_broadcast",
                                           "to_bf16", "mul_broadcast"]
    # 12 elements: add 12 x (2 + 2 + 2), to_fp32 12 x (2 + 4), pow 12 x 8, mean 12 x 4, eps and rsqrt 3 rows x 8,
    # x * rsqrt 12 x 8, to_bf16 12 x (4 + 2), weight * x 12 x (2 + 2)
    assert sum(op.shape.bytes for op in ops) == 72 + 72 + 96 + 48 + 24 + 24 + 96 + 72 + 48
    fused = eager.rms_norm("n", rows=3, width=4, code=eager.FUSED)
    assert len(fused) == 1 and fused[0].shape.bytes == 4 * 12 * 2  # read x and residual, write both, bf16


def test_a_llama_layer_in_hf_eager_launches_forty_kernels() -> None:
    _, decode = plan("llama-2-7b", "huggingface", "decode")
    (layer,) = decode.groups
    # 2 x (residual add + 8 RMSNorm kernels), q, k, v, o, gate, up, down GEMMs, 2 x 5 rotary kernels,
    # torch.cat of K and of V, SDPA, SiLU and mul
    assert sum(operation_kernels(op) for op in layer.operations) == 18 + 7 + 10 + 2 + 1 + 2
    gemms = [op.name for op in layer.operations if isinstance(op.shape, GemmShape)]
    assert gemms == ["q_proj", "k_proj", "v_proj", "o_proj", "ffn_gate_proj", "ffn_up_proj", "ffn_down_proj"]
    # DynamicCache: each step torch.cat rewrites the whole cache; batch 2 x context 110 x 32 heads x 128
    cat_k = next(op for op in layer.operations if op.name == "kv_cache_cat_k")
    assert cat_k.shape.bytes == 2 * 110 * 32 * 128 * (2 + 2)
    # per step: embedding, 11 rotary-table kernels, 2 of the mask check, 8 of the final norm, the LM head
    assert sum(operation_kernels(op) for op in decode.per_step) == 1 + 11 + 2 + 8 + 1
    assert kernels_launched(decode) == 32 * 40 + 23


def test_an_eager_decode_step_is_bound_by_the_host_launches() -> None:
    config, decode = plan("llama-2-7b", "huggingface", "decode", batch=1)
    result = run_stage(decode, config.hardware, config.tables, config.engine)
    o = config.engine.overheads
    gpu = sum(op.time_s for op in result.operations if op.module != "overhead")
    scheduler = next(op for op in result.operations if op.name == "scheduler")
    launches = o.launch_cpu * kernels_launched(decode)
    assert launches > gpu  # a 7B decode at batch 1: ~1300 launches of 10 us against a few ms of kernels
    # the kernels in launch order (the per-step ones before the final norm run before the layers), each
    # launched launch_cpu after the one before and run once launched and its predecessor is done
    times = {(op.group, op.name): op.time_per_layer_s for op in result.operations}
    (layer,) = decode.groups
    ops = [("per step", op) for op in decode.per_step[:3]] + [(layer.name, op) for op in layer.operations] * 32
    ops += [("per step", op) for op in decode.per_step[3:]]
    host = gpu_free = 0.0
    for group, op in ops:
        for _ in range(operation_kernels(op)):
            host += o.launch_cpu
            gpu_free = max(gpu_free, host) + times[(group, op.name)] / operation_kernels(op)
    lm_head = times[("per step", "lm_head")]
    assert gpu_free >= launches + lm_head  # at least the last launch and the LM head after it
    assert scheduler.time_s == pytest.approx(o.step_fixed + o.step_cpu + gpu_free - gpu)
    assert result.step_time_s == pytest.approx(o.step_fixed + o.step_cpu + gpu_free)


def test_the_compiled_decode_is_fused_graph_replayed_and_attends_over_the_static_cache() -> None:
    config, decode = plan("llama-3.1-70b", "huggingface-compiled", "decode", batch=4, isl=1000, osl=24)
    (layer,) = decode.groups
    # Inductor's generated code for a Llama layer: 6 fused kernels beside 7 GEMMs and SDPA
    fused = [op for op in layer.operations if isinstance(op.shape, MemoryBoundShape)]
    assert len(fused) == 6 and sum(operation_kernels(op) for op in layer.operations) == 14
    attention = next(op.shape for op in layer.operations if isinstance(op.shape, AttentionShape))
    # a mask over the whole allocation (prompt + output), and K and V repeated to all 64 query heads
    assert (attention.kv_len, attention.num_kv_heads, attention.num_heads) == (1024, 64, 64)
    gqa = next(op for op in fused if op.name == "kv_write_mask_gqa")
    cache = 4 * 8 * 1024 * 128 * 2  # one of K or V: batch x kv heads x capacity x dim, bf16
    assert gqa.shape.bytes == 4 * 8 * 128 * 2 + 4 * 1024 + 2 * cache + 2 * cache * 8
    result = run_stage(decode, config.hardware, config.tables, config.engine)
    scheduler = next(op for op in result.operations if op.name == "scheduler")
    assert "CUDA graph" in scheduler.detail and "0 eager launches" in scheduler.detail
    # its prefill is eager (generate compiles the decode forward only), into the static cache
    _, prefill = plan("llama-3.1-70b", "huggingface-compiled", "prefill", isl=1000, osl=24)
    names = [op.name for op in prefill.groups[0].operations]
    assert "input_norm_to_fp32" in names and "kv_cache_copy_k" in names and "kv_cache_cat_k" not in names


def test_hf_moe_block_launches_its_routing_bookkeeping() -> None:
    _, decode = plan("qwen3-235b-a22b", "huggingface", "decode", batch=1)
    (layer,) = decode.groups
    moe = [op for op in layer.operations if op.name.startswith(("post_attn_norm", "router", "experts"))]
    # norm (9), router GEMM, softmax, topk, sum, div; sort, // top_k, 2 gathers, cast, histc, cumsum, sentinel,
    # clamp, masked_fill; 2 grouped GEMMs; masked_fill, SiLU, mul; masked_fill, weights, arange, index_put,
    # gather, top-k sum
    assert sum(operation_kernels(op) for op in moe) == 9 + 1 + 14 + 2 + 3 + 6
    sglang_config, sglang = plan("qwen3-235b-a22b", "sglang", "decode", batch=1)
    fused = [op for op in sglang.groups[0].operations if op.name.startswith(("router", "experts"))]
    assert len(fused) == 5  # the serving engine's block is unchanged: gate, top-k, up, permute/SwiGLU, down


def test_hf_mla_decode_expands_the_whole_latent_cache_every_step() -> None:
    _, decode = plan("deepseek-v3", "huggingface", "decode", batch=2, isl=100, osl=20)
    ops = decode.groups[0].operations
    kv_b = next(op.shape for op in ops if op.name == "kv_b_proj")
    assert (kv_b.m, kv_b.k, kv_b.n) == (2 * 110, 512, 128 * (128 + 128))
    attention = next(op.shape for op in ops if isinstance(op.shape, AttentionShape))
    assert (attention.kind, attention.num_kv_heads, attention.qk_head_dim, attention.v_head_dim) == ("mha", 128, 192, 128)
    assert not any(op.name in ("q_absorb", "v_absorb") for op in ops)
    # the serving engines absorb
    _, sglang = plan("deepseek-v3", "sglang", "decode", batch=2)
    assert any(op.name == "q_absorb" for op in sglang.groups[0].operations)
