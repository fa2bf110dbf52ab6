"""Kernel tables learned from a trace: `infersim mfu from-trace TRACE --config RUN.yaml --out DIR`.

A trace recorded with `record_shapes=True` says, for every GEMM, attention, grouped-GEMM and
elementwise operator, its input shapes and (through the kernels it launched) how long it ran on this
GPU; its CPU side says how long the host took to launch them. That is a kernel table measured with
the user's own engine, library versions, clocks and host. This module turns it into a table
directory in the project's format (mfu_tables/FORMAT.md), keyed by the shapes the simulator asks for:

1. The trace is read as a traced run (infersim.trace.traced_run): measured as `compare --trace`
   measures it (steps, stages, modules), every kernel tied to the CPU operator call that launched
   it, a call's time the sum of its kernels.
2. The simulator's plan of each traced stage is built for the run config at the traced shapes
   (batch and lengths from the recorded shapes), with the engine's model code (separate or fused
   projections, eager or fused elementwise kernels). Each of its GEMMs is matched to traced GEMMs
   with the same K: the same N directly (one to one where the plan has separate projections, as HF
   transformers runs them), or, where the plan fuses what the traced engine ran separately (an SGLang
   or vLLM run config on an HF trace: q, k and v; gate and up), several traced GEMMs of the same
   module whose N add up to it: the row's time is their sum, noted. Rows are written at every M the
   trace ran the GEMM at.
3. Attention rows take the run's head layout (the simulator's key) and the traced batch and
   lengths: a prefill call over B sequences of S tokens becomes the one-sequence row at S with a
   B-th of the time (the table's prefill convention); a decode call a row at its batch and KV length.
4. Grouped-GEMM rows (routed experts) take the traced rows / top-k as tokens per GPU.
5. Elementwise rows (the bench's `elementwise` family): every eager ATen kernel of the steps keyed by
   its launching operator and recorded inputs (`operators.elementwise_dims`: aten::pow -> pow,
   aten::_to_copy to fp32 -> to_fp32, a same-shape aten::mul -> mul, a broadcast one -> mul_broadcast,
   aten::cat -> cat, ...) as (op, dtype, elements, bytes), its kernels' time the latency. Where a trace
   gives no such rows (no recorded shapes, or Triton kernels fused by Inductor, which no op names),
   the measured elementwise time against the simulator's elementwise bytes gives the share of HBM
   bandwidth they reached instead (`elementwise_memory_efficiency`), announced as that fallback.
6. Host costs (`launch_cpu`, `step_cpu`, the fields `mfu bench`'s host probes write) from the CPU side
   (trace.host): launch_cpu = the host's time between consecutive launches inside the decoder layers,
   its waits for the GPU taken out; step_cpu = a step's host work in its CPU extent (the user's region
   or the forward frame) beyond its launches at launch_cpu each, on decode steps. Engines whose card
   takes host costs from tables (HF transformers) then price a CPU-bound eager step from the host
   that recorded the trace; the provenance names that trace.

Provenance: the trace file, the device from `deviceProperties`, the trace's date
(`baseTimeNanoseconds`), the command, how each row was derived, what could not be learned (no
recorded shapes, CUDA-graph replays without operators, plan GEMMs the trace did not run).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from infersim.cards import categories as cat
from infersim.run.config import RunConfig
from infersim.engine.stage import StageResult
from infersim.base.errors import NotPossible
from infersim.shapes.kernels import AttentionShape, GemmShape, GroupedGemmShape, MemoryBoundShape, elementwise_bytes
from infersim.tables.format import (
    AttentionRow,
    DeviceInfo,
    ElementwiseRow,
    GemmRow,
    GroupedGemmRow,
    Provenance,
    TableDirectory,
    TableInfo,
)
from infersim.tables.output import write_table_dir
from infersim.modules.step import build_stage_plan
from infersim.trace.compare import ModuleComparison, compare_lane
from infersim.trace.load import RawTrace
from infersim.trace.operators import AttentionDims, ElementwiseDims, GemmDims, GroupedDims
from infersim.trace.records import LaneMeasure
from infersim.trace.traced_run import TracedCall, TracedRun, traced_workload

MAX_FUSED_PARTS = 4  # GEMMs an engine may run separately where the simulator fuses them (q, k, v; gate, up)


# ---------------------------------------------------------------------------------------------
# Rows


def _library(kernels: set[str], family: str) -> str:
    text = " ".join(kernels)
    if family == "attention":
        if "cudnn" in text:
            return "cuDNN SDPA (torch scaled_dot_product_attention, cuDNN backend)"
        if "flash" in text:
            return "FlashAttention (torch SDPA flash backend or flash_attn)"
        if "fmha" in text:
            return "memory-efficient attention (torch SDPA, CUTLASS fmha)"
        return "attention kernels as traced"
    if family == "grouped_gemm":
        return "CUTLASS grouped GEMM (torch._grouped_mm)" if "cutlass" in text else "grouped GEMM as traced"
    if "nvjet" in text or "xmma" in text or "gemm" in text.lower():
        return "cuBLAS / cuBLASLt (torch.mm)"
    if "triton" in text:
        return "Triton (Inductor)"
    return "GEMM kernels as traced"


@dataclass
class LearnedTables:
    gemm: dict[tuple[str, int, int, int], float] = field(default_factory=dict)  # (dtype, m, k, n) -> µs
    attention: dict[tuple, float] = field(default_factory=dict)  # AttentionRow fields -> µs
    grouped: dict[tuple, float] = field(default_factory=dict)
    elementwise: dict[tuple[str, str, int], float] = field(default_factory=dict)  # (op, dtype, elements) -> µs
    kernels: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    notes: list[str] = field(default_factory=list)
    unused: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # traced, no plan op: µs


def _gemm_times(calls: Sequence[TracedCall], steps: int) -> dict[tuple[str, int, int, int, str], tuple[float, float]]:
    """(dtype, m, k, n, module) -> (mean µs per call, calls per step)."""
    acc: dict[tuple[str, int, int, int, str], list[float]] = defaultdict(list)
    for c in calls:
        if isinstance(c.dims, GemmDims):
            acc[(c.dims.dtype or "bf16", c.dims.m, c.dims.k, c.dims.n, c.module)].append(c.time_us)
    return {key: (fmean(v), len(v) / steps) for key, v in acc.items()}


def _fusions(target: int, parts: dict[int, float]) -> tuple[tuple[int, int], ...] | None:
    """A multiset of traced N's (with at most their per-layer counts) adding up to `target`."""
    ns = sorted(parts)
    for size in range(2, MAX_FUSED_PARTS + 1):
        for combo in itertools.combinations_with_replacement(ns, size):
            if sum(combo) != target:
                continue
            counts = {n: combo.count(n) for n in set(combo)}
            if all(counts[n] <= round(parts[n]) for n in counts):
                return tuple(sorted(counts.items()))
    return None


