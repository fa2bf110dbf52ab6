"""The module categories every time is reported under; trace comparison maps kernels onto them."""

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
