"""Speculative decoding: a drafter proposes k tokens, the model verifies them in one forward.

One decode step with lookahead k:
  draft    k sequential single-token steps of the drafter: a draft model (its own card, run
           tensor-parallel over each attention-TP group, see config.draft_deployment) or the
           model's MTP module (one transformer layer of the model's own kind plus its input
           projection [embedding; hidden] -> hidden and the shared LM head)
  verify   one forward of the model with k + 1 tokens per request (decode with q_len = k + 1:
           GEMMs see batch x (k+1) rows, attention k+1 queries over the context, logits for all)
With each proposed token accepted independently with probability a, a step yields
    E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
tokens per request (the accepted prefix plus the model's own next token), so
    effective TPOT = (draft + verify) / E(k),   decode throughput = batch x E(k) / (draft + verify).
`lookahead: auto` picks the k in 1..max_lookahead with the lowest effective TPOT.

The drafter also prefills the prompt (its time is added to TTFT) and keeps its own KV cache
(added to memory). Left out: re-running the drafter over the accepted tokens ("draft extend":
each draft step here is one token), tree drafts, rejection-sampling kernels, and the extra
recurrent-state copies hybrid models keep to roll back rejected tokens. The scheduler overhead
of the hardware card is paid once per step (drafting runs inside the same CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infersim.cards.engine import EngineCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig, Speculative
from infersim.cards.deployment import Deployment
from infersim.engine.stage import OperationResult, StageResult, run_stage
from infersim.base.errors import InferSimError
from infersim.shapes.kernels import GemmShape, MemoryBoundShape
from infersim.run.draft_memory import DraftMemory
from infersim.run.memory import (
    bounded_bytes_per_request,
    kv_bytes_per_token,
    mtp_card,
    mtp_weights_per_gpu,
    weights_per_gpu,
)
from infersim.cards import categories as cat
from infersim.base.units import ACT_BYTES
from infersim.modules.step import build_stage_plan, build_step_plan
from infersim.costing.memo import PricingMemo
from infersim.shapes.plan import Operation, SequenceBatch, Stage, StagePlan


def expected_tokens_per_step(acceptance_rate: float, lookahead: int) -> float:
    """Expected tokens one verification step yields with i.i.d. acceptance a and k proposed
    tokens: the accepted prefix plus one token from the model, (1 - a^(k+1)) / (1 - a)."""
    a, k = acceptance_rate, lookahead
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class LookaheadPoint:
    """One lookahead k of speculative decoding: accepted tokens per step and the step's time."""

    lookahead: int
    expected_tokens: float  # per request per step
    step_time_s: float  # draft + verification
    tpot_s: float  # step_time_s / expected_tokens


@dataclass(frozen=True)
class SpeculativeResult:
    """Speculative decoding of a run: the drafter, the lookahead in use and what it gains."""

    method: str  # "draft" or "mtp"
    drafter: str  # draft model name, or "<model> MTP"
    lookahead: int  # k in use (the best one when lookahead_auto)
    lookahead_auto: bool
    acceptance_rate: float
    expected_tokens_per_step: float  # E(k)
    draft_step_time_s: float  # one drafter step
    draft_time_s: float  # k drafter steps
    verify_time_s: float  # the model's (k+1)-token forward, scheduler overhead included
    step_time_s: float  # draft + verify
    tpot_s: float  # effective time per output token: step / E(k)
    tgs: float  # decode tokens per GPU per second with speculation
    baseline_tpot_s: float  # the same batch decoding one token per step
    speedup: float  # baseline_tpot_s / tpot_s
    prefill_draft_time_s: float  # drafter prefill included in TTFT
    search: tuple[LookaheadPoint, ...]  # every k tried (one entry unless lookahead_auto)


# ---------------------------------------------------------------------------------------------
# The drafter


def _mtp_extra_operations(model: ModelCard, dep: Deployment, tokens_per_gpu: int) -> tuple[Operation, ...]:
    """The MTP module's own operations: norms of embedding and hidden state, and the projection of
    their concatenation back to the model width."""
    tokens = tokens_per_gpu * dep.attention.tp
    h = model.hidden_size
    gemm = dict(dtype=dep.precision.gemm, weight_dtype=dep.precision.weight_dtype)
    return (
        Operation("mtp_norms", cat.ELEMENTWISE, MemoryBoundShape("embedding and hidden RMSNorms", 2 * 2 * tokens * h * ACT_BYTES)),
        Operation("mtp_eh_proj", cat.ATTN_PROJ, GemmShape(tokens, 2 * h, h, **gemm)),
    )