def _call_key(c: TracedCall) -> tuple:
    if isinstance(c.dims, GemmDims):
        return ("gemm", c.dims.k, c.dims.n)
    return (c.kind, c.dims)


def learn(run: TracedRun, config: RunConfig) -> LearnedTables:
    """Table rows for the run config's plan at the traced shapes."""
    out = LearnedTables()
    model, dep = config.model, config.deployment
    for c in run.calls:
        out.kernels[c.kind].update(c.kernels)
    elementwise: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for c in run.calls:
        if isinstance(c.dims, ElementwiseDims) and c.stage in ("prefill", "decode"):
            elementwise[(c.dims.op, c.dims.dtype, c.dims.elements)].append(c.time_us)
    out.elementwise = {key: fmean(times) for key, times in elementwise.items() if fmean(times) > 0}
    keyed = {(op, dtype) for op, dtype, _ in out.elementwise}
    missing: dict[tuple[str, str], int] = defaultdict(int)
    for stage in run.stages():
        calls = [c for c in run.calls if c.stage == stage and not isinstance(c.dims, ElementwiseDims)]
        steps = max(1, len({c.step for c in calls}))
        layers = next((s.num_layers for s in run.lane.stages if s.stage == stage), 0) or model.num_hidden_layers
        tokens = config.workload.prefill_tokens if stage == "prefill" else config.workload.decode_batch_per_gpu
        plan = build_stage_plan(stage, model, dep, config.workload, tokens, config.hardware.derates.deepep_normal_sms)
        used: set[tuple] = set()
        gemms = _gemm_times(calls, steps)
        for op in [op for group in plan.groups for op in group.operations] + list(plan.per_step):
            shape = op.shape
            if isinstance(shape, GemmShape):
                used |= _gemm_rows(out, shape, op.name, op.module, gemms, layers, stage)
            elif isinstance(shape, AttentionShape):
                used |= _attention_rows(out, shape, [c for c in calls if isinstance(c.dims, AttentionDims)], stage)
            elif isinstance(shape, GroupedGemmShape):
                used |= _grouped_rows(out, shape, _grouped_calls(run.calls, stage), stage)
            elif isinstance(shape, MemoryBoundShape) and shape.op and (shape.op, shape.dtype) not in keyed:
                missing[(shape.op, shape.dtype)] += 1
        for c in calls:
            if _call_key(c) not in used:
                out.unused[f"{stage} {c.op} {_dims_text(c.dims)} ({c.module})"] += c.time_us / steps
    _drop_untimed(out)
    _learn_notes(out, run, keyed, missing)
    return out


