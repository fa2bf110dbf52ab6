"""The kernels a layer's elementwise work becomes, by the engine's model code (ModelCode.elementwise).

Serving engines (`fused`) run one fused kernel per elementwise step: add + RMSNorm, RoPE + KV write,
SwiGLU. HuggingFace transformers' modeling code run eagerly (`pytorch-eager`) launches one ATen
kernel per tensor operation, as written in transformers 5.17 (models/llama/modeling_llama.py and
the same code copied into every family, integrations/moe.py, cache_utils.py); run through
torch.compile (`inductor`) the same code becomes Inductor's Triton fusions. Each builder here
returns the Operations one of those variants launches, so the engine walks (and counts, for the
host's launch cost) exactly the kernels the model code launches:

  RMSNorm, eager (LlamaRMSNorm.forward): to(float32), pow(2), mean(-1), + eps, rsqrt, x * rsqrt,
      to(bf16), weight * x: 8 kernels, the big ones streaming fp32 (36 bytes per element against a
      fused kernel's 4)
  residual add: its own kernel after each sublayer (LlamaDecoderLayer.forward)
  rotary, eager (apply_rotary_pos_emb, rotate_half) per q and per k: q * cos, -x2, cat(-x2, x1),
      rotated * sin, sum: 5 kernels
  KV cache: concat (DynamicLayer.update: torch.cat of the whole cache and the new tokens, for K and
      V, every step); static (StaticLayer.update: index_copy_ of the new tokens)
  MLP activation, eager: act_fn(gate) and * up: 2 kernels (gate and up are separate GEMMs)
  MoE block, eager (the router, then grouped_mm_experts_forward, transformers' default experts
      implementation): softmax, topk, sum and div of the router; sort of the expert ids, perm // top_k,
      two gathers, a cast, histc, cumsum, the sentinel mask and clamp, three masked fills, SiLU and
      mul, the routing-weight product, arange + index_put for the inverse permutation, a gather and
      the top-k sum: 24 small kernels around the two grouped GEMMs
  inductor (torch.compile of the decode forward; kernels counted in Inductor's generated code for a
      Llama layer on the CPU backend, benchmarks/gpu/count_eager_ops.py --compiled): residual add +
      RMSNorm 1 kernel (x2), q rotary 1, k rotary + K cache write 1, V cache write + mask + the GQA
      key/value materialisation 1, SiLU * up 1: 6 fused kernels per dense layer

Byte counts follow infersim.shapes.kernels.ELEMENTWISE_OPS (what each kernel reads and writes), so measured
elementwise tables (`mfu bench`) answer the eager kernels by (op, dtype, bytes); the fused and
Inductor kernels are priced by the roofline.
"""

from __future__ import annotations

from infersim.shapes.kernels import MemoryBoundShape, elementwise_shape
from infersim.cards import categories as cat
from infersim.shapes.plan import Operation
from infersim.base.units import ACT_BYTES

FUSED, EAGER, INDUCTOR = "fused", "pytorch-eager", "inductor"


def _op(name: str, op: str, dtype: str, elements: float, what: str = "", module: str = cat.ELEMENTWISE) -> Operation:
    return Operation(name, module, elementwise_shape(op, dtype, elements, what))


def rms_norm(name: str, rows: float, width: int, code: str, residual: bool = True,
             module: str = cat.ELEMENTWISE) -> list[Operation]:
    """An RMSNorm over `rows` rows of `width`, with the residual add before it (the previous sublayer's
    output added to the stream) when `residual`."""
    n = rows * width
    if code == EAGER:
        ops = [_op(f"{name}_residual_add", "add", "bf16", n, "residual add", module)] if residual else []
        return ops + [
            _op(f"{name}_to_fp32", "to_fp32", "bf16", n, "RMSNorm: hidden_states.to(float32)", module),
            _op(f"{name}_pow", "pow", "fp32", n, "RMSNorm: x.pow(2)", module),
            _op(f"{name}_mean", "mean", "fp32", n, "RMSNorm: mean(-1)", module),
            _op(f"{name}_eps", "add_scalar", "fp32", rows, "RMSNorm: variance + eps", module),
            _op(f"{name}_rsqrt", "rsqrt", "fp32", rows, "RMSNorm: rsqrt", module),
            _op(f"{name}_scale", "mul_broadcast", "fp32", n, "RMSNorm: x * rsqrt(variance)", module),
            _op(f"{name}_to_bf16", "to_bf16", "fp32", n, "RMSNorm: .to(bf16)", module),
            _op(f"{name}_weight", "mul_broadcast", "bf16", n, "RMSNorm: weight * x", module),
        ]
    what = "fused add + RMSNorm" if residual else "RMSNorm"
    if code == INDUCTOR:
        what = f"Triton: {'residual add + ' if residual else ''}RMSNorm (one reduction kernel)"
    return [Operation(name, module, MemoryBoundShape(what, (4 if residual else 2) * n * ACT_BYTES))]


