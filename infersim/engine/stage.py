"""The stage engine: walks a StagePlan, times every operation and composes the step.

Without overlap a layer takes the sum of its operations. With two-batch overlap the plan is sized
per micro-batch and the engine schedules the two micro-batches on two streams, as the runtime
does: each layer is a sequence of phases (runs of compute operations and runs of communication
operations); a micro-batch's phases run in order, the compute stream and the communication stream
each run one phase at a time, micro-batch A before B. So one micro-batch's communication hides
behind the other's compute exactly as far as the dependencies allow. While communication kernels
hold SMs (DeepEP normal mode), compute runs slower by SMs / (SMs - SMs taken).
With weight offload (deployment.weight_offload) each layer's offloaded weights arrive over the
host link one layer ahead of its compute (infersim.costing.weight_offload); the transfer time compute does
not hide is its own operation. The step adds per-step operations and the serving engine's software overhead (see
infersim.cards.engine.step_overhead: fixed per-step work plus CPU work that an overlap scheduler
hides behind the GPU step; eager kernel launches count unless the step is a CUDA graph).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from infersim.cards.engine import EngineCard, LaunchRun, StepPieces, step_overhead, step_overhead_seconds
from infersim.cards.engine_platform import FusionPass
from infersim.cards.hardware import HardwareCard
from infersim.shapes.comm_shapes import CollectiveShape
from infersim.shapes.kernels import Bound, Cost, KernelTables, Source
from infersim.cards import categories as cat
from infersim.shapes.plan import LayerGroup, Operation, StagePlan
from infersim.costing.memo import Fused, PartSums, Priced, PricedPart, PricingMemo, operation_kernels, priced_part
from infersim.base.units import GB, MS


@dataclass(frozen=True)
class OperationResult:
    name: str
    module: str
    layers: int  # layers the operation occurs in (1 for per-step operations)
    time_s: float  # kernel time over the whole step (all layers, all micro-batches)
    time_per_layer_s: float  # kernel time in one layer (all micro-batches)
    flops: float  # over the whole step
    bytes: float  # over the whole step
    bound: Bound
    source: Source
    detail: str = ""
    group: str = ""


@dataclass(frozen=True)
class StageResult:
    stage: str
    step_time_s: float  # TTFT for prefill, TPOT for decode
    tokens_per_gpu: int  # prompt tokens per GPU (prefill) or requests per GPU (decode)
    num_layers: int
    micro_batches: int
    overlap_saved_s: float  # time two-batch overlap saves against running compute and communication back to back (negative when SM sharing costs more)
    sm_slowdown: float  # factor compute is slowed by while overlapped communication holds SMs
    operations: tuple[OperationResult, ...]
    # tokens each request gains per decode step: 1, or under speculative decoding the expected
    # accepted draft tokens plus the bonus token (step_time_s is then draft + verification)
    tokens_per_step: float = 1.0
    chunks: int = 1  # prefill: steps the prompt ran in (chunked prefill of a prompt longer than the token budget)
    padded_batch: int = 0  # decode: the batch a CUDA-graph step computes when padded past tokens_per_gpu (0 = none)

    @property
    def tgs(self) -> float:
        """Tokens per GPU per second: prompt tokens (prefill) or generated tokens (decode)."""
        return self.tokens_per_gpu * self.tokens_per_step / self.step_time_s

    @property
    def tpot_s(self) -> float:
        """Decode: time per output token of one request (the step time without speculative decoding)."""
        return self.step_time_s / self.tokens_per_step

    @property
    def source(self) -> Source:
        return combined_source(op.source for op in self.operations if op.time_s > 0)

    def module_times(self) -> dict[str, float]:
        """Kernel seconds per module category over the step (before overlap)."""
        out: dict[str, float] = {}
        for op in self.operations:
            out[op.module] = out.get(op.module, 0.0) + op.time_s
        return out

    @property
    def bound(self) -> Bound:
        """What bounds the step: the bound holding the most time."""
        by_bound: dict[Bound, float] = {}
        for op in self.operations:
            by_bound[op.bound] = by_bound.get(op.bound, 0.0) + op.time_s
        return max(by_bound, key=by_bound.__getitem__)


def combined_source(sources: Iterable[Source]) -> Source:
    unique = set(sources)
    if len(unique) == 1:
        return unique.pop()
    return Source.MIXED if unique else Source.CARD


Pricer = Callable[[tuple[Operation, ...]], PricedPart]


def _pricer(hw: HardwareCard, tables: KernelTables, memo: PricingMemo | None) -> Pricer:
    """How a step's walk prices each part: through `memo` (each part and kernel shape priced once per
    (hw, tables), the pair's costs found once per step), or plainly."""
    if memo is None:
        return partial(priced_part, hw=hw, tables=tables)
    return memo.pricer(hw, tables)


