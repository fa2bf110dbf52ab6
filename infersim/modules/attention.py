"""Attention operations of one layer on one GPU: MHA/GQA/MQA and MLA.

Attention TP splits heads over `attention.tp` GPUs; each GPU of the TP group sees all of the
group's tokens (tp x tokens_per_gpu). MLA decode uses weight absorption (queries projected into
the latent space, attention over the compressed KV, values projected back); MLA prefill
decompresses K/V and runs MHA.
"""

from __future__ import annotations

from infersim.cards.model import ModelCard
from infersim.config import Deployment
from infersim.kernels import AttentionShape, GemmShape, MemoryBoundShape
from infersim.modules import categories as cat
from infersim.plan import Operation, StageContext
from infersim.sharding import heads_per_rank, shard
from infersim.units import dtype_bytes

ACT_BYTES = 2.0  # activations travel in bf16 between kernels


def _core_shapes(model: ModelCard, dep: Deployment, ctx: StageContext, heads: int) -> list[Operation]:
    tp = dep.attention.tp
    prec = dep.precision
    ops = []
    for i, seqs in enumerate(ctx.sequences_per_gpu):
        common = dict(stage=ctx.stage, batch=seqs.count * tp, q_len=seqs.q_len, kv_len=seqs.kv_len,
                      dtype=prec.attention, kv_dtype=prec.kv_cache)
        if model.is_mla and ctx.stage == "decode":
            shape = AttentionShape(kind="mla", num_heads=heads, num_kv_heads=1,
                                   qk_head_dim=model.kv_lora_rank + model.qk_rope_head_dim,
                                   v_head_dim=model.kv_lora_rank, rope_dim=model.qk_rope_head_dim, **common)
        elif model.is_mla:
            shape = AttentionShape(kind="mha", num_heads=heads, num_kv_heads=heads,
                                   qk_head_dim=model.qk_head_dim, v_head_dim=model.v_head_dim,
                                   rope_dim=model.qk_rope_head_dim, **common)
        else:
            shape = AttentionShape(kind="mha", num_heads=heads,
                                   num_kv_heads=heads_per_rank(model.num_key_value_heads, tp),
                                   qk_head_dim=model.head_dim, v_head_dim=model.head_dim, **common)
        ops.append(Operation("attn_core" if i == 0 else f"attn_core_{i}", cat.ATTN_CORE, shape))
    return ops


def attention_operations(model: ModelCard, dep: Deployment, ctx: StageContext) -> list[Operation]:
    """Norm, projections, rotary + KV store and core attention of one layer (no communication)."""
    tp = dep.attention.tp
    tokens = ctx.tokens_per_gpu * tp
    h = model.hidden_size
    prec = dep.precision
    gemm = dict(dtype=prec.gemm, weight_dtype=prec.weight_dtype)
    heads = shard(model.num_attention_heads, tp, "num_attention_heads", "attention.tp")
    kv_bytes = dtype_bytes(prec.kv_cache)
    ops: list[Operation] = [
        Operation("input_norm", cat.ELEMENTWISE, MemoryBoundShape("fused add + RMSNorm", 4 * tokens * h * ACT_BYTES)),
    ]
    if model.is_mla:
        qk_dim, v_dim = model.qk_head_dim, model.v_head_dim
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        if model.q_lora_rank:
            ops.append(Operation("qkv_a_proj", cat.ATTN_PROJ,
                                 GemmShape(tokens, h, model.q_lora_rank + latent, **gemm)))
            ops.append(Operation("q_b_proj", cat.ATTN_PROJ, GemmShape(tokens, model.q_lora_rank, heads * qk_dim, **gemm)))
        else:
            ops.append(Operation("kv_a_proj", cat.ATTN_PROJ, GemmShape(tokens, h, latent, **gemm)))
            ops.append(Operation("q_proj", cat.ATTN_PROJ, GemmShape(tokens, h, heads * qk_dim, **gemm)))
        ops.append(Operation("mla_norms_rope_kv_store", cat.ELEMENTWISE, MemoryBoundShape(
            "q/kv RMSNorm, rotary, latent KV write",
            tokens * (2 * (model.q_lora_rank + latent) + 2 * heads * qk_dim) * ACT_BYTES + tokens * latent * kv_bytes,
            kernels=3)))
        if ctx.stage == "decode":
            # absorbed: q_nope @ W_UK per head into the latent space, then latent output @ W_UV per head
            ops.append(Operation("q_absorb", cat.ATTN_PROJ,
                                 GemmShape(tokens, model.qk_nope_head_dim, heads * model.kv_lora_rank, "bf16", "bf16")))
            ops += _core_shapes(model, dep, ctx, heads)
            ops.append(Operation("v_absorb", cat.ATTN_PROJ,
                                 GemmShape(tokens, model.kv_lora_rank, heads * v_dim, "bf16", "bf16")))
        else:
            ops.append(Operation("kv_b_proj", cat.ATTN_PROJ,
                                 GemmShape(tokens, model.kv_lora_rank, heads * (model.qk_nope_head_dim + v_dim), **gemm)))
            ops += _core_shapes(model, dep, ctx, heads)
        ops.append(Operation("o_proj", cat.ATTN_PROJ, GemmShape(tokens, heads * v_dim, h, **gemm)))
        return ops

    kv_heads = heads_per_rank(model.num_key_value_heads, tp)
    d = model.head_dim
    ops.append(Operation("qkv_proj", cat.ATTN_PROJ, GemmShape(tokens, h, (heads + 2 * kv_heads) * d, **gemm)))
    ops.append(Operation("rope_kv_store", cat.ELEMENTWISE, MemoryBoundShape(
        "rotary on q/k, KV-cache write",
        2 * tokens * (heads + kv_heads) * d * ACT_BYTES + tokens * 2 * kv_heads * d * (ACT_BYTES + kv_bytes),
        kernels=2)))
    ops += _core_shapes(model, dep, ctx, heads)
    ops.append(Operation("o_proj", cat.ATTN_PROJ, GemmShape(tokens, heads * d, h, **gemm)))
    return ops


def kv_elements_per_token_per_layer(model: ModelCard, attention_tp: int) -> int:
    """KV-cache elements one token stores in one layer on one GPU of the attention TP group."""
    if model.is_mla:
        return model.kv_lora_rank + model.qk_rope_head_dim  # latent is replicated on every TP rank
    return 2 * heads_per_rank(model.num_key_value_heads, attention_tp) * model.head_dim


def attention_weight_params(model: ModelCard, attention_tp: int) -> float:
    """Attention parameters of one layer held by one GPU of the attention TP group."""
    h = model.hidden_size
    heads = model.num_attention_heads // attention_tp
    if model.is_mla:
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        q = (h * model.q_lora_rank + model.q_lora_rank * heads * model.qk_head_dim) if model.q_lora_rank \
            else h * heads * model.qk_head_dim
        kv = h * latent + model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
        return q + kv + heads * model.v_head_dim * h
    kv_heads = heads_per_rank(model.num_key_value_heads, attention_tp)
    d = model.head_dim
    params = h * (heads + 2 * kv_heads) * d + heads * d * h
    if model.attention_bias:
        params += (heads + 2 * kv_heads) * d + h
    return params
