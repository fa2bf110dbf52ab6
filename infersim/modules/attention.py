"""Attention operations of one layer on one GPU: MHA/GQA/MQA and MLA, full or sliding-window,
and DeepSeek sparse attention (DSA).

Attention TP splits heads over `attention.tp` GPUs; each GPU of the TP group sees all of the
group's tokens (tp x tokens_per_gpu). MLA decode uses weight absorption (queries projected into
the latent space, attention over the compressed KV, values projected back); MLA prefill
decompresses K/V and runs MHA. In a mixed step (prompt chunks beside decode requests) each
sequence group runs the kernel of its own phase (SequenceBatch.kernel_stage): engines split such a
batch into its context and generation requests.

Sliding-window layers (`sliding_attention`) attend to, read and keep only the last
`sliding_window` tokens; otherwise they cost what a full layer costs. Chunked layers
(`chunked_attention`, Llama-4) cut the positions into chunks of `attention_chunk_size`: a query
attends to the tokens of its own chunk up to itself, so a decode step at context L reads
((L - 1) mod chunk) + 1 tokens, and a prompt's queries run as one sequence per chunk they fall in
(chunk_local: vLLM's local-attention virtual batches). Attention sinks (GPT-OSS) are one learned
logit per head and are ignored.

DSA (DeepSeek-V3.2, `index_topk` > 0): a lightning indexer (index_n_heads heads of
index_head_dim, its queries projected from the MLA query latent, one fp8 key per token cached
next to the latent KV) scores every cached token a query sees; a top-k kernel keeps index_topk of
them; MLA then runs absorbed (as in decode) over those tokens only, in prefill and decode (as
FlashMLA's sparse kernels do). The indexer is small and replicated on every attention-TP rank:
each rank scores all of its group's tokens with all indexer heads.

Qwen3-Next / Qwen3.5 full attention: the sigmoid output gate (`attention_output_gate`) doubles
the query projection and adds one elementwise pass; partial rotary (rotary on a quarter of each
head) and zero-centred norms change no cost we model and are ignored.
"""

from __future__ import annotations

from dataclasses import replace

from infersim.cards.model import CHUNKED_ATTENTION, FULL_ATTENTION, SLIDING_ATTENTION, ModelCard
from infersim.cards.deployment import MixerDeployment, Precision
from infersim.cards.engine import elementwise_code
from infersim.shapes.kernels import AttentionShape, GemmShape, IndexerShape, MemoryBoundShape, causal_pairs, elementwise_shape
from infersim.cards import categories as cat
from infersim.modules import eager
from infersim.modules.eager import rms_norm
from infersim.shapes.plan import Operation, SequenceBatch, Stage, StageContext
from infersim.base.sharding import heads_per_rank, shard
from infersim.base.units import ACT_BYTES, dtype_bytes

INDEX_KEY_DTYPE = "fp8"  # DSA indexer keys are cached in fp8 ...
INDEX_KEY_SCALE_BYTES = 4.0  # ... with one fp32 scale per key (DeepSeek-V3.2 inference code)


def projection_formats(prec: Precision) -> dict[str, str]:
    """The GEMM input and weight formats of a layer's attention (mixer) projections: the deployment's,
    or their own where their weights have one (precision.attention_weights)."""
    return dict(dtype=prec.attention_gemm_dtype, weight_dtype=prec.attention_weight_dtype)