def _learn_notes(out: LearnedTables, run: TracedRun, keyed: set[tuple[str, str]],
                 missing: dict[tuple[str, str], int]) -> None:
    """What the learned elementwise rows cover and what traced time no row uses."""
    if out.elementwise:
        out.notes.append(f"elementwise: {len(out.elementwise)} rows of {len(keyed)} eager kernel kinds (op, dtype) from "
                         "the traced ATen operators and their recorded inputs")
    if out.elementwise and missing:
        out.notes.append("eager kernels of the plan no traced operator keyed (they keep the roofline): "
                         + ", ".join(f"{op} {dtype}" for op, dtype in sorted(missing)))
    if out.elementwise and run.unkeyed_elementwise:
        total = sum(run.unkeyed_elementwise.values())
        out.notes.append(f"traced elementwise kernels no table op keys ({total:.1f} µs per step): "
                         + "; ".join(f"{why}: {us:.1f} µs" for why, us in sorted(run.unkeyed_elementwise.items(),
                                                                                key=lambda x: -x[1])[:6]))
    if out.unused:
        total = sum(out.unused.values())
        out.notes.append(f"traced calls no simulator operation asks for ({total:.1f} µs per step): "
                         + "; ".join(f"{name}: {us:.1f} µs" for name, us in sorted(out.unused.items(),
                                                                                  key=lambda x: -x[1])[:6]))


def _drop_untimed(out: LearnedTables) -> None:
    """Rows whose traced kernels took no time (0 µs: events the trace recorded without a duration)
    are dropped and said: a table row of 0 µs is an infinite efficiency no run could use."""
    dropped = 0
    for table in (out.gemm, out.attention, out.grouped):
        for key in [key for key, us in table.items() if not us > 0]:
            del table[key]
            dropped += 1
    if dropped:
        out.notes.append(f"{dropped} table row{'s' if dropped != 1 else ''} dropped: the traced kernels of "
                         f"{'their' if dropped != 1 else 'its'} shape took 0 µs (no duration in the trace)")


def _dims_text(d: Any) -> str:
    if isinstance(d, GemmDims):
        return f"m={d.m} k={d.k} n={d.n}"
    if isinstance(d, AttentionDims):
        return f"batch {d.batch}, q {d.q_len}, kv {d.kv_len}"
    if isinstance(d, GroupedDims):
        return f"rows {d.tokens}, {d.experts} experts, k={d.k} n={d.n}"
    return str(d)


