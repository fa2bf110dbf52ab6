"""One simulation: a RunConfig in, prefill and decode results, memory and warnings out."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING
from dataclasses import dataclass, replace

from infersim.cards.engine import EngineCard
from infersim.cards.hardware import HardwareCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.cards.deployment import Deployment, Workload, dp_attention_ranks, server_tp
from infersim.engine.stage import StageResult, run_stage, sequential_steps, stage_time, stage_time_by_bound
from infersim.shapes.kernels import Bound, KernelTables, NoTables, Source
from infersim.run.memory import MemoryResult, encoder_note, memory_budget
from infersim.cards import categories as cat
from infersim.modules.step import build_stage_plan, build_step_plan
from infersim.costing.memo import PricingMemo
from infersim.shapes.plan import SequenceBatch, StagePlan
from infersim.base.texttable import counted
from infersim.run.request_limits import (context_warnings, kv_pool_said, larger_cap, pool_problem, served_osl,
                                         within_context)
from infersim.base.units import GB

if TYPE_CHECKING:
    from infersim.costing.weight_offload import WeightOffload
    from infersim.run.speculative import SpeculativeResult


@dataclass(frozen=True)
class SimulationResult:
    """A simulated run: its config, prefill and decode steps, memory, and why it does not fit if so."""

    config: RunConfig
    prefill: StageResult
    decode: StageResult
    memory: MemoryResult
    warnings: tuple[str, ...]
    # speculative decoding (run config section `speculative`): then `decode` is the speculative
    # step (drafting + verification; decode.tpot_s is the effective TPOT) and `prefill` includes
    # the drafter's prefill
    speculative: SpeculativeResult | None = None
    # why this deployment cannot run as asked (which memory limit binds and by how much); empty
    # when it fits. The stage numbers are still computed, but are not a speed that can happen.
    unfit: tuple[str, ...] = ()
    # the prefill of one prompt alone, where the prefill step holds several (workload.prefill_tokens_per_gpu);
    # None when the step is one prompt: then `prefill` is it
    single_prompt: StageResult | None = None

    @property
    def fits(self) -> bool:
        return not self.unfit

    @property
    def single_request_ttft_s(self) -> float:
        """Time to first token of one request on an idle server: its prompt's prefill alone (what a
        benchmark's TTFT tends to at low load, before queueing and batching with other prompts), plus
        the engine's API-server time (0 unless calibrated), which a client sees too."""
        return single_request_ttft(self.single_prompt or self.prefill, self.config.engine)

    @property
    def prompts_per_prefill_step(self) -> float:
        """Prompts the prefill step holds on one attention-TP group (1 unless the workload packs several)."""
        if self.single_prompt is None:
            return 1.0
        return self.config.workload.prefill_tokens_per_gpu * self.config.deployment.attention.tp / self.config.workload.isl