def _core_shapes(model: ModelCard, dep: MixerDeployment, ctx: StageContext, heads: int, window: int = 0) -> list[Operation]:
    tp = dep.attention.tp
    prec = dep.precision
    dtype, kv_dtype = prec.attention, prec.kv_cache
    ops = []
    for i, seqs in enumerate(ctx.sequences_per_gpu):
        stage = seqs.kernel_stage(ctx.stage)
        batch, q_len, kv_len = seqs.group_count(tp), seqs.q_len, seqs.kv_len
        if model.is_sparse_attention:
            shape = AttentionShape("mla_sparse", stage, batch, q_len, kv_len, heads, 1,
                                   model.kv_lora_rank + model.qk_rope_head_dim, model.kv_lora_rank,
                                   rope_dim=model.qk_rope_head_dim, window=window, dtype=dtype, kv_dtype=kv_dtype,
                                   topk=model.index_topk)
        elif model.is_mla and stage == "decode" and dep.model_code.mla == "absorbed":
            shape = AttentionShape("mla", stage, batch, q_len, kv_len, heads, 1,
                                   model.kv_lora_rank + model.qk_rope_head_dim, model.kv_lora_rank,
                                   rope_dim=model.qk_rope_head_dim, window=window, dtype=dtype, kv_dtype=kv_dtype)
        elif model.is_mla:
            shape = AttentionShape("mha", stage, batch, q_len, kv_len, heads, heads, model.qk_head_dim,
                                   model.v_head_dim, rope_dim=model.qk_rope_head_dim, window=window, dtype=dtype,
                                   kv_dtype=kv_dtype)
        else:
            kv_heads = heads_per_rank(model.num_key_value_heads, tp)
            if stage == "decode" and seqs.kv_capacity:
                # a static cache under torch.compile: SDPA gets a mask, so HF repeats K and V to every query
                # head (no enable_gqa), and attends over the whole allocated cache
                kv_len = seqs.kv_capacity
                kv_heads = heads
            shape = AttentionShape("mha", stage, batch, q_len, kv_len, heads, kv_heads, model.head_dim,
                                   model.head_dim, window=window, dtype=dtype, kv_dtype=kv_dtype)
        ops.append(Operation("attn_core" if i == 0 else f"attn_core_{i}", cat.ATTN_CORE, shape))
    return ops


def _indexer_projections(model: ModelCard, dep: MixerDeployment, tokens: int) -> list[Operation]:
    """DSA lightning indexer, the part every token runs: projections, key LayerNorm, rotary, fp8 key store."""
    gemm = projection_formats(dep.precision)
    nh, d = model.index_n_heads, model.index_head_dim
    key_bytes = d * dtype_bytes(INDEX_KEY_DTYPE) + INDEX_KEY_SCALE_BYTES
    return [
        Operation("indexer_q_proj", cat.ATTN_PROJ, GemmShape(tokens, model.q_lora_rank, nh * d, **gemm)),
        Operation("indexer_k_weights_proj", cat.ATTN_PROJ, GemmShape(tokens, model.hidden_size, d + nh, **gemm)),
        Operation("indexer_rope_quant_store", cat.ELEMENTWISE, MemoryBoundShape(
            "indexer key LayerNorm, rotary on q/k, fp8 quantisation, index-key cache write",
            tokens * (nh * d * (2 * ACT_BYTES + dtype_bytes(INDEX_KEY_DTYPE)) + 3 * d * ACT_BYTES + key_bytes),
            kernels=3)),
    ]


def _indexer_scoring(model: ModelCard, dep: MixerDeployment, ctx: StageContext) -> list[Operation]:
    """DSA lightning indexer, the part each sequence runs: logits over its cache, top-k selection."""
    tp = dep.attention.tp
    nh, d = model.index_n_heads, model.index_head_dim
    ops = []
    for i, seqs in enumerate(ctx.sequences_per_gpu):
        suffix = "" if i == 0 else f"_{i}"
        batch = seqs.group_count(tp)
        ops.append(Operation("indexer_logits" + suffix, cat.ATTN_CORE, IndexerShape(
            ctx.stage, batch, seqs.q_len, seqs.kv_len, nh, d, key_dtype=INDEX_KEY_DTYPE,
            key_scale_bytes=INDEX_KEY_SCALE_BYTES)))
        pairs = causal_pairs(seqs.q_len, seqs.kv_len)
        ops.append(Operation("indexer_topk" + suffix, cat.ATTN_CORE, MemoryBoundShape(
            "top-k of the indexer logits", batch * (pairs * 4.0 + seqs.q_len * model.index_topk * 4.0))))
    return ops


# A layer's attention in three parts, so that a plan can keep the parts that do not read the
# sequences' lengths (the tokens' projections, norms and rotary) while the core, which does, changes
# with every context length a sweep tries: before the core and after it (functions of the step's
# tokens, not of its sequences), and the core with whatever reads the sequences (the KV cache and
# its scoring, MLA's up- and absorbing projections, whose token counts follow the sequences).