def _layer_sums(parts: list[PricedPart], fused: Fused) -> PartSums:
    """One micro-batch's pass over one layer: its parts' sums added in order (seconds, per bound)."""
    if len(parts) == 1:
        return parts[0].sums(fused)
    seconds = 0.0
    bounds: dict[Bound, float] = {}
    for part in parts:
        part_seconds, part_bounds = part.sums(fused)
        seconds += part_seconds
        for bound, time_s in part_bounds:
            bounds[bound] = bounds.get(bound, 0.0) + time_s
    return seconds, tuple(bounds.items())


def two_batch_schedule(runs: list[tuple[list[tuple[bool, float]], int]]) -> float:
    """Makespan of two micro-batches through the layers, on one compute stream and one
    communication stream: `runs` of (phases of one layer, layers in a row that have them), each
    phase (is_comm, seconds) per micro-batch. Once one more layer of a run moves both streams and
    both micro-batches on by the same time, every further layer of the run does too (the schedule
    only adds and takes maxima), so the rest of the run is that time per layer."""
    free = [0.0, 0.0]  # when the compute stream and the communication stream are next free
    ready = [0.0, 0.0]  # when each micro-batch's last phase ends
    for phases, layers in runs:
        used = {is_comm for is_comm, _ in phases}
        for done in range(1, layers + 1):
            before = (free[0], free[1], ready[0], ready[1])
            for is_comm, seconds in phases:
                stream = int(is_comm)
                start = max(free[stream], ready[0])
                free[stream] = ready[0] = start + seconds
                start = max(free[stream], ready[1])
                free[stream] = ready[1] = start + seconds
            period = ready[0] - before[2]
            if (ready[1] - before[3] == period and all(free[s] - before[s] == period for s in (0, 1) if s in used)):
                left = layers - done
                for s in used:
                    free[s] += left * period
                ready[0] += left * period
                ready[1] += left * period
                break
    return max(ready)


def _phases(timed: list[tuple[bool, float]]) -> list[tuple[bool, float]]:
    """Merge consecutive operations of the same kind (compute or communication) into phases."""
    phases: list[tuple[bool, float]] = []
    for is_comm, seconds in timed:
        if seconds <= 0:
            continue
        if phases and phases[-1][0] == is_comm:
            phases[-1] = (is_comm, phases[-1][1] + seconds)
        else:
            phases.append((is_comm, seconds))
    return phases


def kernels_launched(plan: StagePlan) -> int:
    """Kernels one step launches (every operation of every layer and micro-batch, per-step ones)."""
    per_layer = sum(g.layers * sum(operation_kernels(op) for op in g.operations) for g in plan.groups)
    return per_layer * plan.micro_batches + sum(operation_kernels(op) for op in plan.per_step)


def _passes_on(engine: EngineCard | None, hw: HardwareCard) -> tuple[FusionPass, ...]:
    """The engine's fusion passes that run on this GPU."""
    if engine is None or not engine.fusion_passes:
        return ()
    return tuple(p for p in engine.fusion_passes if p.matches(hw))


