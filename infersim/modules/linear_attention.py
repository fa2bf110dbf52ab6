"""Linear-attention and state-space mixers of one layer on one GPU: Gated DeltaNet
(`linear_attention` layers: Qwen3-Next, Qwen3.5) and Mamba-2 (`mamba` layers).

Both keep a constant-size recurrent state per request instead of a KV cache: GDN one
linear_key_head_dim x linear_value_head_dim matrix per value head, Mamba-2 one mamba_head_dim x
mamba_d_state matrix per head, both in `mamba_ssm_dtype`; plus the short convolution's last
(kernel - 1) inputs in bf16. Attention TP splits the heads (and GDN key heads / Mamba-2 groups)
over the TP group like attention heads.

A layer is: input norm, input projection, causal depthwise conv1d + SiLU, the mixer core
(prefill: chunked algorithm in three phases; decode: the recurrence, see LinearAttentionShape),
gated RMSNorm (output x SiLU(z)), output projection. Small elementwise work is left out: the
GDN decay/beta gating from a and b (a few bytes per head and token), q/k L2 norms (fused into the
chunk kernels), Mamba-2's D skip and dt softplus (fused). Qwen3-Next's zero-centred norms are
ordinary norms at this level.
"""

from __future__ import annotations

from infersim.cards.model import LINEAR_ATTENTION, MAMBA, ModelCard
from infersim.cards.deployment import MixerDeployment
from infersim.modules.attention import projection_formats
from infersim.shapes.kernels import GemmShape, LinearAttentionShape, MemoryBoundShape
from infersim.cards import categories as cat
from infersim.shapes.plan import Operation, StageContext
from infersim.base.sharding import heads_per_rank, shard
from infersim.base.units import ACT_BYTES, dtype_bytes

CONV_STATE_DTYPE = "bf16"  # the conv1d state keeps activations in their own format


def _gdn_dims(model: ModelCard, tp: int) -> tuple[int, int, int, int]:
    """(key heads, value heads, key dim, value dim) on one GPU of the attention TP group."""
    heads = shard(model.linear_num_value_heads, tp, "linear_num_value_heads", "attention.tp")
    key_heads = heads_per_rank(model.linear_num_key_heads, tp, "linear_num_key_heads")
    return key_heads, heads, model.linear_key_head_dim, model.linear_value_head_dim


def _mamba_dims(model: ModelCard, tp: int) -> tuple[int, int, int, int]:
    """(groups, heads, state size N, head dim P) on one GPU of the attention TP group."""
    heads = shard(model.mamba_heads, tp, "Mamba-2 heads", "attention.tp")
    groups = heads_per_rank(model.mamba_n_groups, tp, "mamba_n_groups")
    return groups, heads, model.mamba_d_state, model.mamba_head_dim


def conv_channels(model: ModelCard, kind: str, tp: int) -> int:
    """Channels of the short convolution on one GPU (GDN: q, k, v; Mamba-2: x, B, C)."""
    if kind == LINEAR_ATTENTION:
        key_heads, heads, dk, dv = _gdn_dims(model, tp)
        return 2 * key_heads * dk + heads * dv
    groups, heads, n, p = _mamba_dims(model, tp)
    return heads * p + 2 * groups * n


def _conv_kernel(model: ModelCard) -> int:
    return model.linear_conv_kernel_dim