def rotary(name: str, tokens: float, heads: int, head_dim: int, code: str) -> list[Operation]:
    """Rotary embedding of one of q or k (tokens x heads x head_dim), eager: 5 kernels."""
    n = tokens * heads * head_dim
    if code == EAGER:
        return [
            _op(f"{name}_cos", "mul_broadcast", "bf16", n, "rotary: x * cos"),
            _op(f"{name}_neg", "neg", "bf16", n / 2, "rotary: rotate_half's -x2"),
            _op(f"{name}_rotate_half", "cat", "bf16", n, "rotary: rotate_half's cat(-x2, x1)"),
            _op(f"{name}_sin", "mul_broadcast", "bf16", n, "rotary: rotate_half(x) * sin"),
            _op(f"{name}_sum", "add", "bf16", n, "rotary: the two products summed"),
        ]
    return [Operation(name, cat.ELEMENTWISE, MemoryBoundShape("Triton: rotary", 2 * n * ACT_BYTES))]


def kv_cache_update(kv_cache: str, new_elements: float, cached_elements: float) -> list[Operation]:
    """Writing one layer's new K and V (new_elements each) into a cache that then holds cached_elements
    each: DynamicCache's torch.cat rewrites the whole cache (K and V), StaticCache's index_copy_ writes
    the new tokens only."""
    if kv_cache == "concat":
        return [_op("kv_cache_cat_k", "cat", "bf16", cached_elements, "DynamicCache: torch.cat of the cache and the "
                                                                      "new keys (the whole cache copied)"),
                _op("kv_cache_cat_v", "cat", "bf16", cached_elements, "DynamicCache: torch.cat of the cache and the "
                                                                      "new values")]
    return [_op("kv_cache_copy_k", "copy", "bf16", new_elements, "StaticCache: index_copy_ of the new keys"),
            _op("kv_cache_copy_v", "copy", "bf16", new_elements, "StaticCache: index_copy_ of the new values")]


def static_cache_fused(tokens: float, heads: int, kv_heads: int, head_dim: int, batch: float, capacity: float
                       ) -> list[Operation]:
    """Inductor's kernels for the KV write of a static cache: the K cache write rides on k's rotary
    kernel (counted there); the V write, the attention mask and, for GQA, repeat_kv's copy of the whole
    allocated K and V cache to every query head are one fused kernel (SDPA gets a mask under
    torch.compile, and HF's SDPA path passes enable_gqa only without one)."""
    new = tokens * kv_heads * head_dim * ACT_BYTES
    moved = new + batch * capacity  # V write, the boolean mask
    what = "Triton: V cache write, attention mask"
    if heads != kv_heads:
        cache = batch * kv_heads * capacity * head_dim * ACT_BYTES
        moved += 2 * cache + 2 * cache * heads / kv_heads  # read K and V, write them per query head
        what += ", K and V repeated to every query head (repeat_kv)"
    return [Operation("kv_write_mask_gqa", cat.ELEMENTWISE, MemoryBoundShape(what, moved))]


