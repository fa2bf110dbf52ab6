"""Builds the StagePlan of a prefill or decode step from the model card and deployment."""

from __future__ import annotations

from infersim.cards.model import ModelCard
from infersim.config import Deployment, Workload
from infersim.errors import InferSimError
from infersim.kernels import CollectiveShape, GemmShape, MemoryBoundShape
from infersim.modules import categories as cat
from infersim.modules.attention import attention_operations
from infersim.modules.ffn import ACT_BYTES, attention_output_collective, dense_ffn_operations, moe_operations
from infersim.plan import LayerGroup, Operation, SequenceBatch, Stage, StageContext, StagePlan
from infersim.sharding import shard


def prefill_sequences(tokens: int, isl: int) -> tuple[SequenceBatch, ...]:
    """`tokens` prompt tokens as ISL-long sequences; a remainder is one shorter sequence."""
    full, rest = divmod(tokens, isl)
    seqs = []
    if full:
        seqs.append(SequenceBatch(full, isl, isl))
    if rest:
        seqs.append(SequenceBatch(1, rest, rest))
    return tuple(seqs)


def stage_context(stage: Stage, model: ModelCard, dep: Deployment, workload: Workload,
                  tokens_per_gpu: int, micro_batches: int) -> StageContext:
    per_micro = shard(tokens_per_gpu, micro_batches,
                      "prefill tokens per GPU" if stage == "prefill" else "decode batch per GPU",
                      "the two micro-batches of two-batch overlap")
    if stage == "prefill":
        seqs = prefill_sequences(per_micro, workload.isl)
    else:
        seqs = (SequenceBatch(per_micro, 1, max(1, round(workload.decode_context))),)
    return StageContext(stage, per_micro, seqs, dep.gpus_per_node)


def layer_groups(model: ModelCard, dep: Deployment, ctx: StageContext) -> tuple[LayerGroup, ...]:
    groups = []
    attention = attention_operations(model, dep, ctx)
    if model.num_dense_layers:
        ops = attention + attention_output_collective(model, dep, ctx, moe_layer=False) + dense_ffn_operations(model, dep, ctx)
        groups.append(LayerGroup("dense layers", model.num_dense_layers, tuple(ops)))
    if model.num_moe_layers:
        ops = attention + attention_output_collective(model, dep, ctx, moe_layer=True) + moe_operations(model, dep, ctx)
        groups.append(LayerGroup("MoE layers", model.num_moe_layers, tuple(ops)))
    return tuple(groups)


def per_step_operations(model: ModelCard, dep: Deployment, ctx: StageContext, micro_batches: int) -> tuple[Operation, ...]:
    """Embedding, final norm + LM head (vocab split over attention TP) and pipeline sends, whole step."""
    tp = dep.attention.tp
    tokens = ctx.tokens_per_gpu * micro_batches * tp
    h = model.hidden_size
    # only the last position of each sequence needs logits in prefill
    logit_rows = tokens if ctx.stage == "decode" else sum(s.count for s in ctx.sequences_per_gpu) * micro_batches * tp
    vocab = shard(model.vocab_size, tp, "vocab_size", "attention.tp")
    ops = [
        Operation("embedding", cat.EMBEDDING, MemoryBoundShape("embedding gather", 2 * tokens * h * ACT_BYTES)),
        Operation("final_norm", cat.LM_HEAD, MemoryBoundShape("RMSNorm", 2 * logit_rows * h * ACT_BYTES)),
        Operation("lm_head", cat.LM_HEAD, GemmShape(logit_rows, h, vocab, "bf16", "bf16", "fp32")),
    ]
    if dep.pp > 1:
        ranks_per_node = 1 if dep.gpus_per_stage >= dep.gpus_per_node else 2
        ops.append(Operation("pp_send", cat.PP_SEND,
                             CollectiveShape("p2p", ctx.tokens_per_gpu * micro_batches * tp * h * ACT_BYTES, 2, ranks_per_node),
                             count=dep.pp - 1))
    return tuple(ops)


def build_stage_plan(stage: Stage, model: ModelCard, dep: Deployment, workload: Workload,
                     tokens_per_gpu: int, comm_sms: int) -> StagePlan:
    """tokens_per_gpu: prompt tokens per GPU (prefill) or requests per GPU (decode)."""
    if tokens_per_gpu <= 0:
        raise InferSimError(f"{stage}: needs at least one token per GPU (got {tokens_per_gpu})")
    micro_batches = 2 if dep.overlap == "two-batch" else 1
    ctx = stage_context(stage, model, dep, workload, tokens_per_gpu, micro_batches)
    sms = comm_sms if (micro_batches == 2 and dep.moe_comm == "deepep-normal" and model.is_moe) else 0
    return StagePlan(stage, layer_groups(model, dep, ctx), per_step_operations(model, dep, ctx, micro_batches),
                     micro_batches, sms, tokens_per_gpu)
