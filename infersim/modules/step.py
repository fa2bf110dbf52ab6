"""Builds the StagePlan of a prefill or decode step from the model card and deployment."""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from infersim.cards.model import (ATTENTION_KINDS, CHUNKED_ATTENTION, FULL_ATTENTION, LINEAR_ATTENTION, MAMBA,
                                  SLIDING_ATTENTION, ModelCard)
from infersim.cards.engine import elementwise_code
from infersim.cards.deployment import Deployment, FfnDeployment, MixerDeployment, Workload, server_tp
from infersim.costing.memo import FreshPieces, Piece, PieceScope, PricingMemo, pieces_for
from infersim.base.errors import InferSimError
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import GemmShape, MemoryBoundShape
from infersim.cards import categories as cat
from infersim.modules import eager
from infersim.modules.attention import attention_after_core, attention_before_core, attention_core
from infersim.modules.ffn import attention_output_collective, dense_ffn_operations, moe_operations
from infersim.modules.linear_attention import linear_mixer_operations
from infersim.shapes.plan import FfnContext, LayerGroup, Operation, SequenceBatch, Stage, StageContext, StagePlan
from infersim.base.sharding import shard
from infersim.base.units import ACT_BYTES


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
    # a static cache is allocated for prompt + output (HF generate's max_length) and attended whole
    capacity = workload.isl + workload.osl + q_len - 1 if dep.model_code.kv_cache == "static" else 0
    seqs = (SequenceBatch(attending, q_len, max(1, round(workload.decode_context)) + q_len - 1,
                          kv_capacity=capacity),)
    return StageContext(stage, per_micro * q_len, seqs, dep.gpus_per_node)


MIXER_LABELS = {FULL_ATTENTION: "full attention", SLIDING_ATTENTION: "sliding window", CHUNKED_ATTENTION: "chunked attention",
                LINEAR_ATTENTION: "Gated DeltaNet", MAMBA: "Mamba-2"}


def layer_composition(model: ModelCard) -> tuple[tuple[str, bool, int], ...]:
    """(mixer kind, MoE FFN?, layers) for each distinct layer kind, in order of first appearance."""
    return model.layer_composition


# A plan is built from pieces (a layer's attention before its core, the core, attention after it,
# the FFN; the per-step operations), each the tuple one builder returns. Given a PricingMemo (a
# sweep's, a serving run's), each piece is kept on its builder and every argument the builder is
# given: the model card, the part of the deployment it is built from (MixerDeployment,
# FfnDeployment), the stage context or the part of it it reads (FfnContext), counts. So the FFN
# of a decode step is shared by every real batch padded to one CUDA-graph size, a layer's attention
# by every EP size and MoE path, and a builder that reads a field its arguments lack fails rather
# than being served a piece built for other values. Without a memo every piece is built afresh.


class _PlanInputs(NamedTuple):
    """What a plan's layers and per-step operations are built from beside the stage context: the
    records of the deployment the builders are given, and where each builder's pieces come from
    (a PricingMemo's scopes of their leading arguments, or fresh builds)."""

    mixer: MixerDeployment
    ffn: FfnDeployment
    engine_tp: int  # the deployment's server TP size (server_tp)
    mixer_pieces: PieceScope | FreshPieces  # builders given (model, mixer) first
    ffn_pieces: PieceScope | FreshPieces  # builders given (model, ffn) first
    step_pieces: PieceScope | FreshPieces  # builders given (model,) first
    # with a memo: the frame of the last plan built from these inputs; None without a memo
    last_frame: _LastFrame | None


class _Frame(NamedTuple):
    """The pieces of a plan that do not read its sequences, for every plan of the same stage,
    tokens, FFN context and logit rows: an attention mixer's pieces before and after its core (None
    for a mixer that is one piece), the FFN pieces of each layer kind, the per-step operations.
    A plan of new sequences then builds (or finds) only its cores."""

    around_core: dict[str, tuple[Piece, Piece] | None]  # mixer kind -> (before the core, after it)
    ffn: tuple[Piece, ...]  # per entry of the model's layer composition
    per_step: Piece


class _LastFrame:
    """The frame of the last plan built from one (model, deployment) inputs, with what it was built
    from beside them. Only the last: a sweep's consecutive plans of one deployment mostly share it
    (the context lengths of one batch, the real batches padded to one CUDA-graph size), and plans
    that never repeat one (a layout search's batches) keep no frames alive."""

    __slots__ = ("key", "frame")

    def __init__(self) -> None:
        self.key: tuple[Hashable, ...] | None = None
        self.frame: _Frame | None = None