def group_fusions(passes: tuple[FusionPass, ...], priced: Sequence[Priced]) -> dict[str, str]:
    """Operations the passes fold away in one layer group, each with the pass that folds it: a pass
    tied to the all-reduce applies only where the group has all-reduces and each runs over a TP size
    the pass supports and moves no more than its limit there (the fused kernel replaces the
    all-reduce before the operations)."""
    folded: dict[str, str] = {}
    for fusion in passes:
        if fusion.all_reduce_limits:
            reduces = [op.shape for op, _, _ in priced
                       if isinstance(op.shape, CollectiveShape) and op.shape.kind == "all_reduce"]
            if not reduces or any(s.bytes_per_rank > fusion.max_all_reduce_bytes(s.ranks) for s in reduces):
                continue
        for name in fusion.operations:
            folded.setdefault(name, fusion.name)
    return folded


def _plain_launch(engine: EngineCard | None, stage: str, passes: tuple[FusionPass, ...]) -> bool:
    """Whether a step folds away only the engine card's fused_operations and breaks no graph: no
    fusion passes on this GPU and no piecewise graph in this stage (the groups' launch facts are
    then the same for every group)."""
    return engine is None or not (passes or (stage != "decode" and engine.overheads.prefill_graph_pieces))


def _group_launch_facts(engine: EngineCard | None, stage: str, passes: tuple[FusionPass, ...],
                        fused_always: tuple[str, ...],
                        parts: list[PricedPart]) -> tuple[Fused, dict[str, str], int]:
    """(operations folded away in one layer group, those the passes fold -> the pass that folds them,
    kernels of one layer that break a piecewise prefill graph). Only the card's fused_operations
    where the launch is plain (_plain_launch)."""
    if engine is None or _plain_launch(engine, stage, passes):
        return fused_always, {}, 0
    pieces = stage != "decode" and engine.overheads.prefill_graph_pieces
    priced = [entry for part in parts for entry in part.priced]
    folded = group_fusions(passes, priced) if passes else {}
    names = engine.overheads.graph_break_operations if pieces else ()
    breaks = sum(operation_kernels(op) for op, _, _ in priced if op.name in names) if names else 0
    return (frozenset((*fused_always, *folded)) if folded else fused_always), folded, breaks


class _Layers(NamedTuple):
    """What walking a plan's layer groups adds up (see _walk_layers)."""

    serial: float  # seconds of every layer's kernels run back to back
    schedule: list[tuple[list[tuple[bool, float]], int]]  # two-batch overlap: each group's layer phases, layers
    runs: list[LaunchRun]  # host launch queue: each group's kernels
    kernels: int  # kernels of one micro-batch's pass over every layer
    layer_s: list[float]  # with offload: one layer's kernel time per group
    break_kernels: int  # kernels of one micro-batch's pass over every layer that break a piecewise graph


def _walk_layers(plan: StagePlan, hw: HardwareCard, price: Pricer, engine: EngineCard | None, queue: bool,
                 slowdown: float, by_bound: dict[Bound, float], results: list[OperationResult] | None) -> _Layers:
    """Price every layer group of the plan and add up its operations (their results to `results`).
    A group's time is its layer's parts' sums (PricedPart.sums) times the micro-batches and layers,
    whatever else the walk records."""
    mb = plan.micro_batches
    fused_always: tuple[str, ...] = engine.fused_operations if engine is not None else ()
    passes = _passes_on(engine, hw)
    plain = _plain_launch(engine, plan.stage, passes)  # then every group's launch facts are fused_always, {}, 0
    fused: Fused = fused_always
    folded: dict[str, str] = {}
    break_kernels = 0
    serial = 0.0
    schedule: list[tuple[list[tuple[bool, float]], int]] = []
    runs: list[LaunchRun] = []
    layer_kernels = 0
    layer_s: list[float] = []
    detailed = mb != 1 or queue or results is not None
    for group in plan.groups:
        layers = group.layers
        parts = list(map(price, group.parts))
        kernels = 0
        for part in parts:
            kernels += part.kernels
        layer_kernels += layers * kernels
        if not plain:
            fused, folded, breaks = _group_launch_facts(engine, plan.stage, passes, fused_always, parts)
            break_kernels += layers * breaks
        seconds, bounds = _layer_sums(parts, fused)
        group_s = seconds * mb * layers
        serial += group_s
        for bound, time_s in bounds:
            by_bound[bound] = by_bound.get(bound, 0.0) + time_s * mb * layers
        if plan.offload_bytes_per_layer:
            layer_s.append(group_s / layers)
        if detailed:
            _record_group(plan, group, parts, fused, folded, engine, slowdown, queue, schedule, runs, results)
    return _Layers(serial, schedule, runs, layer_kernels, layer_s, break_kernels)


