"""FFN operations of one layer on one GPU: dense MLP (a one-expert MoE), routed experts, shared
experts, and the communication that brings tokens to them and back.

Token bookkeeping: every GPU owns `tokens_per_gpu` distinct tokens. Attention TP replicates the
group's tokens on every rank of the group. MoE with an all-to-all style (NCCL all-to-all, DeepEP)
sends each token's top-k copies to the GPUs holding those experts and back; with "all-gather"
every GPU of the FFN group sees all the group's tokens and computes its own experts for them.

Expert load is uneven (`deployment.moe`, infersim.modules.load_balance): the layer waits for the
most loaded EP rank, so the routed-expert operations and the token exchange are sized for that
rank (its tokens, its distinct activated experts), not the mean one.
"""

from __future__ import annotations

from infersim.cards.model import ModelCard
from infersim.cards.deployment import Deployment, FfnDeployment, dense_ffn_tp
from infersim.shapes.comm_shapes import CollectiveShape, TokenExchangeShape
from infersim.shapes.kernels import GemmShape, GroupedGemmShape, MemoryBoundShape
from infersim.cards.engine import elementwise_code
from infersim.cards import categories as cat
from infersim.modules import eager
from infersim.modules.eager import rms_norm
from infersim.modules.load_balance import MoeBalance, moe_balance
from infersim.shapes.plan import FfnContext, Operation, StageContext
from infersim.base.sharding import shard
from infersim.base.units import ACT_BYTES

# bytes of fp32 scale per fp8 value when activations are quantized in groups of 128 (4 / 128)
FP8_GROUP_SCALE_BYTES = 4.0 / 128
# bytes of scale per NVFP4 value: one e4m3 scale per block of 16 values (1 / 16)
NVFP4_SCALE_BYTES = 1.0 / 16

# The FFN builders are given the part of the deployment and of the stage context they are built
# from (FfnDeployment, FfnContext: a plan piece is kept on them); the helpers that memory
# accounting and the report share with them take the whole deployment and context as well.
AnyFfnDeployment = Deployment | FfnDeployment
AnyFfnContext = StageContext | FfnContext

def _ranks_per_node(ranks: int, ctx: AnyFfnContext) -> int:
    """Groups are packed onto as few nodes as possible (TP/EP groups fill a node first)."""
    return min(ranks, ctx.gpus_per_node)


def _collective(name: str, module: str, kind: str, size: float, ranks: int, ctx: AnyFfnContext,
                implementation: str = "nccl") -> Operation:
    return Operation(name, module, CollectiveShape(kind, size, ranks, _ranks_per_node(ranks, ctx), implementation))


def expected_active_experts(local_experts: int, num_experts: int, topk: int, tokens: float) -> float:
    """Expected distinct local experts hit when `tokens` tokens each pick topk of num_experts
    uniformly: each expert is missed by one token with probability 1 - topk/num_experts."""
    miss = (1.0 - topk / num_experts) ** tokens
    return local_experts * (1.0 - miss)


def _mlp(prefix: str, module: str, tokens: int, hidden: int, width: int, gated: bool, dep: FfnDeployment,
         code: str = eager.FUSED) -> list[Operation]:
    gemm = dict(dtype=dep.precision.gemm, weight_dtype=dep.precision.weight_dtype)
    up = width * (2 if gated else 1)
    if gated and dep.model_code.projections == "separate":  # HF: gate_proj and up_proj, two nn.Linear
        projections = [Operation(f"{prefix}_gate_proj", module, GemmShape(tokens, hidden, width, **gemm)),
                       Operation(f"{prefix}_up_proj", module, GemmShape(tokens, hidden, width, **gemm))]
    else:
        projections = [Operation(f"{prefix}_up_proj", module, GemmShape(tokens, hidden, up, **gemm))]
    return projections + eager.mlp_activation(f"{prefix}_activation", tokens, width, gated, code) + [
        Operation(f"{prefix}_down_proj", module, GemmShape(tokens, width, hidden, **gemm))]