def _inputs_of(memo: PricingMemo | None, model: ModelCard, dep: Deployment) -> _PlanInputs:
    """The plan inputs of (model, dep), their pieces kept in `memo` when given."""
    mixer, ffn = MixerDeployment.of(dep), FfnDeployment.of(dep)
    return _PlanInputs(mixer, ffn, server_tp(dep), pieces_for(memo, model, mixer), pieces_for(memo, model, ffn),
                       pieces_for(memo, model), None if memo is None else _LastFrame())


def _plan_inputs(model: ModelCard, dep: Deployment, memo: PricingMemo | None) -> _PlanInputs:
    """The plan inputs of (model, dep): made once per recent pair of objects when there is a memo."""
    return _inputs_of(None, model, dep) if memo is None else memo.derived(_inputs_of, model, dep)


def _core_pieces(inputs: _PlanInputs, ctx: StageContext, kind: str) -> Piece:
    """The piece of a layer's mixer that reads the sequences: the attention core, or a whole
    linear-attention mixer."""
    if kind not in ATTENTION_KINDS:
        return inputs.mixer_pieces.piece(linear_mixer_operations, ctx, kind)
    return inputs.mixer_pieces.piece(attention_core, ctx, kind)


def mixer_pieces(inputs: _PlanInputs, ctx: StageContext, kind: str) -> tuple[tuple[Operation, ...], ...]:
    """The mixer of a layer as pieces. Attention comes in three: the operations before the core
    and after it (attention_before_core, attention_after_core), which see the stage and the
    tokens but not the sequences, so that every context length a sweep tries shares them; and the
    core (attention_core) with the sequences. A linear-attention mixer is one piece."""
    pieces = inputs.mixer_pieces
    if kind not in ATTENTION_KINDS:
        return (_core_pieces(inputs, ctx, kind),)
    tokens = ctx.tokens_per_gpu * inputs.mixer.attention.tp
    return (pieces.piece(attention_before_core, ctx.stage, tokens), _core_pieces(inputs, ctx, kind),
            pieces.piece(attention_after_core, ctx.stage, tokens))


def _ffn_operations(model: ModelCard, dep: FfnDeployment, ctx: FfnContext, moe: bool) -> list[Operation]:
    """The attention-output collective, then the dense FFN or the MoE layer."""
    return attention_output_collective(model, dep, ctx, moe_layer=moe) + (
        moe_operations(model, dep, ctx) if moe else dense_ffn_operations(model, dep, ctx))


def _group_name(model: ModelCard, kind: str, moe: bool) -> str:
    name = "MoE layers" if moe else "dense layers"
    return name + f" ({MIXER_LABELS[kind]})" if model.is_hybrid else name


def _layers_built(model: ModelCard, inputs: _PlanInputs, ctx: StageContext, ffn_ctx: FfnContext
                  ) -> tuple[tuple[LayerGroup, ...], dict[str, tuple[Piece, Piece] | None], tuple[Piece, ...]]:
    """One LayerGroup per distinct (mixer, FFN) layer kind, every piece asked for (`ffn_ctx`: the
    FFN's part of `ctx`); with the pieces around each mixer kind's core and the FFN piece of each
    layer kind (a frame's)."""
    groups = []
    mixers: dict[str, tuple[tuple[Operation, ...], ...]] = {}
    ffns = []
    for kind, moe, layers in layer_composition(model):
        if kind not in mixers:
            mixers[kind] = mixer_pieces(inputs, ctx, kind)
        # the attention-output collective and the FFN (dense or MoE) of a layer, as one piece
        ffn = inputs.ffn_pieces.piece(_ffn_operations, ffn_ctx, moe)
        ffns.append(ffn)
        groups.append(LayerGroup(_group_name(model, kind, moe), layers, (*mixers[kind], ffn)))
    around = {kind: (parts[0], parts[2]) if len(parts) == 3 else None for kind, parts in mixers.items()}
    return tuple(groups), around, tuple(ffns)


def _layers_framed(model: ModelCard, inputs: _PlanInputs, ctx: StageContext, frame: _Frame
                   ) -> tuple[LayerGroup, ...]:
    """_layers_built's groups from a frame of the same inputs: only the cores are asked for."""
    cores: dict[str, Piece] = {}
    groups = []
    for (kind, moe, layers), ffn in zip(layer_composition(model), frame.ffn):
        core = cores.get(kind)
        if core is None:
            core = cores[kind] = _core_pieces(inputs, ctx, kind)
        around = frame.around_core[kind]
        parts = (core, ffn) if around is None else (around[0], core, around[1], ffn)
        groups.append(LayerGroup(_group_name(model, kind, moe), layers, parts))
    return tuple(groups)