def _record_group(plan: StagePlan, group: LayerGroup, parts: list[PricedPart], fused: Fused,
                  folded: dict[str, str], engine: EngineCard | None, slowdown: float, queue: bool,
                  schedule: list[tuple[list[tuple[bool, float]], int]], runs: list[LaunchRun],
                  results: list[OperationResult] | None) -> None:
    """What the walk records of a group beyond its time: its phases for the two-batch schedule, its
    kernels for the launch queue, each operation's result."""
    mb = plan.micro_batches
    layers = group.layers
    comm = cat.COMMUNICATION
    timed: list[tuple[bool, float]] = []
    launched: list[tuple[int, float]] = []
    for part in parts:
        for op, cost, seconds in part.priced:
            is_fused = op.name in fused  # done inside the neighbouring kernel: its bytes ride on that kernel's pass
            per_micro_batch = 0.0 if is_fused else seconds
            per_layer = per_micro_batch * mb
            if mb == 2:  # only two-batch overlap schedules phases
                is_comm = op.module in comm
                timed.append((is_comm, per_micro_batch if is_comm else per_micro_batch * slowdown))
            if queue:
                launched.append((operation_kernels(op), per_layer))
            if results is not None:
                fused_by = folded.get(op.name, "") if is_fused else ""
                results.append(_group_result(group, op, cost, is_fused, per_layer * layers, per_layer, mb, engine,
                                             fused_by))
    if mb == 2:
        schedule.append((_phases(timed), layers))
    if queue:
        runs.append(LaunchRun(tuple(launched), layers))


def _group_result(group: LayerGroup, op: Operation, cost: Cost, is_fused: bool, time_s: float, per_layer: float,
                  mb: int, engine: EngineCard | None, fused_by: str = "") -> OperationResult:
    """The result of one operation of a layer group (an operation the engine fuses into a
    neighbouring kernel takes no time and moves no bytes of its own; `fused_by`: the fusion pass)."""
    if is_fused:
        by = f"{engine.name} {engine.version} ({fused_by})" if engine is not None and fused_by else \
            (engine.name if engine is not None else "")
        cost = Cost(cost.flops, 0.0, 0.0, cost.bound, Source.CARD, f"fused into a neighbouring kernel by {by}")
    layers = group.layers
    return OperationResult(op.name, op.module, layers, time_s, per_layer, cost.flops * op.count * mb * layers,
                           cost.bytes * op.count * mb * layers, cost.bound, cost.source, cost.detail, group.name)


def _offload_exposed(plan: StagePlan, hw: HardwareCard, walked: _Layers, step: float, by_bound: dict[Bound, float],
                     results: list[OperationResult] | None) -> float:
    """Seconds of the offloaded weights' transfer that compute does not hide. Under two-batch
    overlap the schedule packs the layers tighter than their serial sum; each layer takes its
    share of the scheduled time. Both micro-batches use one fetch of a layer."""
    from infersim.costing.weight_offload import host_link_bytes_per_s, offload_cost  # runs that offload only

    serial = walked.serial
    scale = step / serial if serial > 0 else 1.0
    rate = host_link_bytes_per_s(hw)
    cost = offload_cost([(seconds * scale, moved, group.layers) for seconds, moved, group
                         in zip(walked.layer_s, plan.offload_bytes_per_layer, plan.groups)], rate)
    by_bound[Bound.HOST_LINK] = by_bound.get(Bound.HOST_LINK, 0.0) + cost.exposed_s
    if results is not None:
        detail = (f"{cost.bytes / GB:,.2f} GB from host memory at {rate / GB:,.1f} GB/s (pcie_bandwidth x "
                  f"pcie_efficiency), one layer ahead of compute: link busy {cost.transfer_s / MS:,.3f} ms, "
                  f"{cost.exposed_s / MS:,.3f} ms of it not hidden")
        results.append(OperationResult("weight_offload", cat.WEIGHT_OFFLOAD, cost.layers, cost.exposed_s,
                                       cost.exposed_s / max(cost.layers, 1), 0.0, cost.bytes, Bound.HOST_LINK,
                                       Source.ROOFLINE, detail, "offloaded layers"))
    return cost.exposed_s


