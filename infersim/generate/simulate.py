"""Simulate one static-batch generation: prefill, then gen_len - 1 decode steps at growing KV length.

Every forward pass is a core StagePlan timed by the core engine (so kernels, tables and derates are
the same as for `infersim run`); this module adds what a whole-request, possibly offloaded,
generation needs on top: the KV length of each decode step, the bytes each layer fetches over PCIe,
dequantization of weight-only quantized weights that arrive from the host, the prefetch schedule,
and the memory the run needs on the GPU and on the host.

Definitions (DeepSpeed ZeRO-Inference / FlexGen benchmark):
    prefill throughput = batch * prompt_len / prefill latency
    decode throughput  = batch * (gen_len - 1) / decode latency   (the first token comes from prefill)
    total throughput   = batch * gen_len / total latency,  total = prefill + decode
    model size  = parameters x 2 bytes (the 16-bit checkpoint, whatever the stored format)
    cache size  = KV bytes of batch x (prompt_len + gen_len) tokens
    hidden size = batch x (prompt_len + gen_len) x hidden_size x 2 bytes (one layer's activations)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infersim.run.config import RunConfig
from infersim.cards.deployment import Deployment, Workload, attention_dp
from infersim.costing.memo import PricingMemo
from infersim.engine.stage import StageResult, run_stage
from infersim.base.errors import InferSimError, NotPossible
from infersim.costing.host_transfer import (
    PassUnit,
    is_weight_only_quantized,
    prefetch_schedule,
    stored_bytes_per_weight,
    transfer_seconds,
    weight_elements,
)
from infersim.generate.spec import GenerateSpec
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape, MemoryBoundShape, NoTables
from infersim.cards.model import FULL_ATTENTION
from infersim.run.memory import kv_bytes_per_token, total_parameters
from infersim.run.request_limits import context_warnings, served_osl
from infersim.cards import categories as cat
from infersim.modules.step import build_stage_plan, build_step_plan
from infersim.shapes.plan import LayerGroup, SequenceBatch, StagePlan
from infersim.costing.timing import kernel_cost
from infersim.base.units import GB, dtype_bytes
from infersim.costing.weight_offload import host_link_bytes_per_s

ACT_BYTES = 2.0  # activations and the benchmark's 16-bit sizes
LOGIT_BYTES = 4.0  # the runtime upcasts the last position's logits to fp32 for sampling


class DoesNotFit(NotPossible):
    """The batch or the model does not fit GPU (+ host) memory; the message gives the numbers."""


@dataclass(frozen=True)
class PassResult:
    """One forward pass: the prefill, or one decode step."""

    stage: str
    kv_len: int  # positions attended by the newest token
    seconds: float  # wall time of the pass, overlap and scheduler overhead included
    compute_s: float  # GPU time summed over units (dequantization included)
    h2d_s: float  # host-to-device transfer time summed over units
    d2h_s: float  # device-to-host transfer time summed over units
    overhead_s: float  # framework time per pass (hardware card)
    h2d_bytes: float  # weights + past KV fetched
    d2h_bytes: float  # new KV written back

    @property
    def bound(self) -> str:
        """What a faster machine would have to improve: the host link or the GPU."""
        return "transfer" if self.h2d_s > self.compute_s else "compute"


@dataclass(frozen=True)
class GenerationMemory:
    """Sizes in bytes. Benchmark sizes are for the whole batch; the rest per GPU."""

    model_bytes: float
    cache_bytes: float
    hidden_bytes: float
    weights_stored_bytes: float  # one GPU's share of the weights in their stored format (+ group scales)
    gpu_weights_bytes: float  # resident weights, or the fetch buffers of two units (+ a dequantized copy)
    gpu_kv_bytes: float  # the whole KV cache, or two layers' worth while it streams
    gpu_activation_bytes: float  # prefill working set (residual stream, largest GEMM in/out, fp32 logits)
    gpu_usable_bytes: float  # HBM less what the runtime reserves
    host_weights_bytes: float
    host_kv_bytes: float
    host_capacity_bytes: float
    nvme_weights_bytes: float

    @property
    def peak_gpu_bytes(self) -> float:
        return self.gpu_weights_bytes + self.gpu_kv_bytes + self.gpu_activation_bytes

    @property
    def host_bytes(self) -> float:
        return self.host_weights_bytes + self.host_kv_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.peak_gpu_bytes <= self.gpu_usable_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes <= self.host_capacity_bytes or self.host_bytes == 0


@dataclass(frozen=True)
class GenerationResult:
    config: RunConfig
    spec: GenerateSpec  # resolved: batch and lengths are set
    memory: GenerationMemory
    prefill: PassResult
    decode_steps: tuple[PassResult, ...]
    pcie_bytes_per_s: float  # achievable host-to-device bandwidth used for streaming
    nvme_bytes_per_s: float  # 0 unless weights stream from NVMe
    dequantize: str  # "" or "int4 -> fp16": what the GPU does to streamed weights before the GEMMs
    notes: tuple[str, ...]

    @property
    def batch(self) -> int:
        return int(self.spec.batch or 0)

    @property
    def prompt_len(self) -> int:
        return int(self.spec.prompt_len or 0)

    @property
    def gen_len(self) -> int:
        return int(self.spec.gen_len or 0)

    @property
    def decode_method(self) -> str:
        return "step-by-step"  # every decode step is timed at its own KV length; no averaging

    @property
    def prefill_latency_s(self) -> float:
        return self.prefill.seconds

    @property
    def decode_latency_s(self) -> float:
        return sum(step.seconds for step in self.decode_steps)

    @property
    def total_latency_s(self) -> float:
        return self.prefill_latency_s + self.decode_latency_s

    @property
    def prefill_throughput(self) -> float:
        return self.batch * self.prompt_len / self.prefill_latency_s

    @property
    def decode_throughput(self) -> float | None:
        """None when gen_len is 1: there are no decode steps to divide by."""
        if not self.decode_steps:
            return None
        return self.batch * (self.gen_len - 1) / self.decode_latency_s

    @property
    def total_throughput(self) -> float:
        return self.batch * self.gen_len / self.total_latency_s


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Streaming:
    """How weights and KV move for this run (derived once from config and spec)."""

    weights_offloaded: bool
    kv_offloaded: bool
    stored_bpw: float  # stored bytes per weight, group scales included
    dequant_bpw: float  # bytes per weight written by dequantization (0: no dequantization)
    pcie: float  # achievable bytes/s host to device (and back)
    nvme: float  # bytes/s, 0 unless weights come from NVMe


def _compute_deployment(config: RunConfig, gen: GenerateSpec) -> Deployment:
    """The deployment the GEMMs run with: one batch (no two-batch overlap); weights that stream in
    quantized are dequantized to the GEMM format first, so the GEMMs read 16-bit weights."""
    dep = replace(config.deployment, overlap="none")
    prec = dep.precision
    if gen.weights_offloaded and is_weight_only_quantized(prec.weight_dtype, prec.gemm):
        dep = replace(dep, precision=replace(prec, weights=prec.gemm))
    return dep


def _streaming(config: RunConfig, gen: GenerateSpec) -> _Streaming:
    hw, prec = config.hardware, config.deployment.precision
    quantized = is_weight_only_quantized(prec.weight_dtype, prec.gemm)
    return _Streaming(
        weights_offloaded=gen.weights_offloaded,
        kv_offloaded=gen.kv_offloaded,
        stored_bpw=stored_bytes_per_weight(prec.weight_dtype, prec.gemm, gen.quant_group_size, gen.quant_group_bytes),
        dequant_bpw=dtype_bytes(prec.gemm) if (quantized and gen.weights_offloaded) else 0.0,
        pcie=host_link_bytes_per_s(hw),
        nvme=hw.nvme_bandwidth if (gen.weights_offloaded and gen.offload_device == "nvme") else 0.0,
    )


def _embedding_elements(config: RunConfig) -> float:
    model = config.model
    return model.vocab_size / config.deployment.attention.tp * model.hidden_size


def _unit_weights(plan: StagePlan, config: RunConfig) -> dict[str, tuple[float, int]]:
    """(weight elements, weight matrices) per unit name: each layer group, embedding, lm_head."""
    out: dict[str, tuple[float, int]] = {}
    for group in plan.groups:
        ops = [op for op in group.operations if weight_elements(op.shape) > 0]
        out[group.name] = (sum(weight_elements(op.shape) * op.count for op in ops), sum(op.count for op in ops))
    head = [op for op in plan.per_step if weight_elements(op.shape) > 0]
    out["embedding"] = (_embedding_elements(config), 1)
    out["lm_head"] = (sum(weight_elements(op.shape) * op.count for op in head), len(head))
    return out


def _layer_kv_bytes(group: LayerGroup) -> tuple[float, float]:
    """(past, new) KV-cache bytes one layer of `group` holds on one GPU in this pass, read off its
    attention kernels: every sequence's cached positions before this pass (a sliding window keeps at
    most `window`), and the positions this pass adds. Layers without attention kernels (linear
    attention, Mamba) keep a fixed-size state on the GPU and stream nothing."""
    past = new = 0.0
    for op in group.operations:
        s = op.shape
        if isinstance(s, AttentionShape):
            per_position = s.batch * s.kv_elements_per_token * dtype_bytes(s.kv_dtype) * op.count
            cached = min(s.kv_len, s.window) if s.window else s.kv_len
            past += max(cached - s.q_len, 0) * per_position
            new += s.q_len * per_position
    return past, new


def _pass(stage: str, plan: StagePlan, result: StageResult, config: RunConfig, gen: GenerateSpec,
          stream: _Streaming, kv_len: int) -> PassResult:
    """Time one pass: units in order (embedding, layers, LM head), each waiting for its fetch."""
    hw, tables = config.hardware, config.tables
    weights = _unit_weights(plan, config)
    compute: dict[str, float] = {}
    overhead = 0.0
    for op in result.operations:
        if op.group != "per step":
            compute[op.group] = compute.get(op.group, 0.0) + op.time_per_layer_s
        elif op.module == cat.OVERHEAD:
            overhead += op.time_s
        elif op.module == cat.EMBEDDING:
            compute["embedding"] = compute.get("embedding", 0.0) + op.time_s
        else:
            compute["lm_head"] = compute.get("lm_head", 0.0) + op.time_s

    def unit(name: str, group: LayerGroup | None) -> PassUnit:
        elements, matrices = weights[name]
        seconds = compute.get(name, 0.0)
        w_bytes = elements * stream.stored_bpw if stream.weights_offloaded else 0.0
        if stream.dequant_bpw and elements:
            seconds += kernel_cost(MemoryBoundShape("dequantize streamed weights",
                                                    elements * (stream.stored_bpw + stream.dequant_bpw),
                                                    kernels=max(matrices, 1)), hw, tables).seconds
        kv_in, kv_out = _layer_kv_bytes(group) if (group is not None and stream.kv_offloaded) else (0.0, 0.0)
        return PassUnit(name, seconds, transfer_seconds(w_bytes, kv_in, stream.pcie, stream.nvme),
                        kv_out / stream.pcie, w_bytes, kv_in, kv_out)

    units = [unit("embedding", None)]
    for group in plan.groups:
        units += [unit(group.name, group)] * group.layers
    units.append(unit("lm_head", None))
    seconds = prefetch_schedule(units, gen.prefetch) + overhead
    return PassResult(stage, kv_len, seconds, sum(u.compute_s for u in units), sum(u.h2d_s for u in units),
                      sum(u.d2h_s for u in units), overhead, sum(u.weight_bytes + u.kv_bytes for u in units),
                      sum(u.kv_out_bytes for u in units))


def _memory(config: RunConfig, gen: GenerateSpec, plan: StagePlan, stream: _Streaming) -> GenerationMemory:
    model, hw, dep = config.model, config.hardware, config.deployment
    batch, context = int(gen.batch or 0), int(gen.prompt_len or 0) + int(gen.gen_len or 0)
    weights = _unit_weights(plan, config)
    per_unit = {name: elements for name, (elements, _m) in weights.items()}
    layer_elements = sum(per_unit[g.name] * g.layers for g in plan.groups)
    # a tied LM head is the embedding matrix: stored once, fetched twice
    head = 0.0 if model.tie_word_embeddings else per_unit["lm_head"]
    stored = (layer_elements + per_unit["embedding"] + head) * stream.stored_bpw
    largest = max(per_unit.values())
    if stream.weights_offloaded:
        # two fetch buffers (never more than the whole model) and the dequantized copy of one unit
        gpu_weights = min(2 * largest * stream.stored_bpw, stored) + largest * stream.dequant_bpw
    else:
        gpu_weights = stored
    # one GPU holds its heads' share of the KV of every sequence of its attention TP group
    sequences = replica_batch(config, gen)
    kv_all = kv_bytes_per_token(model, dep.precision.kv_cache, dep.attention.tp) * sequences * context
    # kv_bytes_per_token counts the layers whose KV grows with the context: the full-attention ones
    # (transformers keeps a window or a chunk of the sliding and chunked layers), of the plan's layers
    kv_layers = model.layer_count(FULL_ATTENTION) * sum(g.layers for g in plan.groups) // model.num_hidden_layers
    gpu_kv = min(2 * kv_all / max(kv_layers, 1), kv_all) if stream.kv_offloaded else kv_all  # two layers in flight
    # prefill working set: residual stream and its normalised copy, plus the largest kernel's input + output
    tokens = plan.tokens_per_gpu * dep.attention.tp
    biggest = 0.0
    for group in plan.groups:
        for op in group.operations:
            s = op.shape
            if isinstance(s, GemmShape):
                biggest = max(biggest, s.m * (s.k + s.n) * ACT_BYTES)
            elif isinstance(s, GroupedGemmShape):
                biggest = max(biggest, s.routed_tokens * (s.k + s.n) * ACT_BYTES)
    for op in plan.per_step:
        if isinstance(op.shape, GemmShape):
            biggest = max(biggest, op.shape.m * (op.shape.k * ACT_BYTES + op.shape.n * LOGIT_BYTES))
    activations = 2 * tokens * model.hidden_size * ACT_BYTES + biggest
    offloaded_weights = stored if stream.weights_offloaded else 0.0
    return GenerationMemory(
        model_bytes=total_parameters(model) * ACT_BYTES,
        cache_bytes=kv_bytes_per_token(model, dep.precision.kv_cache) * batch * context,
        hidden_bytes=batch * context * model.hidden_size * ACT_BYTES,
        weights_stored_bytes=stored,
        gpu_weights_bytes=gpu_weights,
        gpu_kv_bytes=gpu_kv,
        gpu_activation_bytes=activations,
        gpu_usable_bytes=hw.peak.hbm_bytes - config.engine.memory.reserved_bytes,
        host_weights_bytes=offloaded_weights if gen.offload_device == "cpu" else 0.0,
        host_kv_bytes=kv_all if stream.kv_offloaded else 0.0,
        host_capacity_bytes=hw.host_memory_bytes,
        nvme_weights_bytes=offloaded_weights if gen.offload_device == "nvme" else 0.0,
    )


def _gb(nbytes: float) -> str:
    """GB with two decimals; small sizes (toy cards) keep three significant digits instead of 0.00."""
    value = nbytes / GB
    return f"{value:.2f} GB" if abs(value) >= 0.01 or value == 0 else f"{value:.3g} GB"


def check_fits(memory: GenerationMemory, config: RunConfig, gen: GenerateSpec) -> None:
    """Raise DoesNotFit, with the numbers, when GPU or host memory is too small (both said at once)."""
    hw = config.hardware
    problems = []
    if not memory.fits_gpu:
        problems.append(
            f"GPU memory needs {_gb(memory.peak_gpu_bytes)} per GPU (weights {_gb(memory.gpu_weights_bytes)}, "
            f"KV cache {_gb(memory.gpu_kv_bytes)}, activations {_gb(memory.gpu_activation_bytes)}) but "
            f"{hw.name} has {_gb(memory.gpu_usable_bytes)} usable ({_gb(hw.peak.hbm_bytes)} less "
            f"{_gb(config.engine.memory.reserved_bytes)} the {config.engine.name} runtime reserves)")
    if not memory.fits_host:
        problems.append(
            f"host memory needs {_gb(memory.host_bytes)} per GPU (offloaded weights "
            f"{_gb(memory.host_weights_bytes)}, offloaded KV cache {_gb(memory.host_kv_bytes)}) but "
            f"{hw.name} gives {_gb(memory.host_capacity_bytes)} (host_memory_bytes)")
    served, refused = served_osl(config.model, config.engine, int(gen.prompt_len or 1), int(gen.gen_len or 1))
    if not served:
        problems.append(refused)
    if not problems:
        return
    hints = []
    if not memory.fits_gpu and not gen.weights_offloaded:
        hints.append("offload the weights")
    if not memory.fits_gpu and not gen.kv_offloaded:
        hints.append("offload the KV cache")
    if not memory.fits_host and gen.weights_offloaded and gen.offload_device == "cpu":
        hints.append("stream the weights from NVMe (offload_device: nvme)")
    if not (memory.fits_gpu and memory.fits_host):
        hints.append("lower the batch")
    if not served:
        hints.append("shorter prompts or generations (--prompt-len, --gen-len)")
    raise DoesNotFit(f"does not fit ({config.model.name}, batch {gen.batch} x {gen.prompt_len}+{gen.gen_len} tokens): "
                     + "; ".join(problems) + ". Try: " + ", or ".join(hints))


def _with_lengths(config: RunConfig, gen: GenerateSpec) -> RunConfig:
    """`config` with the generation's prompt and output lengths as its workload's (for the context checks)."""
    return replace(config, workload=replace(config.workload, isl=int(gen.prompt_len or 1), osl=int(gen.gen_len or 1)))


def within_context(config: RunConfig, gen: GenerateSpec) -> tuple[GenerateSpec, str]:
    """The generation as the engine runs it: gen_len cut to what the engine's server runs where the
    request is longer than it runs whole (said in the notes; run.request_limits.served_osl), else as given
    (a refused request does not fit: check_fits)."""
    prompt, asked = int(gen.prompt_len or 1), int(gen.gen_len or 1)
    served, said = served_osl(config.model, config.engine, prompt, asked)
    if not served or served == asked:
        return gen, ""
    return replace(gen, gen_len=served), f"{said}: gen_len {served:,} simulated, not the {asked:,} asked for"


def _notes(config: RunConfig, gen: GenerateSpec, stream: _Streaming, steps: int, shortened: str = "") -> list[str]:
    prec = config.deployment.precision
    out = [shortened] if shortened else []
    out.append(f"decode timed step by step: {steps} steps at KV length {gen.prompt_len + 1}..{gen.prompt_len + steps}"
               if steps else "gen_len 1: the only token comes from prefill; no decode steps")
    out.extend(context_warnings(_with_lengths(config, gen)))
    if gen.offload:
        out.append(f"host link: {stream.pcie / GB:.1f} GB/s achievable host-to-device (pcie_bandwidth "
                   f"{config.hardware.peak.pcie_bandwidth / GB:.0f} GB/s x pcie_efficiency "
                   f"{config.hardware.derates.pcie_efficiency:g})"
                   + (f"; weights read from NVMe at {stream.nvme / GB:.1f} GB/s" if stream.nvme else "")
                   + ("; next layer prefetched during compute" if gen.prefetch else "; no prefetch"))
    if gen.offload_device == "nvme" and not gen.weights_offloaded:
        out.append("offload_device nvme not used: no weights are offloaded"
                   + (" (the KV cache is offloaded to CPU memory)" if gen.kv_offloaded else ""))
    if stream.dequant_bpw:
        out.append(f"{prec.weight_dtype} weights stream with their group scales ({stream.stored_bpw:.4g} bytes/weight) "
                   f"and are dequantized to {prec.gemm} on the GPU before the GEMMs")
    elif stream.stored_bpw != dtype_bytes(prec.weight_dtype):
        out.append(f"{prec.weight_dtype} weights on the GPU: fused weight-only GEMMs "
                   f"({stream.stored_bpw:.4g} bytes/weight with group scales)")
    tp, sequences = config.deployment.attention.tp, replica_batch(config, gen)
    if sequences % tp:
        # the core prices whole token rows per GPU: the group's GEMMs carry a multiple of tp rows
        prompt_rows = sequences * int(gen.prompt_len or 0)
        rows = [f"{-(-prompt_rows // tp) * tp} prefill rows for {prompt_rows:,} prompt tokens"] if prompt_rows % tp else []
        if steps:
            rows.append(f"{-(-sequences // tp) * tp} rows per decode step")
        if rows:
            out.append(f"each attention-TP group of {tp} GPUs runs {sequences} of the batch's sequences (not a multiple "
                       f"of {tp}): attention is priced for them, the GEMMs for " + " and ".join(rows)
                       + " (whole rows per GPU)")
    if config.deployment.overlap != "none":
        out.append("two-batch overlap in the config is not used: a static-batch generation runs one batch")
    if isinstance(config.tables, NoTables):
        out.append("no measured MFU tables in use: every kernel time is a roofline estimate")
    return out


def replica_batch(config: RunConfig, gen: GenerateSpec) -> int:
    """Sequences one attention-DP replica runs: the batch is split over the replicas only (each
    attention-TP group runs all of its replica's; spec.resolve_spec checked that they divide)."""
    return int(gen.batch or 0) // attention_dp(config.deployment)


def _pass_plan(stage: str, config: RunConfig, dep: Deployment, gen: GenerateSpec, kv_len: int, sms: int,
               memo: PricingMemo | None = None) -> StagePlan:
    """The plan of one pass over a replica's sequences (prefill: kv_len = prompt_len; decode: the
    positions the newest token attends). The core's unit is one GPU's equal share; where the
    replica's sequences do not divide over its attention-TP group they are given as the group's
    (SequenceBatch across_tp): attention runs each of them, and each GPU's GEMM rows are the group's
    tokens over tp rounded up (said in the notes)."""
    model, tp, sequences = config.model, dep.attention.tp, replica_batch(config, gen)
    if sequences % tp == 0:
        if stage == "prefill":
            return build_stage_plan("prefill", model, dep, Workload(isl=kv_len, osl=int(gen.gen_len or 0)),
                                    sequences // tp * kv_len, sms)
        # the core's decode step attends ISL + OSL/2 positions: ISL = kv_len - 1, OSL = 2 gives exactly kv_len
        return build_stage_plan("decode", model, dep, Workload(isl=kv_len - 1, osl=2), sequences // tp, sms, memo=memo)
    q_len = kv_len if stage == "prefill" else 1
    # a static KV cache is allocated as the core's decode step allocates it for the same workload
    capacity = kv_len + 1 if stage == "decode" and dep.model_code.kv_cache == "static" else 0
    group = SequenceBatch(sequences, q_len, kv_len, across_tp=True, kv_capacity=capacity)
    return build_step_plan(model, dep, (group,), sms, stage="prefill" if stage == "prefill" else "decode", memo=memo)


def simulate_generation(config: RunConfig, gen: GenerateSpec) -> GenerationResult:
    """Prefill of batch x prompt_len tokens, then gen_len - 1 decode steps, each at its own KV length.
    `gen` must be resolved (spec.resolve_spec). Raises DoesNotFit when memory is too small. A request
    longer than the engine's server runs whole runs as the server runs it (within_context)."""
    gen, shortened = within_context(config, gen)
    if not gen.batch or not gen.prompt_len or not gen.gen_len:
        raise InferSimError("generate: batch, prompt_len and gen_len must be set (resolve the spec first)")
    prec = config.deployment.precision
    expert_format = prec.expert_weights
    if expert_format and expert_format != prec.weight_dtype and config.model.is_moe:
        # weight bytes here are weight elements x one stored format: a mixed model would be misreported
        raise InferSimError(f"generate: routed experts stored {expert_format} and other weights {prec.weight_dtype} "
                            "(deployment.precision.expert_weights) are not modelled for whole generations yet; "
                            "use one weight format (--weights) or `infersim --config` for steady-state numbers")
    hw, tables = config.hardware, config.tables
    dep = _compute_deployment(config, gen)
    stream = _streaming(config, gen)
    sms = hw.derates.deepep_normal_sms
    plan = _pass_plan("prefill", config, dep, gen, gen.prompt_len, sms)
    memory = _memory(config, gen, plan, stream)
    check_fits(memory, config, gen)
    prefill = _pass("prefill", plan, run_stage(plan, hw, tables, config.engine), config, gen, stream, gen.prompt_len)
    steps = []
    memo = PricingMemo()  # the decode steps share all but their attention core
    for j in range(1, gen.gen_len):
        kv_len = gen.prompt_len + j  # the prompt, the first token from prefill, and the j - 1 decoded since
        step_plan = _pass_plan("decode", config, dep, gen, kv_len, sms, memo)
        steps.append(_pass("decode", step_plan, run_stage(step_plan, hw, tables, config.engine, memo), config, gen,
                           stream, kv_len))
    return GenerationResult(config, gen, memory, prefill, tuple(steps), stream.pcie, stream.nvme,
                            f"{config.deployment.precision.weight_dtype} -> {config.deployment.precision.gemm}"
                            if stream.dequant_bpw else "", tuple(_notes(config, gen, stream, len(steps), shortened)))