def mlp_activation(name: str, tokens: float, width: int, gated: bool, code: str,
                   module: str = cat.ELEMENTWISE) -> list[Operation]:
    """SiLU(gate) * up over tokens x width (gated), or the activation alone."""
    n = tokens * width
    if code == EAGER:
        ops = [_op(f"{name}_silu", "silu", "bf16", n, "act_fn(gate)", module)]
        return ops + ([_op(f"{name}_mul", "mul", "bf16", n, "act_fn(gate) * up", module)] if gated else [])
    what = ("Triton: " if code == INDUCTOR else "") + ("SwiGLU" if gated else "activation")
    return [Operation(name, module, MemoryBoundShape(what, n * (3 if gated else 2) * ACT_BYTES))]


def moe_routing_eager(tokens: float, experts: int, topk: int, hidden: int, intermediate: int,
                      gated: bool, expert_groups: int = 1) -> tuple[list[Operation], list[Operation], list[Operation]]:
    """The eager kernels of transformers' MoE block around its grouped GEMMs, as three lists: before the
    up projection (router and permutation), between the projections (masks, activation), after the
    down projection (weights, inverse permutation, top-k sum). Small tensors (routing ids, the
    expert histogram) cost their launch; the gathers and masked fills stream the routed rows.
    Group-limited routing (expert_groups > 1, DeepseekV3TopkRouter / DeepseekV3MoE.route_tokens_to_experts)
    scores in fp32 with a sigmoid and picks groups first: 12 more kernels."""
    routed = tokens * topk
    up_width = intermediate * (2 if gated else 1)
    r = cat.ROUTER
    scores = tokens * experts
    grouped = [
        _op("router_input_fp32", "to_fp32", "bf16", tokens * hidden, "router: hidden_states.type(float32)", r),
        _op("router_sigmoid", "sigmoid", "fp32", scores, "router: sigmoid scores", r),
        _op("router_bias", "add", "fp32", scores, "router: + e_score_correction_bias", r),
        _op("router_group_top2", "topk", "fp32", scores, "router: top-2 per group", r),
        _op("router_group_sum", "sum", "fp32", tokens * expert_groups * 2, "router: group scores", r),
        _op("router_group_topk", "topk", "fp32", tokens * expert_groups, "router: top groups", r),
        _op("router_group_mask", "fill", "fp32", tokens * expert_groups, "router: zeros_like group mask", r),
        _op("router_group_scatter", "scatter", "fp32", tokens * expert_groups, "router: scatter_ of chosen groups", r),
        _op("router_score_mask", "masked_fill", "fp32", scores, "router: masked_fill outside the groups", r),
        _op("router_gather", "gather", "fp32", routed, "router: gather of the chosen scores", r),
        _op("router_eps", "add_scalar", "fp32", routed, "router: denominator + 1e-20", r),
        _op("router_scale", "mul_broadcast", "fp32", routed, "router: x routed_scaling_factor", r),
    ] if expert_groups > 1 else []
    before = grouped + [
        _op("router_softmax", "softmax", "fp32", tokens * experts, "router: softmax over experts (fp32)", r),
        _op("router_topk", "topk", "fp32", tokens * experts, "router: topk", r),
        _op("router_norm_sum", "sum", "fp32", routed, "router: top-k weights summed", r),
        _op("router_norm_div", "mul_broadcast", "fp32", routed, "router: top-k weights normalised", r),
        _op("experts_sort", "sort", "int64", routed, "experts: sort of the expert ids", r),
        _op("experts_token_index", "add_scalar", "int64", routed, "experts: perm // top_k", r),
        _op("experts_gather_tokens", "gather", "bf16", routed * hidden, "experts: hidden_states[perm // top_k]", r),
        _op("experts_gather_weights", "gather", "fp32", routed, "experts: routing weights by perm", r),
        _op("experts_ids_int", "copy", "int64", routed, "experts: expert ids to int32 for histc", r),
        _op("experts_histc", "histc", "int32", routed, "experts: tokens per expert (histc)", r),
        _op("experts_cumsum", "cumsum", "int32", experts, "experts: offsets (cumsum)", r),
        _op("experts_sentinel", "add_scalar", "int64", routed, "experts: sentinel mask (ids >= experts)", r),
        _op("experts_clamp", "add_scalar", "int64", routed, "experts: clamp_ of the ids", r),
        _op("experts_premask", "masked_fill", "bf16", routed * hidden, "experts: masked_fill_ of the inputs", r),
    ]
    between = [_op("experts_mask_up", "masked_fill", "bf16", routed * up_width, "experts: masked_fill of the up "
                                                                                 "projection's rows")]
    between += mlp_activation("experts_activation", routed, intermediate, gated, EAGER)
    after = [
        _op("experts_mask_down", "masked_fill", "bf16", routed * hidden, "experts: masked_fill of the down "
                                                                         "projection's rows"),
        _op("experts_weigh", "mul_broadcast", "bf16", routed * hidden, "experts: rows x routing weights"),
        _op("experts_arange", "fill", "int64", routed, "experts: arange for the inverse permutation", r),
        _op("experts_inverse_perm", "scatter", "int64", routed, "experts: inv_perm[perm] = arange", r),
        _op("experts_unpermute", "gather", "bf16", routed * hidden, "experts: rows back in token order"),
        _op("experts_topk_sum", "sum", "bf16", routed * hidden, "experts: top-k outputs summed per token"),
    ]
    return before, between, after