def _gemm_rows(out: LearnedTables, shape: GemmShape, name: str, module: str,
               gemms: dict[tuple[str, int, int, int, str], tuple[float, float]], layers: int, stage: str) -> set:
    dtype = shape.dtype
    same_k = {key: v for key, v in gemms.items() if key[0] == dtype and key[2] == shape.k}
    direct = {key: v for key, v in same_k.items() if key[3] == shape.n}
    if direct:
        by_m: dict[int, list[float]] = defaultdict(list)
        for (_, m, _, _, _), (mean, _count) in direct.items():
            by_m[m].append(mean)
        for m, times in by_m.items():
            out.gemm[(dtype, m, shape.k, shape.n)] = fmean(times)
        return {("gemm", shape.k, shape.n)}
    # the engine runs this GEMM as several (q, k, v; gate, up): same K, N's adding up, same module
    used: set = set()
    by_m: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for (_, m, _, n, traced_module), (mean, count) in same_k.items():
        if traced_module == module:
            by_m[m][n] = (mean, count / max(layers, 1))
    for m, parts in by_m.items():
        combo = _fusions(shape.n, {n: per_layer for n, (_, per_layer) in parts.items()})
        if combo is None:
            continue
        out.gemm[(dtype, m, shape.k, shape.n)] = sum(parts[n][0] * count for n, count in combo)
        used |= {("gemm", shape.k, n) for n, _ in combo}
        text = " + ".join(f"{count} x n={n}" if count > 1 else f"n={n}" for n, count in combo)
        note = (f"{name} (k={shape.k}, n={shape.n}): the traced engine runs it as separate GEMMs ({text}); its "
                "rows are their summed time")
        if note not in out.notes:
            out.notes.append(note)
    if not used and name and stage:
        out.notes.append(f"{stage} {name} (k={shape.k}, n={shape.n}): no traced GEMM of this K and N; the simulator "
                         "keeps its roofline for it")
    return used


def _attention_rows(out: LearnedTables, shape: AttentionShape, calls: Sequence[TracedCall], stage: str) -> set:
    used: set = set()
    layout = (shape.kind, shape.dtype, shape.kv_dtype, shape.num_heads, shape.num_kv_heads, shape.qk_head_dim,
              shape.v_head_dim)
    acc: dict[tuple, list[float]] = defaultdict(list)
    for c in calls:
        d = c.dims
        assert isinstance(d, AttentionDims)
        if d.qk_head_dim != shape.qk_head_dim or d.num_heads != shape.num_heads:
            continue
        if d.num_kv_heads != shape.num_kv_heads:
            note = (f"attention ran with {d.num_kv_heads} K/V heads where the model has {shape.num_kv_heads} (the "
                    "engine repeated K/V); rows keep the model's layout")
            if note not in out.notes:
                out.notes.append(note)
        if stage == "prefill" and d.q_len == d.kv_len and d.q_len > 1:
            acc[("prefill", 1, d.q_len, d.kv_len, True)].append(c.time_us / max(d.batch, 1))
        elif d.q_len == 1:
            acc[("decode", d.batch, 1, d.kv_len, False)].append(c.time_us)
        else:
            continue
        used.add(("attention", d))
    for (kstage, batch, q_len, kv_len, causal), times in acc.items():
        out.attention[(*layout[:1], kstage, *layout[1:], causal, batch, q_len, kv_len, shape.window)] = fmean(times)
    return used


def _grouped_calls(calls: Sequence[TracedCall], stage: str) -> list[TracedCall]:
    """The grouped-GEMM calls that time `stage`'s grouped GEMMs: its own, and the other stage's where
    they ran the same operator and kernels (torch._grouped_mm launches one kernel whatever the stage, so
    a decode step's few tokens and a prefill's many are points of one curve: the table gets both, and
    interpolates between them instead of extrapolating from one point)."""
    grouped = [c for c in calls if isinstance(c.dims, GroupedDims) and c.stage in ("prefill", "decode")]
    own = {(c.op, c.kernels) for c in grouped if c.stage == stage}
    return [c for c in grouped if c.stage == stage or (c.op, c.kernels) in own]


def _grouped_rows(out: LearnedTables, shape: GroupedGemmShape, calls: Sequence[TracedCall], stage: str) -> set:
    used: set = set()
    want_k = shape.hidden if shape.projection == "up" else shape.intermediate
    acc: dict[int, list[float]] = defaultdict(list)
    for c in calls:
        d = c.dims
        assert isinstance(d, GroupedDims)
        if d.k != want_k or d.experts != shape.num_experts // shape.ep:
            continue
        acc[max(1, round(d.tokens / shape.topk))].append(c.time_us)
        used.add(("grouped_gemm", d))
    for tokens, times in acc.items():
        out.grouped[(shape.dtype, stage, shape.projection, shape.num_experts, shape.ep, shape.topk, shape.hidden,
                     shape.intermediate, shape.gated, tokens, shape.weight_dtype)] = fmean(times)
    return used