def _walk_per_step(plan: StagePlan, price: Pricer, queue: bool, step: float, by_bound: dict[Bound, float],
                   results: list[OperationResult] | None) -> tuple[float, list[tuple[int, float]], list[tuple[int, float]], int]:
    """(`step` with the per-step operations' sum added; the kernels launched before the layers and
    after them, for the launch queue; the kernels of the per-step operations). Those before the
    final norm and LM head run before the layers (embedding, rotary tables, the mask), the rest
    after them."""
    before: list[tuple[int, float]] = []
    after: list[tuple[int, float]] = []
    part = price(plan.per_step)
    seconds, bounds = part.sums(())
    step += seconds
    for bound, time_s in bounds:
        by_bound[bound] = by_bound.get(bound, 0.0) + time_s
    if queue or results is not None:
        for op, cost, time_s in part.priced:
            if queue:
                (after if after or op.module == cat.LM_HEAD else before).append((operation_kernels(op), time_s))
            if results is not None:
                results.append(OperationResult(op.name, op.module, 1, time_s, time_s, cost.flops * op.count,
                                               cost.bytes * op.count, cost.bound, cost.source, cost.detail, "per step"))
    return step, before, after, part.kernels


def _overhead(plan: StagePlan, hw: HardwareCard, engine: EngineCard, step: float, kernels: int,
              launches: list[LaunchRun], break_kernels: int, results: list[OperationResult] | None) -> float:
    """The serving engine's software overhead of the step (see infersim.cards.engine.step_overhead)."""
    pieces = StepPieces(hw, plan.tokens_per_gpu * plan.attention_tp, break_kernels)
    args = (engine, plan.stage, step, plan.requests_per_gpu * plan.attention_tp, kernels, hw.peak.hbm_bytes,
            plan.engine_tp, launches, pieces)
    if results is None:
        return step_overhead_seconds(*args)
    detailed = step_overhead(*args)
    results.append(OperationResult("scheduler", cat.OVERHEAD, 1, detailed.seconds, detailed.seconds, 0.0, 0.0,
                                   Bound.OVERHEAD, Source.CARD, detailed.detail, "per step"))
    return detailed.seconds


def _walk(plan: StagePlan, hw: HardwareCard, tables: KernelTables, engine: EngineCard | None,
          results: list[OperationResult] | None,
          memo: PricingMemo | None) -> tuple[float, float, float, dict[Bound, float]]:
    """Time one step: (step seconds, seconds two-batch overlap saved, compute slowdown by SMs held
    for communication, seconds per bound). Appends each operation's result to `results` unless it
    is None (sweeps need the time only: the results and their detail text cost more than the timing)."""
    mb = plan.micro_batches
    slowdown = hw.peak.sm_count / (hw.peak.sm_count - plan.comm_sms) if plan.comm_sms else 1.0
    by_bound: dict[Bound, float] = {}
    # the kernels in launch order, for an engine that launches them from the host with nothing to hide
    # that behind (no overlap scheduler): its launches overlap the GPU as the launch queue allows
    queue = (engine is not None and not engine.overheads.overlap_scheduler and mb == 1
             and not plan.offload_bytes_per_layer)
    price = _pricer(hw, tables, memo)
    walked = _walk_layers(plan, hw, price, engine, queue, slowdown, by_bound, results)
    step = two_batch_schedule(walked.schedule) if mb == 2 else walked.serial
    saved = walked.serial - step
    if plan.offload_bytes_per_layer:
        step += _offload_exposed(plan, hw, walked, step, by_bound, results)
    step, before, after, step_kernels = _walk_per_step(plan, price, queue, step, by_bound, results)
    if engine is not None:
        launches = [LaunchRun(tuple(before)), *walked.runs, LaunchRun(tuple(after))] if queue else []
        overhead = _overhead(plan, hw, engine, step, walked.kernels * mb + step_kernels, launches,
                             walked.break_kernels * mb, results)
        by_bound[Bound.OVERHEAD] = by_bound.get(Bound.OVERHEAD, 0.0) + overhead
        step += overhead
    return step, saved, slowdown, by_bound