def attention_output_collective(model: ModelCard, dep: FfnDeployment, ctx: FfnContext, moe_layer: bool) -> list[Operation]:
    """Communication right after attention's O projection."""
    tp = dep.attention.tp
    if tp == 1:
        return []
    size = ctx.tokens_per_gpu * tp * model.hidden_size * ACT_BYTES
    if moe_layer and dep.moe_comm != "all-gather":
        # each rank keeps only its own tokens for dispatch: reduce-scatter instead of all-reduce
        return [_collective("attn_reduce_scatter", cat.ALL_REDUCE, "reduce_scatter", size, tp, ctx)]
    return [_collective("attn_all_reduce", cat.ALL_REDUCE, "all_reduce", size, tp, ctx)]


def dense_ffn_operations(model: ModelCard, dep: FfnDeployment, ctx: FfnContext) -> list[Operation]:
    ffn_tp, attn_tp = dense_ffn_tp(dep), dep.attention.tp
    h = model.hidden_size
    tokens = ctx.tokens_per_gpu * ffn_tp
    width = shard(model.intermediate_size, ffn_tp, "intermediate_size", "ffn.tp")
    size = tokens * h * ACT_BYTES
    code = elementwise_code(dep.model_code, ctx.stage)
    ops: list[Operation] = rms_norm("post_attn_norm", ctx.tokens_per_gpu * attn_tp, h, code)
    if ffn_tp > attn_tp:
        ops.append(_collective("dp_all_gather", cat.DP_GATHER, "all_gather", size, ffn_tp, ctx))
    ops += _mlp("ffn", cat.DENSE_FFN, tokens, h, width, model.gated_ffn, dep, code)
    if ffn_tp > attn_tp:
        ops.append(_collective("dp_reduce_scatter", cat.DP_GATHER, "reduce_scatter", size, ffn_tp, ctx))
    elif ffn_tp > 1:
        ops.append(_collective("ffn_all_reduce", cat.ALL_REDUCE, "all_reduce", size, ffn_tp, ctx))
    return ops


def routing_domain(dep: AnyFfnDeployment, ctx: AnyFfnContext) -> float:
    """Tokens routed over the EP group of one GPU in one (micro-)batch."""
    if dep.moe_comm == "all-gather":
        return ctx.expert_tokens * dep.ffn.tp * dep.ffn.ep
    return ctx.expert_tokens * dep.ffn.ep


def stage_moe_balance(model: ModelCard, dep: AnyFfnDeployment, ctx: AnyFfnContext) -> MoeBalance:
    """The expert-load balance of one MoE layer of this stage (deployment.moe)."""
    spec = dep.moe
    return moe_balance(spec.load_balance, model.num_experts, model.num_experts_per_tok, dep.ffn.ep,
                       routing_domain(dep, ctx) / dep.ffn.ep, ctx.sequence_length, spec.redundant_experts,
                       spec.routing_skew, spec.dataset_skew)


def shared_expert_shards(dep: AnyFfnDeployment) -> int:
    """GPUs one shared expert is split over. All-to-all paths leave every rank its own tokens, so
    each holds the whole shared expert. Under all-gather it is split either over the whole FFN
    group (sharded, SGLang) or over the attention-TP group only (replicated over attention-DP
    ranks: TensorRT-LLM, vLLM)."""
    if dep.moe_comm != "all-gather":
        return 1
    return dep.ffn.tp * dep.ffn.ep if dep.shared_experts == "sharded" else dep.attention.tp


def shared_expert_split(dep: AnyFfnDeployment, gathered_tokens: float, own_tokens: float) -> tuple[int, float]:
    """(shared_expert_shards, tokens each GPU runs the shared expert on): a sharded expert runs on
    every gathered token; a replicated one on its attention-TP group's tokens, which that group
    holds whole after attention's all-reduce; on all-to-all paths on the rank's own tokens."""
    shards = shared_expert_shards(dep)
    if dep.moe_comm != "all-gather":
        return shards, own_tokens
    return shards, gathered_tokens if dep.shared_experts == "sharded" else own_tokens * dep.attention.tp