def linear_mixer_operations(model: ModelCard, dep: MixerDeployment, ctx: StageContext, kind: str) -> list[Operation]:
    """Operations of one linear_attention (GDN) or mamba (Mamba-2) layer's mixer, no communication."""
    tp = dep.attention.tp
    tokens = ctx.tokens_per_gpu * tp
    h = model.hidden_size
    gemm = projection_formats(dep.precision)
    state_dtype = model.mamba_ssm_dtype
    if kind == LINEAR_ATTENTION:
        prefix, shape_kind = "gdn", "gdn"
        key_heads, heads, dk, dv = _gdn_dims(model, tp)
        in_width = 2 * key_heads * dk + 2 * heads * dv + 2 * heads  # q, k, v, z (output gate), b (beta), a (decay)
        inner = heads * dv
        chunk = model.linear_chunk_size
    elif kind == MAMBA:
        prefix, shape_kind = "mamba", "mamba2"
        key_heads, heads, dk, p = _mamba_dims(model, tp)  # key_heads = B/C groups, dk = state size N
        dv = p
        inner = heads * p
        in_width = 2 * inner + 2 * key_heads * dk + heads  # z, x, B, C, dt
        chunk = model.mamba_chunk_size
    else:
        raise ValueError(f"not a linear mixer: {kind}")  # a bug in the plan builder
    channels = conv_channels(model, kind, tp)
    width = _conv_kernel(model)
    sequences = sum(s.group_count(tp) for s in ctx.sequences_per_gpu)
    conv_state = sequences * (width - 1) * channels * dtype_bytes(CONV_STATE_DTYPE)
    ops: list[Operation] = [
        Operation("input_norm", cat.ELEMENTWISE, MemoryBoundShape("fused add + RMSNorm", 4 * tokens * h * ACT_BYTES)),
        Operation(f"{prefix}_in_proj", cat.ATTN_PROJ, GemmShape(tokens, h, in_width, **gemm)),
        Operation(f"{prefix}_conv1d", cat.ELEMENTWISE, MemoryBoundShape(
            "causal depthwise conv1d + SiLU, conv state read and written",
            2 * tokens * channels * ACT_BYTES + 2 * conv_state, flops_done=2.0 * width * channels * tokens)),
    ]
    for i, seqs in enumerate(ctx.sequences_per_gpu):
        suffix = "" if i == 0 else f"_{i}"
        stage = seqs.kernel_stage(ctx.stage)  # a mixed step's decode requests take the recurrent step
        phases = ("intra_chunk", "state", "output") if stage == "prefill" else ("recurrent",)
        for phase in phases:
            shape = LinearAttentionShape(shape_kind, stage, phase, seqs.group_count(tp), seqs.q_len, heads, key_heads,
                                         dk, dv, chunk=chunk, dtype=dep.precision.attention, state_dtype=state_dtype)
            ops.append(Operation(f"{prefix}_{phase}{suffix}", cat.ATTN_CORE, shape))
    ops += [
        Operation(f"{prefix}_gated_norm", cat.ELEMENTWISE, MemoryBoundShape(
            "gated RMSNorm: norm(o) x SiLU(z)", 3 * tokens * inner * ACT_BYTES)),
        Operation(f"{prefix}_out_proj", cat.ATTN_PROJ, GemmShape(tokens, inner, h, **gemm)),
    ]
    return ops


def state_bytes_per_request_per_layer(model: ModelCard, kind: str, attention_tp: int) -> float:
    """Recurrent state plus conv state one request keeps in one linear_attention / mamba layer on
    one GPU of the attention TP group (constant in the context length)."""
    if kind == LINEAR_ATTENTION:
        _, heads, dk, dv = _gdn_dims(model, attention_tp)
    else:
        _, heads, dk, dv = _mamba_dims(model, attention_tp)
    recurrent = heads * dk * dv * dtype_bytes(model.mamba_ssm_dtype)
    conv = (_conv_kernel(model) - 1) * conv_channels(model, kind, attention_tp) * dtype_bytes(CONV_STATE_DTYPE)
    return recurrent + conv


def linear_mixer_weight_params(model: ModelCard, kind: str, attention_tp: int) -> float:
    """Mixer parameters of one linear_attention / mamba layer held by one GPU of the attention TP group."""
    h = model.hidden_size
    width = _conv_kernel(model)
    channels = conv_channels(model, kind, attention_tp)
    if kind == LINEAR_ATTENTION:
        key_heads, heads, dk, dv = _gdn_dims(model, attention_tp)
        in_proj = h * (2 * key_heads * dk + 2 * heads * dv + 2 * heads)
        inner = heads * dv
        extra = 2 * heads + dv  # A_log, dt_bias; gated-norm weight (one head's width, shared)
    else:
        groups, heads, n, p = _mamba_dims(model, attention_tp)
        inner = heads * p
        in_proj = h * (2 * inner + 2 * groups * n + heads)
        extra = 3 * heads + inner  # A_log, D, dt_bias; gated-norm weight
    return in_proj + channels * width + inner * h + extra