def decode_batch(config: RunConfig, memory: MemoryResult) -> int:
    requested = config.workload.decode_batch_per_gpu
    if requested == "max":
        # two-batch overlap splits the batch in two equal micro-batches
        step = 2 if config.deployment.overlap == "two-batch" else 1
        return max(memory.max_batch_per_gpu // step * step, step)
    return requested


# Prompts of more chunks than this are priced on this many chunks, each standing for an equal
# stretch of consecutive chunks and taken at its middle: exact while a chunk's time grows linearly
# with its prefix (attention over the prefix; GEMMs are the same for every full chunk).
MAX_PRICED_CHUNKS = 64


def prefill_step_tokens(workload: Workload, engine: EngineCard, hw: HardwareCard, dep: Deployment) -> int:
    """Prompt tokens one prefill step processes per GPU: the workload's prefill_tokens_per_gpu when
    given, else one prompt cut to the engine's chunk budget, shared by the GPUs of an attention-TP
    group (the budget is the group's: one scheduler feeds it)."""
    if workload.prefill_tokens_per_gpu:
        return workload.prefill_tokens_per_gpu
    budget = engine.chunk_tokens(hw.peak.hbm_bytes, dp_attention_ranks(dep))
    group_step = min(workload.isl, budget) if budget else workload.isl
    return -(-group_step // dep.attention.tp)


def prompt_chunk(isl: int, step_tokens: int, index: int) -> tuple[int, int]:
    """(new tokens, prefix already cached) of chunk `index` of a prompt run in steps of step_tokens."""
    return min(step_tokens, isl - index * step_tokens), index * step_tokens


def with_offload(plan: StagePlan, offload: WeightOffload | None) -> StagePlan:
    """The plan with each layer streaming its share of the offloaded weights (unchanged without)."""
    if offload is None or offload.bytes_per_gpu <= 0:
        return plan
    return replace(plan, offload_bytes_per_layer=offload.bytes_per_layer)


def run_prefill(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload, tables: KernelTables,
                engine: EngineCard, offload: WeightOffload | None = None, memo: PricingMemo | None = None) -> StageResult:
    """TTFT stage: one step of `prefill_step_tokens` per GPU when a prompt fits in what the
    attention-TP group takes per step (several prompts per step when they fit together), else the
    prompt's chunks one after another, each attending to the prefix already in the KV cache and
    spread over the group's GPUs. With `offload` every step (every chunk) streams the offloaded
    weights again. memo: the caller's PricingMemo, when it prices many runs (a sweep)."""
    sms = hw.derates.deepep_normal_sms
    tp = dep.attention.tp
    step = prefill_step_tokens(workload, engine, hw, dep)
    if workload.isl <= step * tp:
        if workload.prefill_tokens_per_gpu:
            plan = build_stage_plan("prefill", model, dep, workload, step, sms, memo=memo)
        else:  # one prompt, its own tokens: the group's ceil(isl / tp) x tp would add a prompt of the rounding
            plan = build_step_plan(model, dep, (SequenceBatch(1, workload.isl, workload.isl, across_tp=tp > 1),), sms,
                                   stage="prefill", memo=memo)
        return run_stage(with_offload(plan, offload), hw, tables, engine, memo)
    step *= tp  # the group's chunk
    count = -(-workload.isl // step)
    if count > MAX_PRICED_CHUNKS:
        # the last chunk (often shorter) is priced on its own; the full ones by equal strata, each
        # at its middle chunk (index arithmetic: a huge prompt never lists its chunks)
        full, n = count - 1, MAX_PRICED_CHUNKS - 1
        bounds = [round(full * j / n) for j in range(n + 1)]
        strata = [((lo + hi - 1) // 2, hi - lo) for lo, hi in zip(bounds, bounds[1:]) if hi > lo] + [(count - 1, 1)]
    else:
        strata = [(i, 1) for i in range(count)]
    # the chunks share every kernel but the attention core's: without a caller's memo, one for them
    memo = memo or PricingMemo()
    priced = []
    for index, weight in strata:
        new, prefix = prompt_chunk(workload.isl, step, index)
        plan = with_offload(build_step_plan(model, dep, (SequenceBatch(1, new, prefix + new, across_tp=tp > 1),), sms,
                                            stage="prefill", memo=memo), offload)
        priced.append((run_stage(plan, hw, tables, engine, memo), weight))
    return sequential_steps(priced, -(-workload.isl // tp))


def _decode_plan(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload, batch: int,
                 engine: EngineCard, offload: WeightOffload | None = None,
                 memo: PricingMemo | None = None) -> tuple[StagePlan, int]:
    """The decode step of `batch` requests per GPU and the batch its CUDA graph computes: padded up
    to the engine's next captured size (attention reads the real requests' caches only)."""
    padded = engine.graph_padded_batch(batch, hw.peak.hbm_bytes, dep.attention.tp,
                                      server_tp(dep), hw)
    if dep.overlap == "two-batch" and padded % 2:
        padded += 1  # two equal micro-batches
    plan = build_stage_plan("decode", model, dep, workload, padded, hw.derates.deepep_normal_sms, real_batch=batch,
                            memo=memo)
    return with_offload(plan, offload), padded


def run_decode(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload, batch: int,
               tables: KernelTables, engine: EngineCard, offload: WeightOffload | None = None,
               memo: PricingMemo | None = None) -> StageResult:
    """TPOT stage: one decode step of `batch` requests per GPU (see _decode_plan); throughput counts
    the real requests."""
    plan, padded = _decode_plan(model, hw, dep, workload, batch, engine, offload, memo)
    result = run_stage(plan, hw, tables, engine, memo)
    if padded == batch:
        return result
    return replace(result, tokens_per_gpu=batch, padded_batch=padded)


def decode_time(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload, batch: int,
                tables: KernelTables, engine: EngineCard, offload: WeightOffload | None = None,
                memo: PricingMemo | None = None) -> tuple[float, float, Bound]:
    """(TPOT, decode tokens per GPU per second, dominant bound) of run_decode's step, without its
    per-operation results: what a sweep row needs, at a fraction of the cost."""
    plan = _decode_plan(model, hw, dep, workload, batch, engine, offload, memo)[0]
    step, bound = stage_time(plan, hw, tables, engine, memo)
    return step, batch / step, bound  # one token per request per step, the real (unpadded) batch


def decode_time_by_bound(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload, batch: int,
                         tables: KernelTables, engine: EngineCard,
                         memo: PricingMemo | None = None) -> tuple[float, float, dict[Bound, float]]:
    """(TPOT, decode tokens per GPU per second, the step's seconds per bound) of run_decode's step,
    without its per-operation results (a sweep row's time and energy)."""
    plan = _decode_plan(model, hw, dep, workload, batch, engine, None, memo)[0]
    step, by_bound = stage_time_by_bound(plan, hw, tables, engine, memo)
    return step, batch / step, by_bound


def single_request_ttft(prompt_alone: StageResult, engine: EngineCard) -> float:
    """SimulationResult.single_request_ttft_s of a prompt's prefill alone: its step plus the engine's
    API-server time (what a sweep row's TTFT is too)."""
    return prompt_alone.step_time_s + engine.overheads.api_server_latency


def simulate(config: RunConfig, memo: PricingMemo | None = None) -> SimulationResult:
    """One configuration priced plainly, or through `memo` when a caller that runs many (a sweep)
    passes its PricingMemo (the same numbers: tests/test_pricing_memo.py). A request longer than the
    engine's server runs whole is simulated as the server runs it (within_context)."""
    config, shortened = within_context(config)
    model, hw, dep, workload = config.model, config.hardware, config.deployment, config.workload
    speculative = draft = None
    if config.speculative is not None:  # a run without a drafter does not import its module
        from infersim.run.speculative import drafter_memory, run_speculative

        draft = drafter_memory(config)
    memory = memory_budget(model, hw, dep, workload, draft, config.engine,
                           prefill_step_tokens(workload, config.engine, hw, dep), offload=True)
    batch = decode_batch(config, memory)
    offload = memory.weight_offload
    prefill = run_prefill(model, hw, dep, workload, config.tables, config.engine, offload, memo)
    single = _single_prompt_prefill(config, offload, memo)
    if config.speculative is not None:  # never with offload (config refuses the pair)
        prefill, decode, speculative = run_speculative(config, prefill, batch, memo)
    else:
        decode = run_decode(model, hw, dep, workload, batch, config.tables, config.engine, offload, memo)
    warnings = ([shortened] if shortened else []) + _warnings(config, memory, batch, prefill, decode)
    return SimulationResult(config, prefill, decode, memory, tuple(warnings), speculative,
                            tuple(fit_problems(config, memory, batch)), single)


def _single_prompt_prefill(config: RunConfig, offload: WeightOffload | None,
                           memo: PricingMemo | None = None) -> StageResult | None:
    """The prefill of one prompt alone, where the workload's prefill step packs several
    (prefill_tokens_per_gpu); None when the step is one prompt already."""
    single = single_prompt_prefill(config.model, config.hardware, config.deployment, config.workload, config.tables,
                                   config.engine, offload, memo)
    if single is not None and config.speculative is not None:
        from infersim.run.speculative import with_draft_prefill

        one = replace(config.workload, prefill_tokens_per_gpu=0)
        single = with_draft_prefill(replace(config, workload=one), single)[0]
    return single


def single_prompt_prefill(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload,
                          tables: KernelTables, engine: EngineCard, offload: WeightOffload | None = None,
                          memo: PricingMemo | None = None) -> StageResult | None:
    """_single_prompt_prefill of the run's parts, without a speculative drafter (a sweep's fast path)."""
    if not workload.prefill_tokens_per_gpu:
        return None
    one = replace(workload, prefill_tokens_per_gpu=0)
    if prefill_step_tokens(one, engine, hw, dep) == workload.prefill_tokens_per_gpu:
        return None
    return run_prefill(model, hw, dep, one, tables, engine, offload, memo)


def fit_problems(config: RunConfig, memory: MemoryResult, batch: int) -> list[str]:
    """Each memory limit the run breaks, with the numbers: weights against HBM, one request's KV
    cache, the decode batch's KV cache, the prefill step's KV cache."""
    out: list[str] = []
    workload, dep = config.workload, config.deployment
    left = memory.hbm_bytes - memory.reserved_bytes
    served, refused = served_osl(config.model, config.engine, workload.isl, workload.osl)
    if not served:
        out.append(f"{refused}; fix: shorter requests (--isl/--osl), or a model card with a longer context (--set "
                   "model.max_position_embeddings=N where the model takes it, e.g. with rope scaling)")
    offload = memory.weight_offload
    if offload is not None and not offload.fits_host:
        out.append(f"{offload.bytes_per_gpu / GB:,.2f} GB of weights per GPU must stay in host memory, but hardware "
                   f"card {config.hardware.name} has only {offload.host_memory_bytes / GB:,.2f} GB of host memory per "
                   f"GPU (host_memory_bytes): over by {(offload.bytes_per_gpu - offload.host_memory_bytes) / GB:,.2f} GB")
    if offload is not None and not offload.fits_pool:
        resident = memory.resident_weights_bytes
        out.append(f"weights need {memory.weights_bytes / GB:,.2f} GB per GPU; with all {offload.pool_bytes_per_gpu / GB:,.2f} GB "
                   f"of {offload.pool} in host memory (deployment.weight_offload auto) {resident / GB:,.2f} GB stay in HBM, "
                   f"which leaves too little beside the runtime's {memory.reserved_bytes / GB:,.2f} GB and the KV cache "
                   f"the workload needs: short by {(offload.shortfall_bytes - offload.pool_bytes_per_gpu) / GB:,.2f} GB")
        return out
    if memory.binding_limit == "recurrent-state pool" and memory.max_batch_per_gpu < 1:
        out.append(state_pool_problem(config, memory))
        return out
    if memory.kv_capacity_bytes <= 0:
        out.append(_weights_problem(config, memory))
        return out
    capacity = memory.kv_capacity_bytes
    per_request = memory.request_bytes_per_gpu * dep.attention.tp * dep.pp
    if memory.max_batch_per_gpu < 1:
        out.append(f"one request of {memory.request_context:,} tokens needs {per_request / GB:,.2f} GB of KV cache per GPU, "
                   f"but {capacity / GB:,.2f} GB are left after the weights: over by {(per_request - capacity) / GB:,.2f} GB"
                   f"{kv_pool_said(config, memory)}; fix: shorter requests (--isl/--osl), an fp8 KV cache (--kv-cache-dtype fp8), or "
                   f"{_more_gpus_hint(config, memory, left, per_request).removeprefix('fix: ')}")
    else:
        out.extend(pool_problem(config, memory))
    if memory.max_batch_per_gpu >= 1 and batch > memory.kv_fit_batch_per_gpu:
        # also 'max' under two-batch overlap when only 1 request fits
        need = batch * per_request
        fit = memory.kv_fit_batch_per_gpu
        if need <= capacity:  # the KV cache holds the batch; the state pool does not
            pool = memory.state_pool
            assert pool is not None
            what = (f"decode batch {batch:,} per GPU is more than {config.engine.name}'s recurrent-state pool holds: "
                    f"{counted(pool.requests, 'running request')} per scheduler of {dep.attention.tp * dep.pp} GPUs "
                    f"({counted(pool.slots, 'state slot')}, {counted(pool.slots_per_request, 'slot')} a request; "
                    "engine card memory.recurrent_state_pool)")
        else:
            what = (f"decode batch {batch:,} per GPU needs {need / GB:,.2f} GB of KV cache per GPU "
                    f"({memory.request_context:,} tokens each), but {capacity / GB:,.2f} GB are left after the weights: "
                    f"over by {(need - capacity) / GB:,.2f} GB")
        out.append(f"{what}; at most {counted(fit, 'request')} per GPU fit{'s' if fit == 1 else ''}; fix: a batch of at "
                   f"most {fit:,} per GPU (--batch-per-gpu {fit}, or leave the batch unset: the largest that fits)")
    prefill_kv = workload.prefill_tokens * memory.pool_token_bytes_per_gpu * dep.attention.tp * dep.pp
    if prefill_kv > capacity:
        out.append(f"a prefill step of {workload.prefill_tokens:,} prompt tokens per GPU needs {prefill_kv / GB:,.2f} GB of "
                   f"KV cache per GPU, but {capacity / GB:,.2f} GB are left after the weights: over by "
                   f"{(prefill_kv - capacity) / GB:,.2f} GB")
    return out


def _gpus_for(gpus: int, need: float, have: float) -> int:
    """GPUs over which `need` bytes per GPU on `gpus` GPUs shrink to what one GPU has (`have`):
    the next power of two of gpus x need / have (layouts come in powers of two). A first guess:
    what does not shard (embeddings, the runtime's reserve) is taken as sharding."""
    exact = max(gpus, math.ceil(gpus * need / have)) if have > 0 else 2 * gpus
    return 1 << (exact - 1).bit_length()


#: GPUs past which no "more GPUs" fix is offered: the largest clusters hold about 10^5 GPUs, and a
#: model that needs more than ten times that is not one a layout change makes fit
MOST_GPUS_ADVISED = 1_000_000


def state_pool_problem(config: RunConfig, memory: MemoryResult) -> str:
    """Why the engine's pool of recurrent-state slots leaves no request per GPU: it takes the whole KV
    space, or holds fewer running requests than a scheduler has GPUs."""
    pool = memory.state_pool
    assert pool is not None
    dep = config.deployment
    said = (f"{config.engine.name}'s recurrent-state pool ({counted(pool.slots, 'slot')}, "
            f"{pool.held_bytes_per_gpu / GB:,.2f} GB per GPU; engine card memory.recurrent_state_pool)")
    if memory.kv_capacity_bytes <= 0:
        return (f"{said} leaves no KV cache space beside the weights: over by {-memory.kv_capacity_bytes / GB:,.2f} GB; "
                "fix: more GPUs")
    if pool.requests < 1:
        return (f"{said} holds no running request: a request holds {counted(pool.slots_per_request, 'slot')}; "
                "fix: more memory per GPU")
    gpus = dep.attention.tp * dep.pp
    return (f"{said} holds {counted(pool.requests, 'running request')} per scheduler, fewer than its {gpus} GPUs "
            "(attention TP x PP): under one request per GPU; fix: a smaller attention TP, or more memory per GPU")


def _weights_problem(config: RunConfig, memory: MemoryResult) -> str:
    """The weights against the HBM the runtime leaves, with a fix computed from the need (or none)."""
    left = memory.hbm_bytes - memory.reserved_bytes
    need = f"weights need {memory.weights_bytes / GB:,.2f} GB per GPU"
    if left <= 0:  # the reserve alone fills the HBM: no free memory to report, and more weight room fixes nothing
        text = (f"{need}, but the runtime's reserve alone is {memory.reserved_bytes / GB:,.2f} GB, more than the "
                f"{memory.hbm_bytes / GB:,.2f} GB of HBM")
        if memory.activation_bytes > memory.hbm_bytes / 2:
            text += (f" ({memory.activation_bytes / GB:,.2f} GB of it the activations of a prefill step of "
                     f"{memory.prefill_step_tokens:,} tokens); fix: fewer prompt tokens per prefill step "
                     "(workload.prefill_tokens_per_gpu)")
        return text
    return (f"{need}, but only {left / GB:,.2f} GB of the {memory.hbm_bytes / GB:,.2f} GB HBM are left after the "
            f"runtime's {memory.reserved_bytes / GB:,.2f} GB: over by {(memory.weights_bytes - left) / GB:,.2f} GB; "
            + _more_gpus_hint(config, memory, left))


def _more_gpus_hint(config: RunConfig, memory: MemoryResult, left: float, kv_bytes: float = 0.0) -> str:
    """How to make the weights (and `kv_bytes` of KV cache per GPU) fit: the GPUs that would hold them
    (about) and a layout of them, or a narrower format where that alone is enough; no fix where none
    is in reach."""
    dep, model = config.deployment, config.model
    room = memory.weights_bytes * 1.25 + kv_bytes  # 1.25: room for some KV cache
    gpus = _gpus_for(dep.num_gpus, room, left)
    narrow = dep.precision.weight_dtype in ("fp8", "int8", "int4", "fp4")
    fp8 = "" if narrow or memory.weights_bytes / 2 + kv_bytes > left else ", or fp8 weights (--precision fp8)"
    if gpus > MOST_GPUS_ADVISED:
        return (f"no fix offered: about {gpus:,.3g} x {config.hardware.name} would hold them, more than "
                f"{MOST_GPUS_ADVISED:,} GPUs")
    tp = min(gpus, config.hardware.peak.gpus_per_node)
    pp = gpus // tp
    layout = f"--num-gpus {gpus} --tp {tp}" + (f" --pp {pp}" if pp > 1 else "")
    example = f" (e.g. {layout})" if model.num_hidden_layers % pp == 0 else ""
    return f"fix: more GPUs, about {gpus:,} x {config.hardware.name}{example}{fp8}"


def _table_device_mismatch(config: RunConfig) -> str:
    """A warning when the kernel tables were measured on another GPU than the hardware card's."""
    provenance = getattr(config.tables, "provenance", None)
    if provenance is None:
        return ""
    device = "".join(ch for ch in provenance.device.name.lower() if ch.isalnum())
    model_tokens = [t for t in config.hardware.name.lower().split("-") if any(ch.isdigit() for ch in t)]
    if model_tokens and all(token in device for token in model_tokens[:1]):
        return ""
    return (f"kernel tables measured on {provenance.device.name} are used for hardware card {config.hardware.name}: "
            "table times are that device's, not this one's")


def _warnings(config: RunConfig, memory: MemoryResult, batch: int, *stages: StageResult) -> list[str]:
    out: list[str] = []
    workload = config.workload
    if config.tables_note:
        out.append(config.tables_note)
    if isinstance(config.tables, NoTables):
        out.append("no measured MFU tables in use: every kernel time is a roofline estimate "
                   "(max of compute and memory time with the hardware card's derates, plus launch overhead)")
    else:
        # tables cover GEMMs, grouped GEMMs and attention; elementwise kernels are always roofline
        fallback = sorted({op.name for s in stages for op in s.operations if op.source == Source.ROOFLINE
                           and op.flops > 0 and op.module not in cat.COMMUNICATION
                           and op.module not in (cat.ELEMENTWISE, cat.EMBEDDING)
                           and not op.detail.startswith("outside table")})
        if fallback:
            out.append("no table covers these kernels, roofline fallback used: " + ", ".join(fallback))
        mismatch = _table_device_mismatch(config)
        if mismatch:
            out.append(mismatch)
        edges = sorted({op.detail for s in stages for op in s.operations if op.detail.startswith("outside table")})
        out.extend(edges)
    # memory limits the run breaks are not warnings: they are SimulationResult.unfit
    if memory.running_cap_per_gpu and memory.running_cap_per_gpu < batch <= memory.kv_fit_batch_per_gpu:
        out.append(f"decode batch {batch:,} per GPU is above {config.engine.name}'s default running-request cap "
                   f"({memory.running_cap_per_gpu:,} per GPU): a server runs it {larger_cap(config.engine)}")
    out.extend(context_warnings(config))
    out.extend(encoder_note(config.model, config.engine))
    if workload.decode_batch_per_gpu == "max":
        limit = ("the engine's running-request cap" if memory.binding_limit == "running-request cap"
                 else "what fits in memory")
        out.append(f"decode batch per GPU: the largest the run allows ({batch}: {limit}"
                   + ("; even, for two-batch overlap)" if config.deployment.overlap == "two-batch" else ")")
                   + "; --batch-per-gpu or workload.decode_batch_per_gpu fixes it")
    rest = workload.prefill_tokens % workload.isl
    if rest and workload.prefill_tokens > workload.isl:
        out.append(f"prefill tokens per GPU ({workload.prefill_tokens}) is not a multiple of ISL ({workload.isl}): "
                   f"the last {rest} tokens are modelled as one shorter sequence")
    return out