def layer_groups(model: ModelCard, dep: Deployment, ctx: StageContext,
                 memo: PricingMemo | None = None) -> tuple[LayerGroup, ...]:
    """One LayerGroup per distinct (mixer, FFN) layer kind, of pieces (kept in `memo` when given);
    layers of a kind share it whatever their order (order only matters for two-batch overlap,
    which pipelines layer by layer)."""
    return _layers_built(model, _plan_inputs(model, dep, memo), ctx, FfnContext.of(ctx))[0]


def _logit_rows(dep: Deployment, ctx: StageContext, micro_batches: int) -> int:
    """Rows the LM head computes in one step: every token in decode, the last position of each
    sequence in prefill."""
    tp = dep.attention.tp
    if ctx.stage == "decode":
        return ctx.tokens_per_gpu * micro_batches * tp
    return sum(s.group_count(tp) for s in ctx.sequences_per_gpu) * micro_batches


def per_step_operations(model: ModelCard, dep: Deployment, ctx: StageContext, micro_batches: int,
                        memo: PricingMemo | None = None) -> tuple[Operation, ...]:
    """Embedding, final norm + LM head (vocab split over attention TP) and pipeline sends, whole step
    (one piece, built by _step_operations from the numbers it reads; kept in `memo` when given)."""
    return _per_step(model, dep, _plan_inputs(model, dep, memo), ctx, micro_batches,
                     _logit_rows(dep, ctx, micro_batches))


def _per_step(model: ModelCard, dep: Deployment, inputs: _PlanInputs, ctx: StageContext, micro_batches: int,
              logit_rows: int) -> Piece:
    gathered_dp = lm_head_gathered_dp(model, dep)
    code = elementwise_code(dep.model_code, ctx.stage)
    args = (dep.attention.tp, dep.pp, dep.gpus_per_stage, dep.gpus_per_node, ctx.tokens_per_gpu, micro_batches,
            logit_rows, gathered_dp, code)
    return inputs.step_pieces.piece(_step_operations, *args)


def lm_head_gathered_dp(model: ModelCard, dep: Deployment) -> int:
    """The attention-DP ranks whose tokens one LM head gathers (deployment.lm_head gathered), or 1:
    each rank computes its own logits (per-rank, no attention DP, or a tied head, which shares the
    embedding's unsplit weights under attention DP)."""
    dp = dep.attention.dp or 1
    if dep.lm_head != "gathered" or dp <= 1 or model.tie_word_embeddings:
        return 1
    return dp


def _step_operations(model: ModelCard, tp: int, pp: int, gpus_per_stage: int, gpus_per_node: int,
                     tokens_per_micro_batch: int, micro_batches: int, logit_rows: int,
                     gathered_dp: int = 1, code: str = eager.FUSED) -> list[Operation]:
    """per_step_operations on exactly what it reads (so a memo keeps it on those)."""
    tokens = tokens_per_micro_batch * micro_batches * tp
    h = model.hidden_size
    ops = [Operation("embedding", cat.EMBEDDING, MemoryBoundShape("embedding gather", 2 * tokens * h * ACT_BYTES))]
    ops += eager.step_eager(tokens, h, model.head_dim or model.qk_rope_head_dim or 128, logit_rows, code)
    if gathered_dp > 1:
        # SGLang's LM head under DP attention (deployment.lm_head gathered): the hidden states of every
        # DP rank are gathered, each GPU computes all of their logits over its vocab shard of the
        # whole group, the logits are all-gathered and each rank copies out its own rows
        group = tp * gathered_dp
        rows = logit_rows * gathered_dp
        per_node = min(group, gpus_per_node)
        vocab = shard(model.vocab_size, group, "vocab_size", "attention.tp x attention.dp (lm_head gathered)")
        ops += [
            Operation("lm_head_gather", cat.DP_GATHER, CollectiveShape("all_gather", rows * h * ACT_BYTES, group, per_node)),
            Operation("lm_head", cat.LM_HEAD, GemmShape(rows, h, vocab, "bf16", "bf16", "bf16")),
            Operation("logits_all_gather", cat.DP_GATHER,
                      CollectiveShape("all_gather", rows * model.vocab_size * ACT_BYTES, group, per_node)),
            Operation("logits_scatter", cat.LM_HEAD,
                      MemoryBoundShape("copy of the rank's logit rows", 2 * logit_rows * model.vocab_size * ACT_BYTES)),
        ]
    else:
        vocab = shard(model.vocab_size, tp, "vocab_size", "attention.tp")
        ops.append(Operation("lm_head", cat.LM_HEAD, GemmShape(logit_rows, h, vocab, "bf16", "bf16", "fp32")))
    if pp > 1:
        ranks_per_node = 1 if gpus_per_stage >= gpus_per_node else 2
        ops.append(Operation("pp_send", cat.PP_SEND, CollectiveShape("p2p", tokens * h * ACT_BYTES, 2, ranks_per_node),
                             count=pp - 1))
    return ops


