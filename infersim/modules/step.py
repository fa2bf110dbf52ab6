"""Builds the StagePlan of a prefill or decode step from the model card and deployment."""

from __future__ import annotations

from infersim.cards.model import FULL_ATTENTION, LINEAR_ATTENTION, MAMBA, SLIDING_ATTENTION, ModelCard
from infersim.config import Deployment, Workload
from infersim.errors import InferSimError
from infersim.kernels import CollectiveShape, GemmShape, MemoryBoundShape
from infersim.modules import categories as cat
from infersim.modules.attention import attention_operations
from infersim.modules.ffn import attention_output_collective, dense_ffn_operations, moe_operations
from infersim.modules.linear_attention import linear_mixer_operations
from infersim.plan import LayerGroup, Operation, SequenceBatch, Stage, StageContext, StagePlan
from infersim.sharding import shard
from infersim.units import ACT_BYTES


def prefill_sequences(tokens: int, isl: int, tp: int = 1) -> tuple[SequenceBatch, ...]:
    """`tokens` prompt tokens per GPU as ISL-long sequences (a remainder is one shorter sequence).
    Under attention TP the group's tp x tokens are cut into prompts: whole prompts per GPU where
    they divide evenly over the group, else the group's prompts spread over its GPUs (across_tp)."""
    full, rest = divmod(tokens * tp, isl)
    seqs = []
    for count, length in ((full, isl), (1 if rest else 0, rest)):
        if not count:
            continue
        if count % tp == 0:
            seqs.append(SequenceBatch(count // tp, length, length))
        else:
            seqs.append(SequenceBatch(count, length, length, across_tp=True))
    return tuple(seqs)


def stage_context(stage: Stage, model: ModelCard, dep: Deployment, workload: Workload,
                  tokens_per_gpu: int, micro_batches: int, q_len: int = 1, real_batch: int = 0) -> StageContext:
    """q_len (decode): new tokens per request in one step, > 1 when verifying speculative tokens;
    they attend to the context and to each other, so the last one sees decode_context + q_len - 1.
    real_batch (decode, 0 = tokens_per_gpu): the requests behind a batch padded to a CUDA-graph size;
    the padding rows go through every GEMM but attend to no cached context, so attention sees the
    real requests only."""
    per_micro = shard(tokens_per_gpu, micro_batches,
                      "workload.prefill_tokens_per_gpu" if stage == "prefill" else "workload.decode_batch_per_gpu",
                      "the two micro-batches of deployment.overlap two-batch")
    if stage == "prefill":
        seqs = prefill_sequences(per_micro, workload.isl, dep.attention.tp)
        return StageContext(stage, per_micro, seqs, dep.gpus_per_node)
    attending = min(per_micro, -(-real_batch // micro_batches)) if real_batch else per_micro
    seqs = (SequenceBatch(attending, q_len, max(1, round(workload.decode_context)) + q_len - 1),)
    return StageContext(stage, per_micro * q_len, seqs, dep.gpus_per_node)


MIXER_LABELS = {FULL_ATTENTION: "full attention", SLIDING_ATTENTION: "sliding window",
                LINEAR_ATTENTION: "Gated DeltaNet", MAMBA: "Mamba-2"}


def layer_composition(model: ModelCard) -> tuple[tuple[str, bool, int], ...]:
    """(mixer kind, MoE FFN?, layers) for each distinct layer kind, in order of first appearance."""
    return model.layer_composition


def mixer_operations(model: ModelCard, dep: Deployment, ctx: StageContext, kind: str) -> list[Operation]:
    if kind in (FULL_ATTENTION, SLIDING_ATTENTION):
        return attention_operations(model, dep, ctx, kind)
    return linear_mixer_operations(model, dep, ctx, kind)


def layer_groups(model: ModelCard, dep: Deployment, ctx: StageContext) -> tuple[LayerGroup, ...]:
    """One LayerGroup per distinct (mixer, FFN) layer kind; layers of a kind share it whatever
    their order (order only matters for two-batch overlap, which pipelines layer by layer)."""
    groups = []
    mixers: dict[str, list[Operation]] = {}
    for kind, moe, layers in layer_composition(model):
        if kind not in mixers:
            mixers[kind] = mixer_operations(model, dep, ctx, kind)
        ffn = moe_operations(model, dep, ctx) if moe else dense_ffn_operations(model, dep, ctx)
        ops = mixers[kind] + attention_output_collective(model, dep, ctx, moe_layer=moe) + ffn
        name = "MoE layers" if moe else "dense layers"
        if model.is_hybrid:
            name += f" ({MIXER_LABELS[kind]})"
        groups.append(LayerGroup(name, layers, tuple(ops)))
    return tuple(groups)


def per_step_operations(model: ModelCard, dep: Deployment, ctx: StageContext, micro_batches: int) -> tuple[Operation, ...]:
    """Embedding, final norm + LM head (vocab split over attention TP) and pipeline sends, whole step."""
    tp = dep.attention.tp
    tokens = ctx.tokens_per_gpu * micro_batches * tp
    h = model.hidden_size
    # only the last position of each sequence needs logits in prefill
    logit_rows = tokens if ctx.stage == "decode" else sum(s.group_count(tp) for s in ctx.sequences_per_gpu) * micro_batches
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
                     tokens_per_gpu: int, comm_sms: int, q_len: int = 1, real_batch: int = 0) -> StagePlan:
    """tokens_per_gpu: prompt tokens per GPU (prefill) or requests per GPU (decode).
    q_len (decode only): tokens each request feeds in one step (k + 1 to verify k speculative tokens).
    real_batch (decode only): requests behind a CUDA-graph batch padded to tokens_per_gpu."""
    if tokens_per_gpu <= 0:
        raise InferSimError(f"{stage}: needs at least one token per GPU (got {tokens_per_gpu})")
    micro_batches = 2 if dep.overlap == "two-batch" else 1
    ctx = stage_context(stage, model, dep, workload, tokens_per_gpu, micro_batches, q_len, real_batch)
    requests = tokens_per_gpu if stage == "decode" else sum(s.group_count(dep.attention.tp) for s in ctx.sequences_per_gpu) * micro_batches // dep.attention.tp
    return plan_from_context(ctx, model, dep, micro_batches, comm_sms, tokens_per_gpu, requests)


def plan_from_context(ctx: StageContext, model: ModelCard, dep: Deployment, micro_batches: int, comm_sms: int,
                      tokens_per_gpu: int, requests_per_gpu: int) -> StagePlan:
    """The plan of one step whose per-micro-batch work is `ctx` (any mix of sequences)."""
    sms = comm_sms if (micro_batches == 2 and dep.moe_comm == "deepep-normal" and model.is_moe) else 0
    return StagePlan(ctx.stage, layer_groups(model, dep, ctx), per_step_operations(model, dep, ctx, micro_batches),
                     micro_batches, sms, tokens_per_gpu, requests_per_gpu)


def build_step_plan(model: ModelCard, dep: Deployment, sequences: tuple[SequenceBatch, ...], comm_sms: int,
                    stage: Stage | None = None, expert_tokens_per_gpu: float = 0.0,
                    graph_padding: int = 0) -> StagePlan:
    """One step over explicit per-GPU sequences: prefill chunks (q_len new tokens on top of a prefix,
    kv_len = prefix + q_len) and decode requests (q_len 1, kv_len = context), each priced with its own
    context. GEMMs, norms and communication see the total token count. The stage label (which
    attention kernel family and tables apply) is prefill when any sequence feeds more than one token,
    unless given. Under two-batch overlap each micro-batch holds half of every sequence group
    (rounded up: an odd count is priced as one more).
    `sequences` are the busiest attention-DP rank's; expert_tokens_per_gpu (when > 0) is the mean
    token count per GPU over the ranks, which sets the routed experts' work under all-to-all
    (one rank prefilling a prompt while the others decode adds one prompt of expert work, not one
    per rank). graph_padding: rows a CUDA-graph step adds to reach a captured batch size; they go
    through every GEMM but attend to no cached context."""
    if not sequences or any(s.count <= 0 or s.q_len <= 0 or s.kv_len < s.q_len for s in sequences):
        raise InferSimError(f"a step needs sequences with count > 0 and kv_len >= q_len > 0 (got {sequences})")
    label: Stage = stage or ("prefill" if any(s.q_len > 1 for s in sequences) else "decode")
    micro_batches = 2 if dep.overlap == "two-batch" else 1
    if micro_batches == 2:
        halves = []
        for s in sequences:
            if s.count > 1:
                halves.append(SequenceBatch(-(-s.count // 2), s.q_len, s.kv_len, s.across_tp))
            else:  # one sequence: each micro-batch carries half of its new tokens
                halves.append(SequenceBatch(1, max(1, -(-s.q_len // 2)), s.kv_len, s.across_tp))
        per_micro = tuple(halves)
    else:
        per_micro = tuple(sequences)
    tp = dep.attention.tp
    tokens = sum(s.gpu_tokens(tp) for s in per_micro) + -(-graph_padding // micro_batches)
    expert_tokens = min(float(tokens), expert_tokens_per_gpu / micro_batches) if expert_tokens_per_gpu > 0 else 0.0
    ctx = StageContext(label, tokens, per_micro, dep.gpus_per_node, expert_tokens)
    total_tokens = sum(s.gpu_tokens(tp) for s in sequences) + graph_padding
    requests = max(1, sum(s.group_count(tp) for s in sequences) // tp)
    return plan_from_context(ctx, model, dep, micro_batches, comm_sms,
                             total_tokens if label == "prefill" else requests, requests)