def moe_routing_fused(tokens: float, experts: int, topk: int, hidden: int, intermediate: int,
                      gated: bool) -> tuple[list[Operation], list[Operation], list[Operation]]:
    """Inductor's fusion of the same block: the router's post-processing, the permutation bookkeeping
    and the unpermute + top-k sum each become one Triton kernel beside the extern sort, histc and cumsum
    (an estimate until benchmarks/gpu/count_eager_ops.py --compiled counts it on a GPU)."""
    routed = tokens * topk
    up_width = intermediate * (2 if gated else 1)
    r = cat.ROUTER
    before = [
        Operation("router_softmax_topk", r, MemoryBoundShape("Triton: router softmax, top-k, normalisation",
                                                             tokens * experts * 4.0, kernels=2)),
        Operation("experts_permute", r, MemoryBoundShape("sort, histc, cumsum (extern) and the row gather",
                                                         routed * (8.0 * 3 + 2 * hidden * ACT_BYTES), kernels=4)),
    ]
    between = [Operation("experts_activation", cat.ELEMENTWISE, MemoryBoundShape(
        "Triton: masked fill, SwiGLU", routed * (up_width + intermediate) * ACT_BYTES))]
    after = [Operation("experts_unpermute", cat.ELEMENTWISE, MemoryBoundShape(
        "Triton: routing weights, unpermute, top-k sum", routed * hidden * 2 * ACT_BYTES, kernels=2))]
    return before, between, after


def step_eager(tokens: float, hidden: int, head_dim: int, logit_rows: float, code: str) -> list[Operation]:
    """Per-forward kernels outside the layers besides the embedding and LM head: the rotary cos/sin
    tables (LlamaRotaryEmbedding.forward: position ids cast, matmul, cat, cos, sin, scaling, casts: 11
    kernels), the padding-mask check of the causal-mask builder (sum, compare, and a host-device sync),
    the final RMSNorm over every token (HF normalises before keeping the last position's logits)."""
    if code == EAGER:
        table = tokens * head_dim
        ops = [Operation("rotary_tables", cat.ELEMENTWISE, MemoryBoundShape(
                   "rotary cos/sin tables: arange, add, casts, matmul, cat, cos, sin, scaling (eager)",
                   table * 4.0 * 8, kernels=11)),
               Operation("mask_check", cat.ELEMENTWISE, MemoryBoundShape(
                   "causal-mask builder: attention_mask.sum() == numel (and a host-device sync)", tokens * 8.0,
                   kernels=2))]
        return ops + rms_norm("final_norm", tokens, hidden, EAGER, residual=False, module=cat.LM_HEAD)
    if code == INDUCTOR:
        return [Operation("rotary_tables_mask", cat.ELEMENTWISE, MemoryBoundShape(
                    "Triton: rotary cos/sin tables and the attention mask", tokens * head_dim * 8.0))] + \
            rms_norm("final_norm", tokens, hidden, INDUCTOR, residual=False, module=cat.LM_HEAD)
    return [Operation("final_norm", cat.LM_HEAD, MemoryBoundShape("RMSNorm", 2 * logit_rows * hidden * ACT_BYTES))]