# ---------------------------------------------------------------------------------------------
# Elementwise: the share of HBM bandwidth the engine's elementwise work reached


def elementwise_efficiency(run: TracedRun, config: RunConfig) -> tuple[float | None, str]:
    """(efficiency, how) fitted on a traced stage, or None with why: the stage with the most elementwise
    bytes whose measured time is more than the simulator's launch overhead of its elementwise kernels
    (a stage bound by launches says nothing about bandwidth; a plan whose prefill is eager and whose
    decode is fused, as the compiled HF card's, fits on the stage whose kernels are the traced kind)."""
    hw = config.hardware
    candidates: list[tuple[float, str, float, float, int]] = []
    for stage in run.stages():
        measured = next((s for s in run.lane.stages if s.stage == stage), None)
        module = measured.module(cat.ELEMENTWISE) if measured else None
        if module is None:
            continue
        tokens = config.workload.prefill_tokens if stage == "prefill" else config.workload.decode_batch_per_gpu
        plan = build_stage_plan(stage, config.model, config.deployment, config.workload, tokens,
                                hw.derates.deepep_normal_sms)
        ops = [(op, group.layers) for group in plan.groups for op in group.operations
               if op.module == cat.ELEMENTWISE and isinstance(op.shape, MemoryBoundShape)]
        moved = sum(op.shape.bytes * op.count * layers for op, layers in ops)
        kernels = sum(op.shape.kernels * op.count * layers for op, layers in ops)
        if moved > 0:
            candidates.append((moved, stage, module.time_s, module.kernels, kernels))
    if not candidates:
        return None, "no elementwise kernels in the traced steps"
    why: list[str] = []
    for moved, stage, measured_s, traced_kernels, sim_kernels in sorted(candidates, reverse=True):
        launch = hw.derates.kernel_launch_overhead * sim_kernels
        streaming = measured_s - launch
        if streaming <= 0:
            why.append(f"{stage}: the measured elementwise time ({measured_s * 1e6:.1f} µs) is within the simulator's "
                       f"launch overhead of its {sim_kernels} elementwise kernels: bound by launches, not bandwidth")
            continue
        efficiency = moved / (hw.peak.hbm_bandwidth * streaming)
        how = (f"{stage} steps: {traced_kernels:g} elementwise kernels took {measured_s * 1e6:.1f} µs per step; the "
               f"simulator's elementwise operations of that step move {moved / 1e6:.2f} MB in {sim_kernels} kernels; "
               f"after its launch overhead ({launch * 1e6:.1f} µs) that is {efficiency:.3f} of {hw.name}'s HBM "
               "bandwidth")
        if not 0 < efficiency <= 1:
            why.append(how + ": outside (0, 1], not written")
            continue
        return efficiency, "; ".join([*why, how])
    return None, "; ".join(why)


# ---------------------------------------------------------------------------------------------
# Host costs: launch_cpu and step_cpu from the trace's CPU side (trace.host)


@dataclass(frozen=True)
class LearnedHost:
    """The host costs a trace gives (seconds), how they were found, and why one is missing."""

    launch_cpu: float | None
    step_cpu: float | None
    how: str
    per_stage: dict[str, float]  # provenance host_probes: the values of each stage
    notes: tuple[str, ...] = ()