def moe_operations(model: ModelCard, dep: FfnDeployment, ctx: FfnContext) -> list[Operation]:
    ffn, attn_tp = dep.ffn, dep.attention.tp
    h, E, k = model.hidden_size, model.num_experts, model.num_experts_per_tok
    prec = dep.precision
    width = shard(model.moe_intermediate_size, ffn.tp, "moe_intermediate_size", "ffn.tp")
    slots = E + dep.moe.redundant_experts
    shard(slots, ffn.ep, "expert slots (experts + deployment.moe.redundant_experts)", "ffn.ep")
    balance = stage_moe_balance(model, dep, ctx)
    load = balance.token_factor
    T = ctx.tokens_per_gpu
    code = elementwise_code(dep.model_code, ctx.stage)
    ops: list[Operation] = rms_norm("post_attn_norm", T * attn_tp, h, code)
    group = ffn.tp * ffn.ep
    if dep.moe_comm == "all-gather":
        # every rank of the FFN group holds all of its tokens: the ranks' real tokens, whose mean is
        # below the busiest rank's when attention-DP ranks hold unequal work (a serving step)
        tokens_seen = ctx.expert_tokens * group
        table_tokens = tokens_seen / ffn.ep
        shared_shards, shared_tokens = shared_expert_split(dep, tokens_seen, T)
        if group > attn_tp:
            ops.append(_collective("dp_all_gather", cat.DP_GATHER, "all_gather", tokens_seen * h * ACT_BYTES, group, ctx))
    else:  # all-to-all: each rank's experts get the mean of the EP group's tokens, however unequal
        tokens_seen = T  # the ranks' attention outputs (router, shared experts, send buffers)
        table_tokens = ctx.expert_tokens
        shared_shards, shared_tokens = shared_expert_split(dep, tokens_seen, T)
    ops.append(Operation("router_gate", cat.ROUTER, GemmShape(tokens_seen, h, E, "bf16", "bf16")))
    if code != eager.FUSED:  # HF's MoE block: router post-processing and permutation as their own kernels
        if code == eager.EAGER:
            before, between, after = eager.moe_routing_eager(table_tokens * load, E, k, h, width, model.gated_ffn,
                                                             model.n_group)
        else:
            before, between, after = eager.moe_routing_fused(table_tokens * load, E, k, h, width, model.gated_ffn)
    else:
        before = [Operation("router_topk", cat.ROUTER,
                            MemoryBoundShape("top-k, routing metadata", tokens_seen * E * 4.0, kernels=2))]
        between = after = []
    ops += before
    if dep.moe_comm != "all-gather":
        impl = "nccl" if dep.moe_comm == "all-to-all" else dep.moe_comm
        token_bytes = h * ACT_BYTES
        if prec.expert_gemm_dtype == "fp8":  # DeepEP/SGLang dispatch fp8 when expert GEMMs are fp8
            # DeepEP's fp8 dispatch carries one fp32 scale per 128 values beside the fp8 hidden state
            # (its x_scales; SGLang quantizes in groups of 128 before a DeepEP dispatch)
            token_bytes = h * (1.0 + (FP8_GROUP_SCALE_BYTES if impl.startswith("deepep") else 0.0))
        elif prec.expert_gemm_dtype == "fp4":
            # NVFP4 experts take NVFP4 tokens: quantized before the exchange (TensorRT-LLM's NVFP4
            # all-to-all; SGLang's DeepEP low-latency path with SGLANG_CUTEDSL_MOE_NVFP4_DISPATCH), half a
            # byte per value and one e4m3 scale per 16 values
            token_bytes = h * (0.5 + NVFP4_SCALE_BYTES)
        ops.append(Operation("dispatch", cat.DISPATCH, TokenExchangeShape(
            "dispatch", T, token_bytes, E, k, ffn.ep, _ranks_per_node(ffn.ep, ctx), impl, load,
            model.n_group, model.topk_group)))
    # the most loaded EP rank: its routed tokens and its distinct activated experts
    grouped = dict(stage=ctx.stage, num_experts=E, ep=ffn.ep, topk=k, hidden=h, intermediate=width,
                   tokens_per_gpu=table_tokens * load, active_experts=balance.active_experts, gated=model.gated_ffn,
                   dtype=prec.expert_gemm_dtype, weight_dtype=prec.expert_weight_dtype, load_factor=load,
                   balanced_active_experts=balance.mean_active_experts,
                   expert_slots=slots if slots != E else 0)
    routed = table_tokens * load * k
    up = width * (2 if model.gated_ffn else 1)
    if code == eager.FUSED:
        between = [Operation("experts_activation", cat.ELEMENTWISE, MemoryBoundShape(
            "permute, SwiGLU, unpermute", routed * (up + width + 2 * h) * ACT_BYTES, kernels=3))]
    ops += [Operation("experts_up", cat.MOE_EXPERTS, GroupedGemmShape(projection="up", **grouped))] + between + [
        Operation("experts_down", cat.MOE_EXPERTS, GroupedGemmShape(projection="down", **grouped))] + after
    if model.num_shared_experts:
        shared_width = shard(model.shared_width, shared_shards, "shared expert width", "the FFN group size")
        ops += _mlp("shared_expert", cat.SHARED_EXPERT, shared_tokens, h, shared_width, model.gated_ffn, dep, code)
    if dep.moe_comm == "all-gather":
        size = tokens_seen * h * ACT_BYTES
        if group > attn_tp:
            ops.append(_collective("dp_reduce_scatter", cat.DP_GATHER, "reduce_scatter", size, group, ctx))
        elif group > 1:
            ops.append(_collective("moe_all_reduce", cat.ALL_REDUCE, "all_reduce", size, group, ctx))
    else:
        impl = "nccl" if dep.moe_comm == "all-to-all" else dep.moe_comm
        ops.append(Operation("combine", cat.COMBINE, TokenExchangeShape(
            "combine", T, h * ACT_BYTES, E, k, ffn.ep, _ranks_per_node(ffn.ep, ctx), impl, load,
            model.n_group, model.topk_group)))
        if attn_tp > 1:
            ops.append(_collective("attn_all_gather", cat.ALL_REDUCE, "all_gather", T * attn_tp * h * ACT_BYTES, attn_tp, ctx))
    return ops


def ffn_weight_params(model: ModelCard, dep: Deployment) -> tuple[float, float]:
    """(dense-layer FFN params, MoE-layer FFN params) of one layer held by one GPU."""
    h = model.hidden_size
    mats = model.ffn_matrices
    dense_tp = dense_ffn_tp(dep)
    dense = mats * h * model.intermediate_size / dense_tp if model.intermediate_size else 0.0
    if model.mlp_bias and model.intermediate_size:
        dense += (model.intermediate_size * (mats - 1)) / dense_tp + h
    if not model.is_moe:
        return dense, 0.0
    routed = routed_expert_params(model, dep)
    shared = mats * h * model.shared_width / shared_expert_shards(dep)
    router = h * model.num_experts
    return dense, routed + shared + router


def routed_expert_params(model: ModelCard, dep: Deployment) -> float:
    """Routed-expert parameters of one MoE layer held by one GPU (part of ffn_weight_params' MoE
    figure; stored in precision.expert_weights). Redundant experts (EPLB replicas) are slots too."""
    slots = model.num_experts + dep.moe.redundant_experts
    return slots / dep.ffn.ep * model.ffn_matrices * model.hidden_size * model.moe_intermediate_size / dep.ffn.tp