def attention_before_core(model: ModelCard, dep: MixerDeployment, stage: Stage, tokens: int) -> list[Operation]:
    """The operations before the core that every one of the attention-TP group's `tokens` runs:
    input norm, QKV (or MLA latent) projections, q/k norms, rotary (and, fused, the KV store)."""
    tp = dep.attention.tp
    h = model.hidden_size
    prec = dep.precision
    gemm = projection_formats(prec)
    heads = shard(model.num_attention_heads, tp, "num_attention_heads", "attention.tp")
    code = elementwise_code(dep.model_code, stage)
    ops: list[Operation] = rms_norm("input_norm", tokens, h, code)
    if model.is_mla and code != eager.FUSED:
        return ops + _mla_hf_before_core(model, dep, heads, tokens, code)
    if model.is_mla:
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        if model.q_lora_rank:
            ops.append(Operation("qkv_a_proj", cat.ATTN_PROJ,
                                 GemmShape(tokens, h, model.q_lora_rank + latent, **gemm)))
            ops.append(Operation("q_b_proj", cat.ATTN_PROJ,
                                 GemmShape(tokens, model.q_lora_rank, heads * model.qk_head_dim, **gemm)))
        else:
            ops.append(Operation("kv_a_proj", cat.ATTN_PROJ, GemmShape(tokens, h, latent, **gemm)))
            ops.append(Operation("q_proj", cat.ATTN_PROJ, GemmShape(tokens, h, heads * model.qk_head_dim, **gemm)))
        ops.append(Operation("mla_norms_rope_kv_store", cat.ELEMENTWISE, MemoryBoundShape(
            "q/kv RMSNorm, rotary, latent KV write",
            tokens * (2 * (model.q_lora_rank + latent) + 2 * heads * model.qk_head_dim) * ACT_BYTES
            + tokens * latent * dtype_bytes(prec.kv_cache),
            kernels=3)))
        if model.is_sparse_attention:
            ops += _indexer_projections(model, dep, tokens)
        return ops
    kv_heads = heads_per_rank(model.num_key_value_heads, tp)
    d = model.head_dim
    q_heads = heads * 2 if model.attention_output_gate else heads  # the gate is a second query-width output
    if dep.model_code.projections == "separate":  # HF: q_proj, k_proj, v_proj, each its own nn.Linear
        ops += [Operation("q_proj", cat.ATTN_PROJ, GemmShape(tokens, h, q_heads * d, **gemm)),
                Operation("k_proj", cat.ATTN_PROJ, GemmShape(tokens, h, kv_heads * d, **gemm)),
                Operation("v_proj", cat.ATTN_PROJ, GemmShape(tokens, h, kv_heads * d, **gemm))]
    else:
        ops.append(Operation("qkv_proj", cat.ATTN_PROJ, GemmShape(tokens, h, (q_heads + 2 * kv_heads) * d, **gemm)))
    if model.qk_norm and code != eager.FUSED:
        ops += rms_norm("q_norm", tokens * heads, d, code, residual=False)
        ops += rms_norm("k_norm", tokens * kv_heads, d, code, residual=False)
    elif model.qk_norm:
        # one kernel's time: TensorRT-LLM fuses q/k norm with RoPE (fusedQKNormRopeKernel), SGLang
        # runs q_norm and k_norm on two streams in its decode graphs (models/qwen3*.py _apply_qk_norm)
        ops.append(Operation("qk_norm", cat.ELEMENTWISE, MemoryBoundShape(
            "per-head RMSNorm of q and k", 2 * tokens * (heads + kv_heads) * d * ACT_BYTES)))
    if code == eager.FUSED:
        ops.append(Operation("rope_kv_store", cat.ELEMENTWISE, MemoryBoundShape(
            "rotary on q/k, KV-cache write",
            2 * tokens * (heads + kv_heads) * d * ACT_BYTES
            + tokens * 2 * kv_heads * d * (ACT_BYTES + dtype_bytes(prec.kv_cache)),
            kernels=2)))
    else:
        ops += eager.rotary("q_rotary", tokens, heads, d, code) + eager.rotary("k_rotary", tokens, kv_heads, d, code)
    return ops