def run_stage(plan: StagePlan, hw: HardwareCard, tables: KernelTables, engine: EngineCard | None = None,
              memo: PricingMemo | None = None) -> StageResult:
    """Time one step. Without an engine card the step has no software overhead (kernel time only).
    `memo`: the caller's PricingMemo, when it prices many steps (a sweep, a serving run)."""
    results: list[OperationResult] = []
    step, saved, slowdown, _ = _walk(plan, hw, tables, engine, results, memo)
    return StageResult(plan.stage, step, plan.tokens_per_gpu, plan.num_layers, plan.micro_batches, saved, slowdown,
                       tuple(results))


def stage_time(plan: StagePlan, hw: HardwareCard, tables: KernelTables, engine: EngineCard | None = None,
               memo: PricingMemo | None = None) -> tuple[float, Bound]:
    """run_stage(...).step_time_s and .bound without the per-operation results and their detail
    strings, which a sweep row does not show (tests/test_engine_fast.py holds the two equal)."""
    step, by_bound = stage_time_by_bound(plan, hw, tables, engine, memo)
    return step, max(by_bound, key=by_bound.__getitem__)


def stage_time_by_bound(plan: StagePlan, hw: HardwareCard, tables: KernelTables, engine: EngineCard | None = None,
                        memo: PricingMemo | None = None) -> tuple[float, dict[Bound, float]]:
    """(step seconds, the operations' seconds per bound): what a step's energy needs
    (infersim.engine.energy), without the per-operation results."""
    step, _, _, by_bound = _walk(plan, hw, tables, engine, None, memo)
    return step, by_bound


def sequential_steps(steps: list[tuple[StageResult, int]], tokens_per_gpu: int) -> StageResult:
    """Steps run one after another (the chunks of one long prompt) as one stage result. Each step
    comes with the number of steps it stands for (1 when every chunk is priced). Times, FLOPs and
    bytes of each operation add up; each operation keeps the first step's order and detail, and the
    bound of the last step that took longer over it than all the steps before together."""
    if len(steps) == 1 and steps[0][1] == 1:
        return steps[0][0]
    # (group, name) -> [latest result, time, time per layer, FLOPs, bytes, bound, source, first detail]
    sums: dict[tuple[str, str], list[Any]] = {}
    for step, weight in steps:
        for op in step.operations:
            key = (op.group, op.name)
            time_s = op.time_s * weight
            kept = sums.get(key)
            if kept is None:
                sums[key] = [op, time_s, op.time_per_layer_s * weight, op.flops * weight, op.bytes * weight,
                             op.bound, op.source, op.detail]
                continue
            if kept[1] < time_s:
                kept[5] = op.bound
            if kept[6] != op.source:
                kept[6] = Source.MIXED
            kept[0] = op
            kept[1] += time_s
            kept[2] += op.time_per_layer_s * weight
            kept[3] += op.flops * weight
            kept[4] += op.bytes * weight
    merged = [OperationResult(op.name, op.module, op.layers, time_s, per_layer, flops, moved, bound, source, detail,
                              op.group)
              for op, time_s, per_layer, flops, moved, bound, source, detail in sums.values()]
    first = steps[0][0]
    return StageResult(first.stage, sum(s.step_time_s * w for s, w in steps), tokens_per_gpu, first.num_layers,
                       first.micro_batches, sum(s.overlap_saved_s * w for s, w in steps), first.sm_slowdown,
                       tuple(merged), chunks=sum(w for _s, w in steps))