def build_stage_plan(stage: Stage, model: ModelCard, dep: Deployment, workload: Workload,
                     tokens_per_gpu: int, comm_sms: int, q_len: int = 1, real_batch: int = 0,
                     memo: PricingMemo | None = None) -> StagePlan:
    """tokens_per_gpu: prompt tokens per GPU (prefill) or requests per GPU (decode).
    q_len (decode only): tokens each request feeds in one step (k + 1 to verify k speculative tokens).
    real_batch (decode only): requests behind a CUDA-graph batch padded to tokens_per_gpu.
    memo: the caller's PricingMemo, when it builds many plans (a sweep, a serving run)."""
    if tokens_per_gpu <= 0:
        raise InferSimError(f"{stage}: needs at least one token per GPU (got {tokens_per_gpu})")
    micro_batches = 2 if dep.overlap == "two-batch" else 1
    ctx = stage_context(stage, model, dep, workload, tokens_per_gpu, micro_batches, q_len, real_batch)
    requests = tokens_per_gpu if stage == "decode" else sum(s.group_count(dep.attention.tp) for s in ctx.sequences_per_gpu) * micro_batches // dep.attention.tp
    return plan_from_context(ctx, model, dep, micro_batches, comm_sms, tokens_per_gpu, requests, memo)


def plan_from_context(ctx: StageContext, model: ModelCard, dep: Deployment, micro_batches: int, comm_sms: int,
                      tokens_per_gpu: int, requests_per_gpu: int, memo: PricingMemo | None = None) -> StagePlan:
    """The plan of one step whose per-micro-batch work is `ctx` (any mix of sequences). With a memo,
    the pieces that do not read the sequences come from the frame of the last plan of the same
    (model, deployment) when it was built from the same inputs beside the sequences; otherwise every
    piece is asked for, in order, and the plan's frame kept."""
    sms = comm_sms if (micro_batches == 2 and dep.moe_comm == "deepep-normal" and model.is_moe) else 0
    inputs = _plan_inputs(model, dep, memo)
    logit_rows = _logit_rows(dep, ctx, micro_batches)
    last = inputs.last_frame
    frame = None
    if last is not None:
        # what a frame's pieces are built from beside the (model, deployment) inputs: the FFN's record
        # (which holds the stage and tokens the pieces around an attention core read), as its fields,
        # and the per-step piece's micro-batches and logit rows
        ffn_values = FfnContext.values_of(ctx)
        key = (ffn_values, micro_batches, logit_rows)
        if last.key == key:
            frame = last.frame
    if frame is None:
        ffn_ctx = FfnContext(*ffn_values) if last is not None else FfnContext.of(ctx)
        groups, around, ffns = _layers_built(model, inputs, ctx, ffn_ctx)
        per_step = _per_step(model, dep, inputs, ctx, micro_batches, logit_rows)
        if last is not None:
            last.key, last.frame = key, _Frame(around, ffns, per_step)
    else:
        groups, per_step = _layers_framed(model, inputs, ctx, frame), frame.per_step
    return StagePlan(ctx.stage, groups, per_step, micro_batches, sms, tokens_per_gpu,
                     requests_per_gpu, attention_tp=dep.attention.tp, engine_tp=inputs.engine_tp)


def build_step_plan(model: ModelCard, dep: Deployment, sequences: tuple[SequenceBatch, ...], comm_sms: int,
                    stage: Stage | None = None, expert_tokens_per_gpu: float = 0.0,
                    graph_padding: int = 0, memo: PricingMemo | None = None) -> StagePlan:
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
    through every GEMM but attend to no cached context. memo: as for build_stage_plan."""
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
                             total_tokens if label == "prefill" else requests, requests, memo)
