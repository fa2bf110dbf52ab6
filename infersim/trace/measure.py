"""Measure one GPU of a trace: its steps by stage, the layers and modules in them.

The pieces: `attribution` classifies every kernel (CPU operator, name rule, kernel family),
`steps` groups the kernels into forward steps, `layers` finds the layers in a step and each
kernel's module at its place. This module times them: kernel time per module, per layer and per
step, and keeps streams apart: communication kernels overlapped by compute kernels on another
stream have that time reported as hidden (exposed = duration - hidden); nothing is added twice.

Times are seconds, relative to the lane's first kernel.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence

from infersim.cards import categories as cat
from infersim.trace.attribution import Kernel, Lane
from infersim.trace.host import HostWaits, StepHost, step_host
from infersim.trace.layers import assign_marked_layers, assign_modules, assign_pattern_layers
from infersim.trace.load import RawTrace
from infersim.trace.records import (SOURCE_NONE, STAGES, AnalysisOptions, Attribution, LaneMeasure, LayerTime,
                                    ModuleTime, StageMeasure, StepMeasure, StreamTime, UnmatchedKernel)
from infersim.trace.rules import UNMATCHED, RuleTable
from infersim.trace.steps import StepGroup, form_steps, frame_layers, split_by_layers
from infersim.base.units import US  # trace timestamps are microseconds

# ---------------------------------------------------------------------------------------------
# Overlap of communication with compute on other streams


def _overlap(starts: Sequence[float], ends: Sequence[float], start: float, end: float) -> float:
    i = max(bisect_right(starts, start) - 1, 0)
    total = 0.0
    while i < len(starts) and starts[i] < end:
        lo, hi = max(starts[i], start), min(ends[i], end)
        if hi > lo:
            total += hi - lo
        i += 1
    return total


def busy_time(kernels: Sequence[Kernel]) -> float:
    """Time at least one of the kernels runs."""
    total, current_end = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        if k.end_us <= current_end:
            continue
        total += k.end_us - max(k.start_us, current_end)
        current_end = k.end_us
    return total


def _set_hidden_time(lane: Lane) -> None:
    """Hidden time of each communication kernel: its overlap with the union of compute kernels on
    other streams (the lane is in start order, so the union is built in one pass)."""
    comm = [lane.module1(p) in cat.COMMUNICATION for p in range(len(lane))]
    for stream in {lane.stream[p] for p in range(len(lane)) if comm[p]}:
        starts, ends = array("d"), array("d")
        for p in range(len(lane)):
            if comm[p] or not lane.is_kernel[p] or lane.stream[p] == stream or lane.dur[p] <= 0:
                continue
            start, end = lane.start[p], lane.start[p] + lane.dur[p]
            if starts and start <= ends[-1]:
                if end > ends[-1]:
                    ends[-1] = end
            else:
                starts.append(start)
                ends.append(end)
        for p in range(len(lane)):
            if comm[p] and lane.stream[p] == stream:
                lane.hidden[p] = _overlap(starts, ends, lane.start[p], lane.start[p] + lane.dur[p])


def _stream_times(lane: Lane) -> tuple[StreamTime, ...]:
    total: dict[int, float] = defaultdict(float)
    comm: dict[int, float] = defaultdict(float)
    count: Counter[int] = Counter()
    for p in range(len(lane)):
        stream, dur = lane.stream[p], lane.dur[p]
        total[stream] += dur
        count[stream] += 1
        if lane.module1(p) in cat.COMMUNICATION:
            comm[stream] += dur
    return tuple(StreamTime(s, total[s] * US, count[s], comm[s] * US) for s in sorted(total))


# ---------------------------------------------------------------------------------------------
# Steps, layers, modules


def _module_times(kernels: Sequence[Kernel], num_layers: int) -> tuple[ModuleTime, ...]:
    total: dict[str, float] = defaultdict(float)
    inside: dict[str, float] = defaultdict(float)
    hidden: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for k in kernels:
        total[k.module] += k.dur_us
        hidden[k.module] += min(k.hidden_us, k.dur_us)
        count[k.module] += 1
        if k.layer >= 0:
            inside[k.module] += k.dur_us
    out = []
    for module, t in total.items():
        per_layer = inside[module] / num_layers if inside[module] > 0 and num_layers else t
        out.append(ModuleTime(module, t * US, per_layer * US, (t - hidden[module]) * US, hidden[module] * US,
                              float(count[module])))
    return tuple(sorted(out, key=lambda m: -m.time_s))


class _LayerSums:
    """Kernel time per layer index and module, summed over the steps with the same layer count
    (kept per stage instead of per step: a long trace has thousands of steps)."""

    def __init__(self) -> None:
        self.by_count: dict[int, tuple[list[int], list[dict[str, float]]]] = {}

    def add(self, kernels: Sequence[Kernel], num_layers: int) -> None:
        steps, per_layer = self.by_count.setdefault(num_layers, ([0], [defaultdict(float) for _ in range(num_layers)]))
        steps[0] += 1
        for k in kernels:
            if 0 <= k.layer < num_layers:
                per_layer[k.layer][k.module] += k.dur_us

    def mean(self, num_layers: int) -> tuple[LayerTime, ...]:
        if num_layers not in self.by_count:
            return ()
        (steps,), per_layer = self.by_count[num_layers]
        out = []
        for i, modules in enumerate(per_layer):
            mean = sorted(((m, t * US / steps) for m, t in modules.items()), key=lambda x: -x[1])
            out.append(LayerTime(i, sum(t for _, t in mean), tuple(mean)))
        return tuple(out)


class _StageSums:
    """Per stage: layer sums, unmatched kernels and how kernels were classified."""

    def __init__(self) -> None:
        self.layers = _LayerSums()
        self.unmatched: Counter[str] = Counter()
        self.unmatched_us: dict[str, float] = defaultdict(float)
        self.attribution: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])

    def add(self, kernels: Sequence[Kernel], num_layers: int) -> None:
        self.layers.add(kernels, num_layers)
        for k in kernels:
            entry = self.attribution[(k.source if k.module != UNMATCHED else SOURCE_NONE, k.reason)]
            entry[0] += 1
            entry[1] += k.dur_us
            if k.module == UNMATCHED:
                self.unmatched[k.name] += 1
                self.unmatched_us[k.name] += k.dur_us


def _measure_step(kernels: Sequence[Kernel], group: StepGroup, source: str, number: int, num_layers: int,
                  origin_us: float, host: StepHost) -> StepMeasure:
    start = min(k.start_us for k in kernels)
    end = max(k.end_us for k in kernels)
    layer_source = {"annotations": "annotations", "frames": "module frames"}.get(group.layer_mode, "kernel pattern")
    if host.synchronous:
        wall_us, wall_source = host.span_us, f"{host.extent}, which the host waits in for the step's last kernel"
    else:
        wall_us, wall_source = end - start, "GPU span, first kernel start to last kernel end"
    return StepMeasure(
        index=number, label=group.label, stage=group.stage, step_source=source, layer_source=layer_source,
        start_s=(start - origin_us) * US, span_s=(end - start) * US, busy_s=busy_time(kernels) * US,
        kernel_time_s=sum(k.dur_us for k in kernels) * US, num_layers=num_layers,
        modules=_module_times(kernels, num_layers), stage_source=group.stage_source,
        wall_s=wall_us * US, wall_source=wall_source, synchronous=host.synchronous, host_extent=host.extent,
        host_work_s=host.work_us * US if host.extent else 0.0, launches=host.launches,
        layer_launch_s=host.layer_launch_us * US, layer_launch_gaps=host.layer_launch_gaps)


def _mean_modules(steps: Sequence[StepMeasure]) -> tuple[ModuleTime, ...]:
    n = len(steps)
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
    for s in steps:
        for m in s.modules:
            a = acc[m.module]
            a[0] += m.time_s
            a[1] += m.per_layer_s
            a[2] += m.exposed_s
            a[3] += m.hidden_s
            a[4] += m.kernels
    out = [ModuleTime(module, *(v / n for v in values)) for module, values in acc.items()]
    return tuple(sorted(out, key=lambda m: -m.time_s))


def _stage_measure(stage: str, steps: list[StepMeasure], sums: _StageSums, notes: tuple[str, ...]) -> StageMeasure:
    layer_counts = Counter(s.num_layers for s in steps)
    num_layers = layer_counts.most_common(1)[0][0]
    n = len(steps)
    return StageMeasure(
        stage=stage, steps=tuple(steps), num_layers=num_layers,
        wall_s=sum(s.wall_s for s in steps) / n, wall_source=Counter(s.wall_source for s in steps).most_common(1)[0][0],
        host_work_s=sum(s.host_work_s for s in steps) / n, launches=sum(s.launches for s in steps) / n,
        step_time_s=sum(s.span_s for s in steps) / n, busy_s=sum(s.busy_s for s in steps) / n,
        kernel_time_s=sum(s.kernel_time_s for s in steps) / n, modules=_mean_modules(steps),
        layers=sums.layers.mean(num_layers),
        unmatched=tuple(sorted((UnmatchedKernel(name, sums.unmatched[name], sums.unmatched_us[name] * US)
                                for name in sums.unmatched), key=lambda u: -u.time_s)),
        notes=notes,
        attribution=tuple(sorted((Attribution(source, reason, int(v[0]), v[1] * US)
                                  for (source, reason), v in sums.attribution.items()), key=lambda a: -a.time_s)))


def _group_steps(lane: Lane, group: StepGroup, options: AnalysisOptions) -> list[tuple[list[Kernel], str]]:
    """The kernels of a step group (built now, dropped after measuring), cut into several steps
    when --layers-per-step applies."""
    kernels = [lane.kernel(p) for p in group.positions]
    if options.layers_per_step and group.eager_unmarked:
        pieces = split_by_layers(kernels, options.layers_per_step)
        if len(pieces) > 1:
            source = f"{group.source}, cut every {options.layers_per_step} layers"
            return [(piece, source) for piece in pieces]
    return [(kernels, group.source)]


def _assign_layers(kernels: list[Kernel], group: StepGroup, lane: Lane) -> int:
    if group.layer_mode == "annotations":
        return assign_marked_layers(kernels, group.annotation_layers, "region", group.ffn_regions)
    if group.layer_mode == "frames":
        layers = frame_layers(kernels)
        if layers:
            return assign_marked_layers(kernels, layers, "layer_frame")
    return assign_pattern_layers(kernels)


class MeasuredSteps:
    """A lane's steps, each with its kernels placed in layers and modules (built one step at a time)."""

    def __init__(self, raw: RawTrace, lane_id: int, rules: RuleTable, options: AnalysisOptions) -> None:
        self.raw, self.rules, self.options, self.lane_id = raw, rules, options, lane_id
        self.lane = Lane(raw, lane_id, rules, options.step_regions)
        self.groups: list[StepGroup] = []
        self.leftovers = array("i")
        self._waits: HostWaits | None = None
        if len(self.lane):
            _set_hidden_time(self.lane)
            self.groups, self.leftovers = form_steps(self.lane, options)

    def __iter__(self) -> Iterator[tuple[StepGroup, str, list[Kernel], int]]:
        """(group, step source, kernels with their modules, layers) per step."""
        for group in self.groups:
            pieces = _group_steps(self.lane, group, self.options)
            for kernels, source in pieces:
                layers = _assign_layers(kernels, group, self.lane)
                assign_modules(kernels, self.rules)
                yield group, source, kernels, layers

    def host(self, group: StepGroup, kernels: Sequence[Kernel]) -> StepHost:
        """The CPU side of one step (trace.host); a group cut into several steps has no one extent."""
        if self._waits is None:
            self._waits = HostWaits(self.raw)
        whole = len(kernels) == len(group.positions)
        return step_host(self.lane, self._waits, kernels, group.annotation if whole else -1)