def learn_host(run: TracedRun, config: RunConfig) -> LearnedHost:
    """launch_cpu and step_cpu, the host costs of the engine card's step composition
    (cards.engine.step_overhead: step_fixed + step_cpu + the launch queue of the step's kernels), from
    the trace's CPU side, the fields `mfu bench`'s HF probe writes (hf_kernel; hf_generate_step +
    hf_forward_step):
      launch_cpu: the host's time between consecutive launch calls inside the decoder layers (its waits
                  for the GPU taken out), over every step: the cost per kernel of eager model code;
      step_cpu:   a decode step's wall time (a step region the host waits in for its last kernel) less
                  the card's step_fixed and less the launch queue of its own traced kernels, launch_cpu
                  apart and each as long as traced: the host work the GPU never overlaps (generate()'s
                  loop, the forward's Python outside the layers). Prefill steps where there is no decode."""
    from infersim.cards.engine import LaunchRun, launch_queue_seconds

    stages = [s for s in run.lane.stages if s.stage in ("prefill", "decode")]
    steps = [step for s in stages for step in s.steps]
    gaps = sum(step.layer_launch_gaps for step in steps)
    source = run.path.name
    caveats = [f"host costs belong to the machine and process that recorded {source}"]
    if run.raw.top_level.get("synthesised"):
        caveats.append("its CPU side is synthesised (the test-trace synthesiser, tests/tracegen/synthesis.py, re-times the recorded operators as an "
                       "eager launch loop: a few microseconds per operator, launch call and Python frame), so these "
                       "are that model's host costs, not a measured host's")
    if not gaps:
        return LearnedHost(None, None, "", {}, (
            f"host costs: no launches inside decoder layers in {source} (CUDA-graph replays launch a step at "
            "once, or no layers were found): launch_cpu and step_cpu not learned, the engine card's stay",))
    launch = sum(step.layer_launch_s for step in steps) / gaps
    fixed = config.engine.overheads.step_fixed
    per_stage = {f"trace_launch_cpu_{s.stage}": s.launch_spacing_s for s in stages if s.launch_spacing_s is not None}
    step_values: dict[str, list[float]] = defaultdict(list)
    for s in stages:
        for step in s.steps:
            order = run.launch_order.get(step.index)
            if step.synchronous and order:
                queue = launch_queue_seconds([LaunchRun(order)], launch)
                step_values[s.stage].append(step.wall_s - fixed - queue)
    for stage, values in step_values.items():
        per_stage[f"trace_step_cpu_{stage}"] = fmean(values)
    basis = "decode" if "decode" in step_values else "prefill" if "prefill" in step_values else None
    extents = sorted({step.host_extent for s in stages if s.stage == basis for step in s.steps
                      if step.synchronous})
    how = (f"learned by mfu from-trace from the CPU side of {source}: launch_cpu = the host's time between "
           f"consecutive launch calls whose kernels run in the decoder layers, its waits for the GPU "
           f"(cudaDeviceSynchronize, cudaStreamSynchronize) taken out, over {gaps} spacings ("
           + ", ".join(f"{s.stage} {s.launch_spacing_s * 1e6:.2f} us" for s in stages if s.launch_spacing_s is not None)
           + ")")
    notes: list[str] = []
    step_cpu = per_stage.get(f"trace_step_cpu_{basis}") if basis else None
    if step_cpu is not None and step_cpu <= 0:
        notes.append(f"host costs: a {basis} step's wall time is within its launch queue and step_fixed "
                     f"({step_cpu * 1e6:.1f} us left): step_cpu not learned, the engine card's stays")
        step_cpu = None
    if step_cpu is not None:
        how += (f"; step_cpu = a {basis} step's wall time ({', '.join(extents)}, the host waiting in it for the "
                f"step's last kernel) less the engine card's step_fixed ({fixed * 1e6:.0f} us) and less the launch "
                f"queue of its traced kernels (launched launch_cpu apart, run in launch order, each as long as "
                f"traced): the host work the GPU does not overlap ("
                + ", ".join(f"{stage} {fmean(v) * 1e6:.1f} us" for stage, v in step_values.items()) + ")")
        other = "prefill" if basis == "decode" else "decode"
        if f"trace_step_cpu_{other}" in per_stage:
            how += (f"; the engine card's step_cpu is one value per step, so {other} steps take the {basis} "
                    f"steps' (the per-token step a generation repeats, as mfu bench's HF probe times it)")
    elif basis is None:
        notes.append(f"host costs: no step of {source} is a region the host waits in for the step's last kernel, so "
                     "its wall time is not known: step_cpu not learned, the engine card's stays")
    return LearnedHost(launch, step_cpu, how + "; " + "; ".join(caveats), per_stage, tuple(notes))


# ---------------------------------------------------------------------------------------------
# Writing


def trace_date(raw: RawTrace) -> str:
    base = raw.top_level.get("baseTimeNanoseconds")
    if isinstance(base, (int, float)) and base > 0:
        return dt.datetime.fromtimestamp(base / 1e9, dt.timezone.utc).date().isoformat()
    return "unknown"