def drafter_plan(config: RunConfig, stage: Stage, tokens_per_gpu: int, memo: PricingMemo | None = None) -> StagePlan:
    """One drafter step (decode: one token per request) or the drafter's prompt prefill."""
    spec = _spec(config)
    hw = config.hardware
    if spec.method == "draft":
        assert config.draft_model is not None and config.draft_deployment is not None
        return build_stage_plan(stage, config.draft_model, config.draft_deployment, config.workload, tokens_per_gpu, 0,
                                memo=memo)
    model, dep = config.model, config.deployment
    plan = build_stage_plan(stage, mtp_card(model), dep, config.workload, tokens_per_gpu, hw.derates.deepep_normal_sms,
                            memo=memo)
    return replace(plan, per_step=plan.per_step + _mtp_extra_operations(model, dep, plan.tokens_per_gpu))


def drafter_step_plan(config: RunConfig, sequences: tuple[SequenceBatch, ...]) -> StagePlan:
    """The drafter over explicit per-GPU sequences (the serving simulator's steps): one draft step of
    decode requests (one token each), or the prompt chunks the drafter prefills beside the model."""
    spec = _spec(config)
    if spec.method == "draft":
        assert config.draft_model is not None and config.draft_deployment is not None
        return build_step_plan(config.draft_model, config.draft_deployment, sequences, 0)
    model, dep = config.model, config.deployment
    plan = build_step_plan(mtp_card(model), dep, sequences, config.hardware.derates.deepep_normal_sms)
    return replace(plan, per_step=plan.per_step + _mtp_extra_operations(model, dep, plan.tokens_per_gpu))


def drafter_step_time(config: RunConfig, sequences: tuple[SequenceBatch, ...]) -> float:
    """Seconds of one drafter pass over `sequences`, without the scheduler overhead (paid once per
    step, by the verification)."""
    seconds, _ops = _without_overhead(run_stage(drafter_step_plan(config, sequences), config.hardware, config.tables))
    return seconds


def serving_lookahead(config: RunConfig) -> tuple[int, float, bool]:
    """(lookahead k, expected tokens per step E(k), chosen by `auto`) for the serving simulator: the
    configured k, or under `lookahead: auto` the k the stage engine finds best at one request per
    GPU with the config's workload (engines run one fixed k)."""
    spec = _spec(config)
    if spec.lookahead != "auto":
        k = int(spec.lookahead)
        return k, expected_tokens_per_step(spec.acceptance_rate, k), False
    model, hw, dep, workload = config.model, config.hardware, config.deployment, config.workload
    baseline = run_stage(build_stage_plan("decode", model, dep, workload, 1, hw.derates.deepep_normal_sms),
                         hw, config.tables, config.engine)
    _decode, result = speculative_decode(config, 1, baseline)
    return result.lookahead, result.expected_tokens_per_step, True


def drafter_memory(config: RunConfig) -> DraftMemory | None:
    """Weights and cache the drafter adds on each GPU (None without speculative decoding)."""
    spec = config.speculative
    if spec is None:
        return None
    kv_dtype = config.deployment.precision.kv_cache
    context = config.workload.isl + config.workload.osl
    if spec.method == "draft":
        draft, ddep = config.draft_model, config.draft_deployment
        assert draft is not None and ddep is not None
        tp = ddep.attention.tp
        return DraftMemory(weights_per_gpu(draft, ddep), kv_bytes_per_token(draft, kv_dtype),
                           kv_bytes_per_token(draft, kv_dtype, tp), bounded_bytes_per_request(draft, kv_dtype, context),
                           bounded_bytes_per_request(draft, kv_dtype, context, tp))
    model, dep = config.model, config.deployment
    layers, mtp = model.num_nextn_predict_layers, mtp_card(model)
    return DraftMemory(mtp_weights_per_gpu(model, dep), layers * kv_bytes_per_token(mtp, kv_dtype),
                       layers * kv_bytes_per_token(mtp, kv_dtype, dep.attention.tp))


# ---------------------------------------------------------------------------------------------
# Composing the stages


def _without_overhead(stage: StageResult) -> tuple[float, tuple[OperationResult, ...]]:
    """(step time without the scheduler overhead, the operations but the scheduler's)."""
    overhead = sum(op.time_s for op in stage.operations if op.module == cat.OVERHEAD)
    return stage.step_time_s - overhead, tuple(op for op in stage.operations if op.module != cat.OVERHEAD)


def _as_draft(ops: tuple[OperationResult, ...], times: int, label: str) -> tuple[OperationResult, ...]:
    """The drafter's operations, repeated `times` per step, under the draft category."""
    return tuple(replace(op, module=cat.DRAFT, time_s=op.time_s * times, time_per_layer_s=op.time_per_layer_s * times,
                         flops=op.flops * times, bytes=op.bytes * times, group=f"{label}: {op.group}",
                         detail=f"{op.module}" + (f"; {op.detail}" if op.detail else "") + f"; x{times} per step")
                 for op in ops)