def analyze_lane(raw: RawTrace, lane_id: int, rules: RuleTable, options: AnalysisOptions) -> LaneMeasure:
    """Measure one GPU of a trace: its steps by stage, layers and modules."""
    return measure_steps(MeasuredSteps(raw, lane_id, rules, options))


def measure_steps(measured: MeasuredSteps) -> LaneMeasure:
    raw, lane, options, lane_id = measured.raw, measured.lane, measured.options, measured.lane_id
    rank = options.rank_label or (f"GPU {raw.lanes[lane_id]}" if len(raw.lanes) > 1 else "")
    device = raw.device_name(lane_id) or ""
    if not len(lane):
        return LaneMeasure(str(raw.path), rank, (), (), 0, 0.0, 0.0, 0, ("no GPU kernels in this trace", *raw.notes),
                           device)
    origin = lane.start[0]
    groups, leftovers = measured.groups, measured.leftovers
    by_stage: dict[str, list[StepMeasure]] = defaultdict(list)
    sums: dict[str, _StageSums] = defaultdict(_StageSums)
    number = 0
    for group, source, kernels, layers in measured:
        step = _measure_step(kernels, group, source, number, layers, origin, measured.host(group, kernels))
        number += 1
        by_stage[group.stage].append(step)
        sums[group.stage].add(kernels, layers)
    notes: list[str] = list(raw.notes)
    if options.step_regions and not any(a.name in options.step_regions for a in raw.annotations):
        notes.append(f"no annotation named {', '.join(options.step_regions)} in the trace (--step-regions): steps "
                     "were found as without it")
    stages = []
    wanted = options.stage
    if wanted is not None:
        if wanted not in by_stage and "unknown" in by_stage:
            notes.append(f"the trace does not mark steps as prefill or decode: all its steps are taken as {wanted}")
            by_stage = {wanted: by_stage["unknown"]}
            sums[wanted] = sums["unknown"]
        by_stage = {s: v for s, v in by_stage.items() if s == wanted}
    for stage in sorted(by_stage, key=lambda s: STAGES.index(s) if s in STAGES else len(STAGES)):
        if stage == "idle":
            continue
        steps = by_stage[stage]
        stage_notes = []
        if all(s.layer_source == "kernel pattern" and not s.num_layers for s in steps):
            stage_notes.append("no attention kernel found (by operator, rule or family): layers not found")
        stages.append(_stage_measure(stage, steps, sums[stage], tuple(stage_notes)))
    if not groups:
        notes.append("no forward step found (no attention kernels and no step annotations)")
    return LaneMeasure(
        path=str(raw.path), rank=rank, stages=tuple(stages), streams=_stream_times(lane), kernels=len(lane),
        kernel_time_s=sum(lane.dur) * US,
        outside_steps_s=sum(lane.dur[p] for p in leftovers) * US, outside_steps_kernels=len(leftovers),
        notes=tuple(notes), device=device)


def lane_ids(raw: RawTrace, lane: str | None = None) -> list[int]:
    """GPU lanes that ran kernels, numerically ordered; `lane` picks one by its pid."""
    present = sorted(set(raw.kernel_lane), key=lambda i: (not raw.lanes[i].lstrip("-").isdigit(),
                                                           int(raw.lanes[i]) if raw.lanes[i].lstrip("-").isdigit()
                                                           else 0, raw.lanes[i]))
    if lane is None:
        return present
    return [i for i in present if raw.lanes[i] == lane]
