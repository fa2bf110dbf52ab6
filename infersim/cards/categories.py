"""The names a step is described in: the module categories every time is reported under, and the
operations a step plan holds.

A vocabulary shared from the bottom of the package up: engine cards name operations
(fused_operations, checked on load), the modules build operations under these names, the stage
engine and the report group times by category, trace comparison maps kernels onto them.
"""

from __future__ import annotations

ATTN_CORE = "attn_core"  # softmax(QK^T)V kernels (FlashAttention, FlashInfer, FlashMLA, ...)
ATTN_PROJ = "attn_proj"  # QKV / O projections, MLA down/up projections
MOE_EXPERTS = "moe_experts"  # routed-expert grouped GEMMs
SHARED_EXPERT = "shared_expert"  # always-active shared experts
DENSE_FFN = "dense_ffn"  # dense MLP (dense models, dense layers of MoE models)
ROUTER = "router"  # gate GEMM, top-k, routing bookkeeping
DISPATCH = "dispatch"  # EP token dispatch (all-to-all / DeepEP)
COMBINE = "combine"  # EP token combine
ALL_REDUCE = "all_reduce"  # TP all-reduce
DP_GATHER = "dp_gather"  # DP-attention all-gather / reduce-scatter around a TP FFN
PP_SEND = "pp_send"  # pipeline-parallel activation transfer
ELEMENTWISE = "elementwise"  # norms, rotary, activation, KV-cache store, quant casts
EMBEDDING = "embedding"
LM_HEAD = "lm_head"  # final norm + LM-head GEMM (+ sampling)
OVERHEAD = "overhead"  # scheduler / framework time per step
DRAFT = "draft"  # speculative decoding: the drafter's steps (draft model or MTP layers), all kernels
WEIGHT_OFFLOAD = "weight_offload"  # offloaded weights' host-to-device copies that compute does not hide

ALL = (
    ATTN_CORE, ATTN_PROJ, MOE_EXPERTS, SHARED_EXPERT, DENSE_FFN, ROUTER, DISPATCH, COMBINE,
    ALL_REDUCE, DP_GATHER, PP_SEND, ELEMENTWISE, EMBEDDING, LM_HEAD, OVERHEAD, DRAFT, WEIGHT_OFFLOAD,
)
COMMUNICATION = frozenset({DISPATCH, COMBINE, ALL_REDUCE, DP_GATHER, PP_SEND})

#: every operation name a step plan holds (engine cards name them in fused_operations); the attention
#: kernels of a second, third ... sequence group in one step carry the suffix _1, _2, ...
OPERATION_NAMES = frozenset({
    # every layer
    "input_norm", "post_attn_norm",
    # softmax attention (MHA/GQA and MLA, with DSA's indexer)
    "qkv_proj", "q_proj", "qkv_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "q_absorb", "v_absorb", "o_proj",
    "qk_norm", "rope_kv_store", "mla_norms_rope_kv_store", "attn_core", "attn_output_gate",
    "indexer_q_proj", "indexer_k_weights_proj", "indexer_rope_quant_store", "indexer_logits", "indexer_topk",
    # linear attention (Gated DeltaNet: gdn_*, Mamba-2: mamba_*)
    *(f"{kind}_{part}" for kind in ("gdn", "mamba") for part in (
        "in_proj", "conv1d", "intra_chunk", "state", "output", "recurrent", "gated_norm", "out_proj")),
    # FFN and MoE
    *(f"{prefix}_{part}" for prefix in ("ffn", "shared_expert") for part in ("up_proj", "activation", "down_proj")),
    "router_gate", "router_topk", "dispatch", "experts_up", "experts_activation", "experts_down", "combine",
    # communication
    "attn_all_reduce", "attn_all_gather", "attn_reduce_scatter", "dp_all_gather", "dp_reduce_scatter",
    "ffn_all_reduce", "moe_all_reduce", "pp_send",
    # per step
    "embedding", "final_norm", "lm_head", "lm_head_gather", "logits_all_gather", "logits_scatter",
    "mtp_norms", "mtp_eh_proj", "scheduler", "weight_offload",
})


def is_operation_name(name: str) -> bool:
    """Whether a step plan can hold an operation of this name (a group suffix _N allowed)."""
    base, _, tail = name.rpartition("_")
    return name in OPERATION_NAMES or (tail.isdigit() and tail.isascii() and base in OPERATION_NAMES)