def _drafter_label(config: RunConfig) -> str:
    spec = _spec(config)
    if spec.method == "draft":
        assert config.draft_model is not None
        return f"draft {config.draft_model.name}"
    return "MTP"


def _spec(config: RunConfig) -> Speculative:
    if config.speculative is None:
        raise InferSimError("no speculative section in this run config")  # a bug in the caller
    return config.speculative


def with_draft_prefill(config: RunConfig, prefill: StageResult,
                       memo: PricingMemo | None = None) -> tuple[StageResult, float]:
    """The prefill stage plus the drafter's prefill of the same prompts (one scheduler overhead)."""
    plan = drafter_plan(config, "prefill", config.workload.prefill_tokens, memo)
    seconds, ops = _without_overhead(run_stage(plan, config.hardware, config.tables, memo=memo))
    combined = replace(prefill, step_time_s=prefill.step_time_s + seconds,
                       operations=prefill.operations + _as_draft(ops, 1, _drafter_label(config)))
    return combined, seconds


def speculative_engine(engine: EngineCard) -> EngineCard:
    """The engine card as it runs a speculative step: without its overlap scheduler where the
    engine turns it off for speculative decoding (overheads.overlap_with_speculative)."""
    o = engine.overheads
    if o.overlap_with_speculative or not o.overlap_scheduler:
        return engine
    return replace(engine, overheads=replace(o, overlap_scheduler=False))


def speculative_decode(config: RunConfig, batch: int, baseline: StageResult,
                       memo: PricingMemo | None = None) -> tuple[StageResult, SpeculativeResult]:
    """The decode stage under speculative decoding (draft steps + verification), and its numbers.
    `baseline` is the same batch decoding one token per step."""
    spec = _spec(config)
    model, hw, dep, workload = config.model, config.hardware, config.deployment, config.workload
    engine = speculative_engine(config.engine)
    draft_step, draft_ops = _without_overhead(run_stage(drafter_plan(config, "decode", batch, memo), hw, config.tables,
                                                        memo=memo))
    auto = spec.lookahead == "auto"
    candidates = range(1, spec.max_lookahead + 1) if auto else (int(spec.lookahead),)
    best: tuple[float, int, StageResult] | None = None
    search = []
    for k in candidates:
        verify = run_stage(build_stage_plan("decode", model, dep, workload, batch, hw.derates.deepep_normal_sms,
                                            q_len=k + 1, memo=memo), hw, config.tables, engine, memo)
        expected = expected_tokens_per_step(spec.acceptance_rate, k)
        step = verify.step_time_s + k * draft_step
        search.append(LookaheadPoint(k, expected, step, step / expected))
        if best is None or step / expected < best[0]:
            best = (step / expected, k, verify)
    assert best is not None
    tpot, k, verify = best
    expected = expected_tokens_per_step(spec.acceptance_rate, k)
    step = verify.step_time_s + k * draft_step
    decode = replace(verify, step_time_s=step, tokens_per_step=expected,
                     operations=verify.operations + _as_draft(draft_ops, k, _drafter_label(config)))
    result = SpeculativeResult(
        method=spec.method, drafter=(config.draft_model.name if config.draft_model else f"{model.name} MTP"),
        lookahead=k, lookahead_auto=auto, acceptance_rate=spec.acceptance_rate, expected_tokens_per_step=expected,
        draft_step_time_s=draft_step, draft_time_s=k * draft_step, verify_time_s=verify.step_time_s,
        step_time_s=step, tpot_s=tpot, tgs=decode.tgs, baseline_tpot_s=baseline.tpot_s,
        speedup=baseline.tpot_s / tpot, prefill_draft_time_s=0.0, search=tuple(search))
    return decode, result


def run_speculative(config: RunConfig, prefill: StageResult, batch: int,
                    memo: PricingMemo | None = None) -> tuple[StageResult, StageResult, SpeculativeResult]:
    """(prefill with the drafter's prefill, speculative decode stage, speculative numbers)."""
    model, hw, dep, workload = config.model, config.hardware, config.deployment, config.workload
    baseline = run_stage(build_stage_plan("decode", model, dep, workload, batch, hw.derates.deepep_normal_sms,
                                          memo=memo), hw, config.tables, config.engine, memo)
    decode, result = speculative_decode(config, batch, baseline, memo)
    prefill, draft_prefill = with_draft_prefill(config, prefill, memo)
    return prefill, decode, replace(result, prefill_draft_time_s=draft_prefill)