def device_info(raw: RawTrace, fallback: str) -> DeviceInfo:
    props = raw.top_level.get("deviceProperties")
    entry = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {}
    sms = entry.get("numSms")
    memory = entry.get("totalGlobalMem")
    return DeviceInfo(name=str(entry.get("name") or fallback),
                      sm_count=int(sms) if isinstance(sms, int) and sms > 0 else None,
                      memory_bytes=float(memory) if isinstance(memory, (int, float)) and memory > 0 else None)


def table_directory(run: TracedRun, learned: LearnedTables, config: RunConfig, command: str,
                    efficiency: tuple[float | None, str], host: LearnedHost | None = None) -> TableDirectory:
    tables: dict[str, tuple] = {}
    infos: dict[str, TableInfo] = {}
    by_dtype: dict[str, list[GemmRow]] = defaultdict(list)
    for (dtype, m, k, n), us in sorted(learned.gemm.items()):
        by_dtype[dtype].append(GemmRow(dtype, m, k, n, round(us, 4)))
    for dtype, rows in by_dtype.items():
        name = f"gemm_{dtype}.csv"
        tables[name] = tuple(rows)
        infos[name] = TableInfo(family="gemm", library=_library(learned.kernels["gemm"], "gemm"),
                                description=f"{dtype} GEMMs of the traced steps, per M the trace ran them at",
                                notes=("latency = mean kernel time per operator call over the traced steps "
                                       "(all kernels the call launched, e.g. a split-K reduction)",))
    if learned.attention:
        rows = []
        for key, us in sorted(learned.attention.items()):
            kind, stage, dtype, kv_dtype, heads, kv_heads, qk, v, causal, batch, q_len, kv_len, window = key
            rows.append(AttentionRow(kind, stage, dtype, kv_dtype, heads, kv_heads, qk, v, causal, batch, q_len, kv_len,
                                     round(us, 4), window=window))
        tables["attention.csv"] = tuple(rows)
        infos["attention.csv"] = TableInfo(
            family="attention", library=_library(learned.kernels["attention"], "attention"),
            description="attention of the traced steps in the model's head layout",
            notes=("prefill rows are one sequence: a traced call over B sequences of S tokens is the row at S with "
                   "1/B of its time (the lookup prices B sequences as B rows)",))
    if learned.grouped:
        rows = []
        for key, us in sorted(learned.grouped.items()):
            dtype, stage, projection, experts, ep, topk, hidden, inter, gated, tokens, weight = key
            rows.append(GroupedGemmRow(dtype, stage, projection, experts, ep, topk, hidden, inter, gated, tokens,
                                       round(us, 4), weight_dtype=weight if weight != dtype else None))
        tables["grouped_gemm.csv"] = tuple(rows)
        infos["grouped_gemm.csv"] = TableInfo(
            family="grouped_gemm", library=_library(learned.kernels["grouped_gemm"], "grouped_gemm"),
            description="routed experts of the traced steps (tokens_per_gpu = traced rows / top-k)",
            notes=("timed under the routing the traced inputs produced (random weights route about evenly)",
                   "a stage's rows include the other stage's calls of the same operator and kernels (one grouped "
                   "GEMM whatever the stage)"))
    if learned.elementwise:
        tables["elementwise.csv"] = tuple(
            ElementwiseRow(op, dtype, elements, int(elementwise_bytes(op, dtype, elements)), round(us, 4))
            for (op, dtype, elements), us in sorted(learned.elementwise.items()))
        infos["elementwise.csv"] = TableInfo(
            family="elementwise", library="ATen elementwise, reduction and copy kernels (eager PyTorch) as traced",
            description="eager elementwise kernels of the traced steps keyed by their launching ATen operator and its "
                        "recorded inputs (infersim.trace.operators.elementwise_dims)",
            notes=("latency = mean kernel time per operator call of that (op, dtype, elements) over the traced steps",
                   "bytes by the op's byte rule (infersim.shapes.kernels.elementwise_bytes), as the simulator's eager "
                   "kernels count them"))
    if not tables:
        raise NotPossible(f"{run.path}: no traced GEMM, attention or grouped GEMM matches an operation of the run "
                          f"config's model: nothing to write ({'; '.join(run.notes + learned.notes) or 'no shapes'})")
    hw = config.hardware
    eff, eff_how = efficiency
    software = {k: str(v) for k, v in run.raw.top_level.items()
                if k in ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "schemaVersion")}
    notes = [f"learned from the trace {run.path.name} by infersim mfu from-trace: the operators' recorded input shapes "
             f"and the kernels they launched ({traced_workload(run).describe()})",
             *run.notes, *learned.notes, f"elementwise: {eff_how}", *(host.notes if host else ())]
    synthesised = run.raw.top_level.get("synthesised")
    if synthesised:
        notes.insert(0, f"the trace is synthesised test data, not a measurement: {synthesised}")
    prov = Provenance(
        format_version=1, device=device_info(run.raw, hw.name), peak_flops=dict(hw.peak.flops), origin="measured",
        measured_on=trace_date(run.raw), written_on=dt.date.today().isoformat(), command=command, software=software,
        source={"trace": str(run.path), "hardware_card": hw.name, "peak_flops_from": f"hardware card {hw.name}"},
        notes=tuple(notes), elementwise_memory_efficiency=eff,
        elementwise_source=(f"fitted by mfu from-trace: {eff_how}" if eff is not None else ""),
        launch_cpu=host.launch_cpu if host else None, step_cpu=host.step_cpu if host else None,
        host_source=host.how if host and (host.launch_cpu or host.step_cpu) else "",
        host_probes={k: v for k, v in host.per_stage.items() if v >= 0} if host and (host.launch_cpu or host.step_cpu)
        else {}, tables=infos)
    return TableDirectory(provenance=prov, tables=tables)