def chunk_local(seqs: SequenceBatch, chunk: int) -> list[SequenceBatch]:
    """`seqs` as a chunked-attention kernel runs them: each sequence's queries cut at the chunk
    boundaries, each part a sequence of its own attending to its chunk from the chunk's first token
    up to the query (vLLM 0.15.1 v1/attention/backends/utils.py:219 make_local_attention_virtual_batches).
    Equal parts (the whole chunks of a long prompt) are one group."""
    last = seqs.kv_len
    first = last - seqs.q_len + 1
    parts: dict[tuple[int, int], int] = {}
    for index in range((first - 1) // chunk, (last - 1) // chunk + 1):
        start = index * chunk  # positions before the chunk
        lo, hi = max(first, start + 1), min(last, start + chunk)
        key = (hi - lo + 1, hi - start)
        parts[key] = parts.get(key, 0) + 1
    capacity = min(seqs.kv_capacity, chunk) if seqs.kv_capacity else 0
    return [SequenceBatch(seqs.count * n, q_len, kv_len, seqs.across_tp, capacity) for (q_len, kv_len), n in parts.items()]


def attention_core(model: ModelCard, dep: MixerDeployment, ctx: StageContext, kind: str = FULL_ATTENTION) -> list[Operation]:
    """The operations that read the sequences: the eager KV-cache update, DSA's scoring, MLA's
    up-projection of the cached latents and its absorbing projections, and the core attention.
    kind: full_attention, sliding_attention (the last model.sliding_window tokens only) or
    chunked_attention (the tokens of each query's chunk: its sequences cut by chunk_local)."""
    window = model.sliding_window if kind == SLIDING_ATTENTION else 0
    if kind == CHUNKED_ATTENTION:
        ctx = replace(ctx, sequences_per_gpu=tuple(
            part for seqs in ctx.sequences_per_gpu for part in chunk_local(seqs, model.attention_chunk_size)))
    tp = dep.attention.tp
    tokens = ctx.tokens_per_gpu * tp
    heads = shard(model.num_attention_heads, tp, "num_attention_heads", "attention.tp")
    code = elementwise_code(dep.model_code, ctx.stage)
    if model.is_mla and code != eager.FUSED:
        return _mla_hf_core(model, dep, ctx, heads, tokens, code, window)
    if model.is_mla:
        gemm = projection_formats(dep.precision)
        v_dim = model.v_head_dim
        ops: list[Operation] = _indexer_scoring(model, dep, ctx) if model.is_sparse_attention else []
        # absorbed (decode, DSA): q_nope @ W_UK per head into the latent space, then latent output
        # @ W_UV per head; decompressed (prefill): kv_b_proj, then MHA. A mixed step runs its decode
        # requests absorbed and its prompt chunks decompressed. A chunk decompresses its whole
        # context, the cached prefix's latents included (SGLang's chunked-KV MHA path, TensorRT-LLM's
        # chunked-context MLA and vLLM's context chunks all up-project the prefix they attend to).
        if ctx.stage == "decode" or model.is_sparse_attention:
            absorbed_tokens, decompressed_tokens = tokens, 0
        else:
            absorbed_tokens = tp * sum(s.gpu_tokens(tp) for s in ctx.sequences_per_gpu
                                       if s.kernel_stage(ctx.stage) == "decode")
            decompressed_tokens = sum(s.group_count(tp) * s.kv_len for s in ctx.sequences_per_gpu
                                      if s.kernel_stage(ctx.stage) == "prefill")
        if decompressed_tokens:
            ops.append(Operation("kv_b_proj", cat.ATTN_PROJ, GemmShape(
                decompressed_tokens, model.kv_lora_rank, heads * (model.qk_nope_head_dim + v_dim), **gemm)))
        if absorbed_tokens:
            ops.append(Operation("q_absorb", cat.ATTN_PROJ, GemmShape(
                absorbed_tokens, model.qk_nope_head_dim, heads * model.kv_lora_rank, "bf16", "bf16")))
        ops += _core_shapes(model, dep, ctx, heads, window)
        if absorbed_tokens:
            ops.append(Operation("v_absorb", cat.ATTN_PROJ,
                                 GemmShape(absorbed_tokens, model.kv_lora_rank, heads * v_dim, "bf16", "bf16")))
        return ops
    ops = []
    if code != eager.FUSED:
        kv_heads = heads_per_rank(model.num_key_value_heads, tp)
        d = model.head_dim
        ops += _kv_cache_operations(dep, ctx, kv_heads * d, heads, kv_heads, d, code)
    return ops + _core_shapes(model, dep, ctx, heads, window)


def attention_after_core(model: ModelCard, dep: MixerDeployment, stage: Stage, tokens: int) -> list[Operation]:
    """The operations after the core that every token runs: the output gate, the output projection."""
    tp = dep.attention.tp
    h = model.hidden_size
    gemm = projection_formats(dep.precision)
    heads = shard(model.num_attention_heads, tp, "num_attention_heads", "attention.tp")
    if model.is_mla:
        return [Operation("o_proj", cat.ATTN_PROJ, GemmShape(tokens, heads * model.v_head_dim, h, **gemm))]
    d = model.head_dim
    ops: list[Operation] = []
    if model.attention_output_gate:
        if elementwise_code(dep.model_code, stage) == eager.EAGER:
            ops += [Operation("attn_output_gate_sigmoid", cat.ELEMENTWISE,
                              elementwise_shape("sigmoid", "bf16", tokens * heads * d, "sigmoid of the output gate")),
                    Operation("attn_output_gate_mul", cat.ELEMENTWISE,
                              elementwise_shape("mul", "bf16", tokens * heads * d, "attention output x gate"))]
        else:
            ops.append(Operation("attn_output_gate", cat.ELEMENTWISE, MemoryBoundShape(
                "sigmoid output gate", 3 * tokens * heads * d * ACT_BYTES)))
    ops.append(Operation("o_proj", cat.ATTN_PROJ, GemmShape(tokens, heads * d, h, **gemm)))
    return ops


def _kv_cache_operations(dep: MixerDeployment, ctx: StageContext, kv_width: int, heads: int, kv_heads: int, d: int,
                         code: str) -> list[Operation]:
    """Writing a layer's new K and V, as HF's cache classes do it (ModelCode.kv_cache): the whole
    concatenated cache (DynamicCache) or the new tokens (StaticCache); under torch.compile the static
    cache's V write, mask and GQA repeat are one kernel per step (eager.static_cache_fused)."""
    tp = dep.attention.tp
    new = sum(s.group_count(tp) * s.q_len for s in ctx.sequences_per_gpu) * kv_width
    cached = sum(s.group_count(tp) * s.kv_len for s in ctx.sequences_per_gpu) * kv_width
    if code == eager.INDUCTOR and dep.model_code.kv_cache == "static":
        ops = []
        for s in ctx.sequences_per_gpu:
            capacity = s.kv_capacity or s.kv_len
            ops += eager.static_cache_fused(s.group_count(tp) * s.q_len, heads, kv_heads, d, s.group_count(tp), capacity)
        return ops
    kind = "concat" if dep.model_code.kv_cache == "concat" else "static"
    return eager.kv_cache_update(kind, new, cached)


def _mla_hf_before_core(model: ModelCard, dep: MixerDeployment, heads: int, tokens: int, code: str) -> list[Operation]:
    """MLA as HF transformers' DeepseekV3Attention runs it, up to the cache (the input norm aside):
    q_a_proj -> q_a_layernorm -> q_b_proj, kv_a_proj_with_mqa -> kv_a_layernorm, rotary on the rope parts."""
    gemm = projection_formats(dep.precision)
    h = model.hidden_size
    qk, rope, rank = model.qk_head_dim, model.qk_rope_head_dim, model.kv_lora_rank
    ops: list[Operation] = []
    if model.q_lora_rank:
        ops.append(Operation("q_a_proj", cat.ATTN_PROJ, GemmShape(tokens, h, model.q_lora_rank, **gemm)))
        ops += rms_norm("q_a_layernorm", tokens, model.q_lora_rank, code, residual=False)
        ops.append(Operation("q_b_proj", cat.ATTN_PROJ, GemmShape(tokens, model.q_lora_rank, heads * qk, **gemm)))
    else:
        ops.append(Operation("q_proj", cat.ATTN_PROJ, GemmShape(tokens, h, heads * qk, **gemm)))
    ops.append(Operation("kv_a_proj", cat.ATTN_PROJ, GemmShape(tokens, h, rank + rope, **gemm)))
    ops += rms_norm("kv_a_layernorm", tokens, rank, code, residual=False)
    ops += eager.rotary("q_rotary", tokens, heads, rope, code) + eager.rotary("k_rotary", tokens, 1, rope, code)
    return ops


def _mla_hf_core(model: ModelCard, dep: MixerDeployment, ctx: StageContext, heads: int, tokens: int, code: str,
                 window: int) -> list[Operation]:
    """HF's MLA from the cache on: the latents (not K and V) cached by concatenation, then every step
    kv_b_proj expands the whole cached latent into per-head keys and values (decompressed,
    ModelCode.mla), the keys assembled by two copies, and MHA over them (o_proj follows)."""
    tp = dep.attention.tp
    gemm = projection_formats(dep.precision)
    qk, v = model.qk_head_dim, model.v_head_dim
    nope, rope, rank = model.qk_nope_head_dim, model.qk_rope_head_dim, model.kv_lora_rank
    ops = _kv_cache_operations(dep, ctx, rank + rope, 1, 1, rank + rope, code)
    if code == eager.EAGER:
        ops.append(Operation("q_cat", cat.ELEMENTWISE, elementwise_shape("cat", "bf16", tokens * heads * qk,
                                                                         "query = cat(q_pass, q_rot)")))
    expanded = sum(s.group_count(tp) * s.kv_len for s in ctx.sequences_per_gpu)
    ops.append(Operation("kv_b_proj", cat.ATTN_PROJ, GemmShape(expanded, rank, heads * (nope + v), **gemm)))
    if code == eager.EAGER:
        ops += [Operation("k_nope_copy", cat.ELEMENTWISE, elementwise_shape(
                    "copy", "bf16", expanded * heads * nope, "keys assembled: k_nope copied in")),
                Operation("k_rope_copy", cat.ELEMENTWISE, elementwise_shape(
                    "copy", "bf16", expanded * heads * rope, "keys assembled: k_rot copied to every head"))]
    else:
        ops.append(Operation("key_assembly", cat.ELEMENTWISE, MemoryBoundShape(
            "Triton: keys assembled from k_nope and k_rot", 2 * expanded * heads * qk * ACT_BYTES)))
    return ops + _core_shapes(model, dep, ctx, heads, window)


def kv_elements_per_token_per_layer(model: ModelCard, attention_tp: int) -> int:
    """KV-cache elements one token stores in one (full or sliding) attention layer on one GPU of
    the attention TP group (DSA index keys are extra: see kv_bytes_per_token_per_layer)."""
    if model.is_mla:
        return model.kv_lora_rank + model.qk_rope_head_dim  # latent is replicated on every TP rank
    return 2 * heads_per_rank(model.num_key_value_heads, attention_tp) * model.head_dim


def kv_bytes_per_token_per_layer(model: ModelCard, kv_dtype: str, attention_tp: int) -> float:
    """Cache bytes one token stores in one attention layer on one GPU: K/V (or the MLA latent) in
    the KV format, plus the DSA index key (fp8 + fp32 scale, replicated on every TP rank)."""
    kv = kv_elements_per_token_per_layer(model, attention_tp) * dtype_bytes(kv_dtype)
    if model.is_sparse_attention:
        kv += model.index_head_dim * dtype_bytes(INDEX_KEY_DTYPE) + INDEX_KEY_SCALE_BYTES
    return kv


def attention_weight_params(model: ModelCard, attention_tp: int) -> float:
    """Attention parameters of one layer held by one GPU of the attention TP group."""
    h = model.hidden_size
    heads = model.num_attention_heads // attention_tp
    if model.is_mla:
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        q = (h * model.q_lora_rank + model.q_lora_rank * heads * model.qk_head_dim) if model.q_lora_rank \
            else h * heads * model.qk_head_dim
        kv = h * latent + model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
        params = q + kv + heads * model.v_head_dim * h
        if model.is_sparse_attention:  # indexer: wq_b, wk, head weights, key LayerNorm (replicated)
            nh, d = model.index_n_heads, model.index_head_dim
            params += model.q_lora_rank * nh * d + h * d + h * nh + 2 * d
        return params
    kv_heads = heads_per_rank(model.num_key_value_heads, attention_tp)
    d = model.head_dim
    q_heads = heads * 2 if model.attention_output_gate else heads
    params = h * (q_heads + 2 * kv_heads) * d + heads * d * h
    if model.attention_bias:
        params += (heads + 2 * kv_heads) * d + h
    return params