def write_learned_tables(out: Path, table_dir: TableDirectory, force: bool = False) -> None:
    write_table_dir(Path(out), table_dir, force)


# ---------------------------------------------------------------------------------------------
# Checking: the learned tables against the trace they came from (or another trace)

#: modules the tables time whole (GEMMs, attention, grouped GEMMs): the criterion of a learned table
TABLE_TIMED = (cat.ATTN_PROJ, cat.ATTN_CORE, cat.DENSE_FFN, cat.SHARED_EXPERT, cat.MOE_EXPERTS)


@dataclass(frozen=True)
class StageCheck:
    """Measured against predicted (with the learned tables) for one traced stage, kernel time per step."""

    stage: str
    measured_table_s: float  # TABLE_TIMED modules
    predicted_table_s: float
    measured_kernel_s: float  # every kernel of the step
    predicted_kernel_s: float  # every operation of the predicted step but the scheduler overhead
    measured_step_s: float  # wall time of a step (StageMeasure.wall_s)
    predicted_step_s: float  # TTFT / TPOT with the engine card's overhead
    modules: tuple[ModuleComparison, ...]
    measured_idle_s: float = 0.0  # the GPU idle in a step: the host's time it waits for
    predicted_overhead_s: float = 0.0  # the engine's exposed host time per step

    @staticmethod
    def error(predicted: float, measured: float) -> float | None:
        return (predicted - measured) / measured if measured > 0 else None


def check_stages(lane: LaneMeasure, prefill: StageResult, decode: StageResult) -> list[StageCheck]:
    out = []
    for comp in compare_lane(lane, prefill, decode):
        predicted = prefill if comp.stage == "prefill" else decode
        rows = {r.module: r for r in comp.modules}
        out.append(StageCheck(
            stage=comp.stage,
            measured_table_s=sum(rows[m].measured_s for m in TABLE_TIMED if m in rows),
            predicted_table_s=sum(rows[m].predicted_s for m in TABLE_TIMED if m in rows),
            measured_kernel_s=comp.measured.kernel_time_s,
            predicted_kernel_s=sum(op.time_s for op in predicted.operations if op.module != cat.OVERHEAD),
            measured_step_s=comp.measured_step_s, predicted_step_s=comp.predicted_step_s, modules=comp.modules,
            measured_idle_s=max(0.0, comp.measured_step_s - comp.measured.busy_s),
            predicted_overhead_s=sum(op.time_s for op in predicted.operations if op.module == cat.OVERHEAD)))
    return out
