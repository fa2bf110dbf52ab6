"""From a trace's kernels to measured time per step, per layer and per simulator module.

How a kernel is placed (one GPU lane = one rank at a time):

1. Launch context. A kernel's `args.correlation` names the CPU launch call (`cudaLaunchKernel`,
   `cuLaunchKernelEx`, `cudaGraphLaunch`, ...); the user annotations open on that CPU thread at
   launch time are the kernel's context. All kernels of one CUDA-graph replay share the
   correlation of their `cudaGraphLaunch` (they have no launch of their own).
2. Steps. In order of preference: DeepSeek-style forward regions (`attn(F)`, `mlp(F)`, ... grouped
   by their enclosing `ProfilerStep#N` / `step[...]`); SGLang step spans `step[EXTEND ...]` /
   `step[DECODE ...]`; one step per CUDA-graph replay (decode); kernels under one `ProfilerStep#N`;
   otherwise the eager kernels between graph replays. Eager groups without an attention kernel
   (sampling, batch preparation between decode replays) join the step before them.
3. Layers. With forward regions, a layer runs from one `attn(F)` region up to the next. Without
   them, layers are found from the kernel sequence: each run of attention-core kernels (rule role
   `attention`) is one layer's attention; the first norm after it starts the FFN half; the first
   norm after FFN work starts the next layer. This works on CUDA-graph replays, which carry no
   CPU annotations.
4. Modules. The rule table names each kernel's module; dense GEMMs (`gemm`) become attention
   projections before the post-attention norm, the router gate when a top-k kernel follows,
   shared experts (layers with routed experts) or dense FFN after it, the LM head after the last
   layer.
5. Streams stay apart: communication kernels overlapped by compute kernels on another stream
   have that time reported as hidden (exposed = duration - hidden); nothing is added twice.

Times are seconds, relative to the lane's first kernel.
"""

from __future__ import annotations

import heapq
import re
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from infersim.modules import categories as cat
from infersim.trace.load import KIND_KERNEL, RawTrace
from infersim.trace.rules import GEMM, OTHER, UNMATCHED, RuleTable
from infersim.units import US  # trace timestamps are microseconds


_SGLANG_STEP = re.compile(r"^step\[(?P<mode>[A-Za-z_]+)")
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_FORWARD_REGION = re.compile(r"\(F\)\s*$")
_BACKWARD_REGION = re.compile(r"\((B|W)\)\s*$|(?i:backward)")
_ATTENTION_REGION = re.compile(r"(?i)^\s*(attn|attention|self_attn|mla)")
_FFN_REGION = re.compile(r"(?i)^\s*(mlp|moe|ffn|expert|shared|dispatch|combine)")
_MODE_STAGE = {"EXTEND": "prefill", "PREFILL": "prefill", "MIXED": "prefill", "DRAFT_EXTEND": "prefill",
               "DECODE": "decode", "TARGET_VERIFY": "decode", "DRAFT_DECODE": "decode", "IDLE": "idle"}
_DECODE_ATTENTION = re.compile(r"(?i)decode|splitkv|_stage1|kernel_mha$|paged_attention")
_PREFILL_ATTENTION = re.compile(r"(?i)prefill|extend|^_fwd_kernel$|fmha_v2|varlen")

STAGES = ("prefill", "decode", "unknown")
# modules that only occur in the FFN half of a layer (used when no norm marks the boundary)
_FFN_MODULES = frozenset({cat.MOE_EXPERTS, cat.ROUTER, cat.DISPATCH, cat.COMBINE, cat.SHARED_EXPERT, cat.DENSE_FFN})
# kernels that count as real work between two norms (two back-to-back norms do not end a layer)
_CONTENT_MODULES = frozenset({GEMM, cat.MOE_EXPERTS, cat.ROUTER, cat.DISPATCH, cat.COMBINE, cat.ALL_REDUCE,
                              cat.DP_GATHER, cat.SHARED_EXPERT, cat.DENSE_FFN, cat.ATTN_PROJ})
# kernels that end the router look-ahead of a GEMM: the next GEMM-like step has started
_ROUTER_STOP = frozenset({GEMM, cat.MOE_EXPERTS, cat.DISPATCH, cat.COMBINE, cat.SHARED_EXPERT, cat.DENSE_FFN})
ROUTER_LOOKAHEAD = 10  # kernels after a GEMM searched for the top-k that makes it the router gate


# ---------------------------------------------------------------------------------------------
# Result records


@dataclass(frozen=True)
class ModuleTime:
    """One module's kernel time in a step (or the mean over a stage's steps)."""

    module: str
    time_s: float  # kernel time per step, all streams
    per_layer_s: float  # kernel time inside layers / layers (per step time when it never runs in a layer)
    exposed_s: float  # not overlapped by compute on another stream (= time_s for compute modules)
    hidden_s: float  # overlapped by compute on another stream (communication only)
    kernels: float  # launches per step


@dataclass(frozen=True)
class LayerTime:
    index: int
    time_s: float  # kernel time of the layer, all streams
    modules: tuple[tuple[str, float], ...]  # (module, seconds), largest first


@dataclass(frozen=True)
class StepMeasure:
    index: int
    label: str  # the annotation, graph replay or group the step came from
    stage: str
    step_source: str  # how the step was found
    layer_source: str  # "annotations" or "kernel pattern"
    start_s: float
    span_s: float  # first kernel start to last kernel end
    busy_s: float  # time at least one kernel runs
    kernel_time_s: float  # sum of kernel durations (streams added)
    num_layers: int
    modules: tuple[ModuleTime, ...]


@dataclass(frozen=True)
class UnmatchedKernel:
    name: str
    count: int
    time_s: float


@dataclass(frozen=True)
class StageMeasure:
    """Measured time of one stage: the mean over its steps."""

    stage: str
    steps: tuple[StepMeasure, ...]
    num_layers: int  # the most common layer count of the steps
    step_time_s: float  # mean GPU span of a step
    busy_s: float
    kernel_time_s: float
    modules: tuple[ModuleTime, ...]  # largest first
    layers: tuple[LayerTime, ...]  # per layer index, mean over the steps with the usual layer count
    unmatched: tuple[UnmatchedKernel, ...]
    notes: tuple[str, ...] = ()

    def module(self, name: str) -> ModuleTime | None:
        return next((m for m in self.modules if m.module == name), None)


@dataclass(frozen=True)
class StreamTime:
    stream: int
    kernel_time_s: float
    kernels: int
    communication_s: float  # of which communication kernels


@dataclass(frozen=True)
class LaneMeasure:
    """Everything measured on one GPU (one rank) of one trace file."""

    path: str
    rank: str
    stages: tuple[StageMeasure, ...]
    streams: tuple[StreamTime, ...]
    kernels: int
    kernel_time_s: float
    outside_steps_s: float  # kernel time in no step (backward passes, warm-up, idle-batch work)
    outside_steps_kernels: int
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> StageMeasure | None:
        return next((s for s in self.stages if s.stage == name), None)


@dataclass(frozen=True)
class AnalysisOptions:
    stage: str | None = None  # only this stage; None: every stage found
    layers_per_step: int | None = None  # split unmarked eager kernels into steps of this many layers
    file_stage: str | None = None  # stage from the file name (-EXTEND / -DECODE)
    rank_label: str = ""  # rank from the file name
    lane: str | None = None  # GPU lane of a merged file (its pid); None = every lane


# ---------------------------------------------------------------------------------------------
# Internal working records


@dataclass(slots=True)
class _Kernel:
    """One kernel of the step being analysed (built per step: a lane can hold millions)."""

    position: int  # in the lane's start order
    name: str
    start_us: float
    dur_us: float
    stream: int
    is_kernel: bool
    hidden_us: float
    region: int  # forward region annotation, -1: none
    module1: str  # module before the kernel's place in the step is known
    role: str | None
    place: str = "outside_layers"
    layer: int = -1
    ffn_phase: bool = False
    module: str = ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass
class _StepGroup:
    label: str
    stage: str
    source: str
    positions: array  # lane positions (typed "i"), in start order
    layer_mode: str  # "annotations" / "pattern"
    eager_unmarked: bool = False
    annotation_layers: dict[int, int] = field(default_factory=dict)  # region -> layer number


# ---------------------------------------------------------------------------------------------
# Launch and annotation context


def _annotation_kind(name: str) -> str:
    if _SGLANG_STEP.match(name):
        return "step"
    if _PROFILER_STEP.match(name):
        return "profiler_step"
    if _FORWARD_REGION.search(name):
        if _ATTENTION_REGION.match(name):
            return "fwd_attn"
        if _FFN_REGION.match(name):
            return "fwd_ffn"
        return "fwd_other"
    if _BACKWARD_REGION.search(name):
        return "backward"
    return "other"


def _is_sorted(values: array) -> bool:
    return all(values[i] <= values[i + 1] for i in range(len(values) - 1))


class _Launches:
    """Correlation id -> launch row, and each launch's CPU context: the innermost step annotation,
    forward region and backward region open on its thread when it was called (typed columns)."""

    def __init__(self, raw: RawTrace) -> None:
        self.raw = raw
        corr = raw.launch_correlation
        # Kineto numbers launches in call order, so the ids are usually sorted already
        if _is_sorted(corr):
            self.order: array | None = None
            self.sorted_corr = corr
        else:
            self.order = array("l", sorted(range(len(corr)), key=corr.__getitem__))
            self.sorted_corr = array("q", (corr[i] for i in self.order))
        self.kinds = [_annotation_kind(a.name) for a in raw.annotations]
        n = len(corr)
        self.step = array("i", [-1]) * n
        self.region = array("i", [-1]) * n
        self.backward = array("b", [0]) * n
        self._sweep_annotations()

    def candidates(self, correlation: int) -> list[int]:
        lo = bisect_left(self.sorted_corr, correlation)
        hi = bisect_right(self.sorted_corr, correlation, lo)
        if self.order is None:
            return list(range(lo, hi))
        return [self.order[i] for i in range(lo, hi)]

    def is_graph(self, launch: int) -> bool:
        return "GraphLaunch" in self.raw.names[self.raw.launch_name[launch]]

    def _sweep_annotations(self) -> None:
        raw = self.raw
        by_thread_ann: dict[int, list[int]] = defaultdict(list)
        for i, ann in enumerate(raw.annotations):
            if self.kinds[i] != "other":  # wrappers like `1F1B` say nothing about steps or modules
                by_thread_ann[ann.thread].append(i)
        if not by_thread_ann:
            return
        by_thread_launch: dict[int, array] = defaultdict(lambda: array("l"))
        for launch in range(len(raw.launch_thread)):
            if raw.launch_thread[launch] in by_thread_ann:
                by_thread_launch[raw.launch_thread[launch]].append(launch)
        for thread, launches in by_thread_launch.items():
            if not all(raw.launch_start_us[launches[i]] <= raw.launch_start_us[launches[i + 1]]
                       for i in range(len(launches) - 1)):
                launches = array("l", sorted(launches, key=raw.launch_start_us.__getitem__))
            anns = sorted(by_thread_ann[thread],
                          key=lambda i: (raw.annotations[i].start_us, -raw.annotations[i].end_us))
            stack: list[int] = []
            next_ann = 0
            for launch in launches:
                ts = raw.launch_start_us[launch]
                while next_ann < len(anns) and raw.annotations[anns[next_ann]].start_us <= ts:
                    stack.append(anns[next_ann])
                    next_ann += 1
                while stack and raw.annotations[stack[-1]].end_us < ts:
                    stack.pop()
                step = region = -1
                backward = False
                for ann in reversed(stack):
                    a = raw.annotations[ann]
                    if not (a.start_us <= ts <= a.end_us):
                        continue
                    kind = self.kinds[ann]
                    if kind in ("fwd_attn", "fwd_ffn", "fwd_other"):
                        if region < 0 and not backward:
                            region = ann
                    elif kind == "backward":
                        if region < 0:
                            backward = True
                    elif kind in ("step", "profiler_step") and step < 0:
                        step = ann
                self.step[launch] = step
                self.region[launch] = region
                self.backward[launch] = backward


def _rows_in_start_order(raw: RawTrace, lane_id: int) -> array:
    """The lane's kernel rows by start time (ties by row). Each stream runs its kernels one after
    another, so the file usually lists a stream in order already: merging the streams needs no
    copy of the whole lane as Python objects (a sort would, for millions of kernels)."""
    start = raw.kernel_start_us
    by_stream: dict[int, array] = defaultdict(lambda: array("i"))
    lanes, streams = raw.kernel_lane, raw.kernel_stream
    for row in range(raw.kernel_count):
        if lanes[row] == lane_id:
            by_stream[streams[row]].append(row)

    def key(row: int) -> tuple[float, int]:
        return start[row], row

    ordered = []
    for rows in by_stream.values():
        if not all(key(rows[i]) <= key(rows[i + 1]) for i in range(len(rows) - 1)):
            rows = array("i", sorted(rows, key=key))
        ordered.append(rows)
    return array("i", heapq.merge(*ordered, key=key))


class _Lane:
    """One GPU's kernels in start order, as typed columns."""

    def __init__(self, raw: RawTrace, lane_id: int, rules: RuleTable) -> None:
        self.raw = raw
        self.rules = rules
        self.rows = rows = _rows_in_start_order(raw, lane_id)
        n = len(rows)
        self.start = array("d", (raw.kernel_start_us[r] for r in rows))
        self.dur = array("d", (raw.kernel_dur_us[r] for r in rows))
        self.stream = array("q", (raw.kernel_stream[r] for r in rows))
        self.is_kernel = array("b", (raw.kernel_kind[r] == KIND_KERNEL for r in rows))
        self.hidden = array("d", [0.0]) * n
        # position-free rule of each kernel, as an index into rules.rules (-1: no rule)
        rule_index = {id(rule): i for i, rule in enumerate(rules.rules)}
        name_rule: dict[int, int] = {}
        self.rule = array("i", [-1]) * n
        for p, r in enumerate(rows):
            name_id = raw.kernel_name[r]
            found = name_rule.get(name_id)
            if found is None:
                rule = rules.match(raw.names[name_id])
                found = name_rule[name_id] = rule_index[id(rule)] if rule else -1
            self.rule[p] = found
        self.module1_of_rule = [r.module for r in rules.rules]
        self.role_of_rule = [r.role for r in rules.rules]
        self.launches = _Launches(raw)
        self.thread = array("i", [-1]) * n
        self.graph = array("b", [0]) * n
        self.step_ann = array("i", [-1]) * n
        self.region = array("i", [-1]) * n
        self.backward = array("b", [0]) * n
        self._resolve_launches()

    def __len__(self) -> int:
        return len(self.rows)

    def name(self, p: int) -> str:
        return self.raw.names[self.raw.kernel_name[self.rows[p]]]

    def correlation(self, p: int) -> int:
        return self.raw.kernel_correlation[self.rows[p]]

    def module1(self, p: int) -> str:
        rule = self.rule[p]
        return self.module1_of_rule[rule] if rule >= 0 else UNMATCHED

    def role(self, p: int) -> str | None:
        rule = self.rule[p]
        return self.role_of_rule[rule] if rule >= 0 else None

    def kernel(self, p: int) -> _Kernel:
        return _Kernel(p, self.name(p), self.start[p], self.dur[p], self.stream[p], bool(self.is_kernel[p]),
                       self.hidden[p], self.region[p], self.module1(p), self.role(p))

    def _resolve_launches(self) -> None:
        """Launch of each kernel. Where correlation ids repeat (a merged multi-process file), the
        launch from the process that launches this lane's other kernels wins, else the latest
        launch before the kernel started."""
        raw, launches = self.raw, self.launches
        no_launches = len(raw.launch_correlation) == 0
        if no_launches:
            # CPU activities not recorded: kernels of one graph replay still share a correlation
            counts = Counter(self.correlation(p) for p in range(len(self)))
            for p in range(len(self)):
                corr = self.correlation(p)
                self.graph[p] = corr >= 0 and counts[corr] > 1
            return
        chosen = array("i", [-1]) * len(self)
        ambiguous: list[tuple[int, list[int]]] = []
        pid_votes: Counter[str] = Counter()
        for p in range(len(self)):
            corr = self.correlation(p)
            if corr < 0:
                continue
            found = launches.candidates(corr)
            if len(found) == 1:
                chosen[p] = found[0]
                pid_votes[raw.threads[raw.launch_thread[found[0]]][0]] += 1
            elif found:
                ambiguous.append((p, found))
        lane_pid = pid_votes.most_common(1)[0][0] if pid_votes else None
        for p, found in ambiguous:
            same_pid = [f for f in found if raw.threads[raw.launch_thread[f]][0] == lane_pid]
            pool = same_pid or found
            before = [f for f in pool if raw.launch_start_us[f] <= self.start[p]]
            chosen[p] = max(before or pool, key=raw.launch_start_us.__getitem__)
        for p in range(len(self)):
            launch = chosen[p]
            if launch < 0:
                continue
            self.thread[p] = raw.launch_thread[launch]
            self.graph[p] = launches.is_graph(launch)
            self.step_ann[p] = launches.step[launch]
            self.region[p] = launches.region[launch]
            self.backward[p] = launches.backward[launch]


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


def _busy(kernels: Sequence[_Kernel]) -> float:
    """Time at least one of the kernels runs."""
    total, current_end = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        if k.end_us <= current_end:
            continue
        total += k.end_us - max(k.start_us, current_end)
        current_end = k.end_us
    return total


def _set_hidden_time(lane: _Lane) -> None:
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


# ---------------------------------------------------------------------------------------------
# Steps


def _stage_of_annotation(name: str) -> str:
    match = _SGLANG_STEP.match(name)
    if not match:
        return "unknown"
    return _MODE_STAGE.get(match.group("mode").upper(), "unknown")


def _stage_from_attention(lane: _Lane, positions: Sequence[int]) -> str:
    names = [lane.name(p) for p in positions if lane.role(p) == "attention"]
    if any(_DECODE_ATTENTION.search(n) for n in names):
        return "decode"
    if any(_PREFILL_ATTENTION.search(n) for n in names):
        return "prefill"
    return "unknown"


def _has_attention(lane: _Lane, positions: Sequence[int]) -> bool:
    return any(lane.role(p) == "attention" for p in positions)


def _form_steps(lane: _Lane, options: AnalysisOptions) -> tuple[list[_StepGroup], array]:
    """Group the lane's kernels into steps; return the steps and the positions left over."""
    annotations = lane.raw.annotations
    kinds = lane.launches.kinds
    n = len(lane)
    leftovers = array("i")

    # A. forward regions (attn(F), mlp(F), ...): layers come from the annotations
    regions = sorted({lane.region[p] for p in range(n) if lane.region[p] >= 0},
                     key=lambda r: (annotations[r].thread, annotations[r].start_us))
    if regions:
        region_step: dict[int, int] = {}
        for r in regions:
            a = annotations[r]
            enclosing = [i for i, s in enumerate(annotations)
                         if kinds[i] in ("step", "profiler_step") and s.thread == a.thread
                         and s.start_us <= a.start_us <= s.end_us]
            region_step[r] = min(enclosing, key=lambda i: annotations[i].end_us - annotations[i].start_us) \
                if enclosing else -1
        groups: dict[int, _StepGroup] = {}
        layer_counter: dict[int, int] = defaultdict(lambda: -1)
        for r in regions:  # in (thread, start) order: a new layer at each attention region
            key = region_step[r]
            if key not in groups:
                label = annotations[key].name if key >= 0 else "forward regions"
                stage = _stage_of_annotation(label) if key >= 0 else "unknown"
                groups[key] = _StepGroup(label, stage, "forward annotations", array("i"), "annotations")
            if kinds[r] == "fwd_attn" or layer_counter[key] < 0:
                layer_counter[key] += 1
            groups[key].annotation_layers[r] = layer_counter[key]
        step_threads = {key: {annotations[r].thread for r in group.annotation_layers} for key, group in groups.items()}
        for p in range(n):
            region = lane.region[p]
            if region >= 0:
                groups[region_step[region]].positions.append(p)
                continue
            # bare kernels (no region, not backward) launched on the thread of a step's forward
            # regions within that step: embedding before the first layer, LM head after the last
            key = next((key for key, threads in step_threads.items()
                        if lane.thread[p] in threads and (key < 0 or lane.step_ann[p] == key)), None)
            if key is not None and not lane.backward[p]:
                groups[key].positions.append(p)
            else:
                leftovers.append(p)
        steps = [g for g in groups.values() if g.positions]
        for g in steps:
            if g.stage == "unknown" and options.file_stage:
                g.stage = options.file_stage
        return steps, leftovers

    # B. no forward regions: SGLang step spans, CUDA-graph replays, profiler steps, eager runs
    by_annotation: dict[int, _StepGroup] = {}
    graph_groups: dict[tuple[int, int], _StepGroup] = {}
    profiler_groups: dict[int, _StepGroup] = {}
    eager = array("i")
    for p in range(n):
        ann = lane.step_ann[p]
        if ann >= 0 and kinds[ann] == "step":
            group = by_annotation.get(ann)
            if group is None:
                name = annotations[ann].name
                group = by_annotation[ann] = _StepGroup(name, _stage_of_annotation(name), "step annotation",
                                                        array("i"), "pattern")
            group.positions.append(p)
        elif lane.graph[p]:
            key = (lane.thread[p], lane.correlation(p))
            group = graph_groups.get(key)
            if group is None:
                group = graph_groups[key] = _StepGroup(
                    f"CUDA-graph replay (correlation {key[1]})", "decode", "CUDA-graph replay", array("i"), "pattern")
            group.positions.append(p)
        elif ann >= 0 and kinds[ann] == "profiler_step":
            group = profiler_groups.get(ann)
            if group is None:
                group = profiler_groups[ann] = _StepGroup(annotations[ann].name, "unknown", "profiler step",
                                                          array("i"), "pattern")
            group.positions.append(p)
        else:
            eager.append(p)
    steps = [*by_annotation.values(), *graph_groups.values(), *profiler_groups.values()]
    # eager kernels outside any marker: split into runs at the other steps
    if eager:
        boundaries = sorted(lane.start[g.positions[0]] for g in steps)
        runs: dict[int, array] = defaultdict(lambda: array("i"))
        for p in eager:
            runs[bisect_right(boundaries, lane.start[p])].append(p)
        for run in runs.values():
            steps.append(_StepGroup("eager kernels", "unknown", "eager kernels between steps" if boundaries
                                    else "whole trace", run, "pattern", eager_unmarked=True))
    steps.sort(key=lambda g: g.positions[0])
    # groups without attention are the tail of the step before (sampling, next-batch preparation)
    merged: list[_StepGroup] = []
    pending = array("i")
    for group in steps:
        if _has_attention(lane, group.positions):
            if pending:
                group.positions = array("i", sorted(pending + group.positions))
                pending = array("i")
            merged.append(group)
        elif merged:
            merged[-1].positions.extend(group.positions)
        else:
            pending.extend(group.positions)
    if pending:
        if merged:
            merged[-1].positions = array("i", sorted(merged[-1].positions + pending))
        else:
            leftovers.extend(pending)  # no attention anywhere: no step to compare
    for g in merged:
        g.positions = array("i", sorted(g.positions))  # positions are in start order
        if g.stage == "unknown":
            g.stage = options.file_stage or _stage_from_attention(lane, g.positions)
    return merged, leftovers


# ---------------------------------------------------------------------------------------------
# Layers


def _attention_runs(kernels: Sequence[_Kernel]) -> list[tuple[int, int]]:
    """(first, last) index of each attention call: attention-role kernels, with the attention
    helpers (split-KV combine, metadata) and other streams' kernels allowed in between."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(kernels)
    while i < n:
        if kernels[i].role != "attention":
            i += 1
            continue
        stream, last, j = kernels[i].stream, i, i + 1
        while j < n and (kernels[j].module1 == cat.ATTN_CORE or kernels[j].stream != stream):
            if kernels[j].role == "attention" and kernels[j].stream == stream:
                last = j
            j += 1
        runs.append((i, last))
        i = last + 1
    return runs


def _has_content(kernels: Sequence[_Kernel], lo: int, hi: int) -> bool:
    return any(kernels[j].module1 in _CONTENT_MODULES for j in range(lo, hi))


def _pattern_layers(kernels: Sequence[_Kernel]) -> list[tuple[int, int, int]]:
    """(start, ffn_start, end) index ranges of the layers in a step without layer annotations."""
    runs = _attention_runs(kernels)
    if not runs:
        return []
    n = len(kernels)
    boundaries: list[int] = []  # FFN-half start per layer
    for i, (_, last) in enumerate(runs):
        limit = runs[i + 1][0] if i + 1 < len(runs) else n
        ffn = next((j for j in range(last + 1, limit) if kernels[j].role == "norm"), None)
        if ffn is None:
            ffn = next((j for j in range(last + 1, limit) if kernels[j].module1 in _FFN_MODULES), limit)
        boundaries.append(ffn)
    first_start = next((j for j in range(runs[0][0]) if kernels[j].role == "norm"), 0)
    starts = [first_start]
    ends: list[int] = []
    for i in range(len(runs)):
        limit = runs[i + 1][0] if i + 1 < len(runs) else n
        ffn = boundaries[i]
        end = next((j for j in range(ffn + 1, limit)
                    if kernels[j].role == "norm" and _has_content(kernels, ffn + 1, j)), None)
        if end is None and i + 1 < len(runs):
            # no norm marks the next layer: it starts after the last FFN-side kernel
            stop = next((j for j in range(limit - 1, ffn, -1)
                         if kernels[j].module1 in _FFN_MODULES | {cat.ALL_REDUCE, cat.DP_GATHER}), None)
            end = stop + 1 if stop is not None else runs[i + 1][0]
        if end is None:
            end = n
        end = max(end, ffn)
        ends.append(end)
        if i + 1 < len(runs):
            starts.append(min(end, runs[i + 1][0]))
    return [(starts[i], min(boundaries[i], ends[i]), ends[i]) for i in range(len(runs))]


def _assign_pattern_layers(kernels: list[_Kernel]) -> int:
    layers = _pattern_layers(kernels)
    if not layers:
        for k in kernels:
            k.place = "outside_layers"
        return 0
    first, last_end = layers[0][0], layers[-1][2]
    for k in kernels[:first]:
        k.place = "before_layers"
    for k in kernels[last_end:]:
        k.place = "after_layers"
    for number, (start, ffn, end) in enumerate(layers):
        for j in range(start, end):
            k = kernels[j]
            k.place, k.layer, k.ffn_phase = "in_layers", number, j >= ffn
    return len(layers)


def _assign_annotated_layers(kernels: list[_Kernel], region_layers: dict[int, int], kinds: Sequence[str]) -> int:
    in_layers = [i for i, k in enumerate(kernels) if k.region >= 0]
    if not in_layers:
        return 0
    first, last = in_layers[0], in_layers[-1]
    by_layer: dict[int, list[_Kernel]] = defaultdict(list)
    for i, k in enumerate(kernels):
        if k.region >= 0:
            k.place, k.layer = "in_layers", region_layers[k.region]
            by_layer[k.layer].append(k)
        else:
            k.place = "before_layers" if i < first else "after_layers" if i > last else "in_layers"
    for layer_kernels in by_layer.values():
        runs = _attention_runs(layer_kernels)
        after = runs[0][1] + 1 if runs else 0
        ffn = next((j for j in range(len(layer_kernels))
                    if kinds[layer_kernels[j].region] == "fwd_ffn"
                    or (j >= after and runs and layer_kernels[j].role == "norm")), len(layer_kernels))
        for j, k in enumerate(layer_kernels):
            k.ffn_phase = j >= ffn
    return len(by_layer)


def _resolve_gemm(k: _Kernel, layer_kernels: Sequence[_Kernel], at: int, layer_has_experts: bool) -> str:
    if k.place == "after_layers":
        return cat.LM_HEAD
    if k.place != "in_layers" or k.layer < 0:
        return OTHER
    if not k.ffn_phase:
        return cat.ATTN_PROJ
    for nxt in layer_kernels[at + 1:at + 1 + ROUTER_LOOKAHEAD]:
        if nxt.role == "topk":
            return cat.ROUTER
        if nxt.module1 in _ROUTER_STOP:
            break
    return cat.SHARED_EXPERT if layer_has_experts else cat.DENSE_FFN


def _assign_modules(kernels: list[_Kernel], rules: RuleTable) -> None:
    by_layer: dict[int, list[_Kernel]] = defaultdict(list)
    for k in kernels:
        if k.layer >= 0:
            by_layer[k.layer].append(k)
    experts = {layer for layer, ks in by_layer.items() if any(k.module1 == cat.MOE_EXPERTS for k in ks)}
    position_in_layer = {id(k): i for ks in by_layer.values() for i, k in enumerate(ks)}
    for k in kernels:
        rule = rules.match(k.name, k.place)
        module = rule.module if rule else UNMATCHED
        if module == GEMM:
            module = _resolve_gemm(k, by_layer.get(k.layer, ()), position_in_layer.get(id(k), 0), k.layer in experts)
        k.module = module


# ---------------------------------------------------------------------------------------------
# Measuring


def _module_times(kernels: Sequence[_Kernel], num_layers: int) -> tuple[ModuleTime, ...]:
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

    def add(self, kernels: Sequence[_Kernel], num_layers: int) -> None:
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


def _measure_step(kernels: Sequence[_Kernel], group: _StepGroup, source: str, number: int, num_layers: int,
                  origin_us: float) -> StepMeasure:
    start = min(k.start_us for k in kernels)
    end = max(k.end_us for k in kernels)
    return StepMeasure(
        index=number, label=group.label, stage=group.stage, step_source=source,
        layer_source="annotations" if group.layer_mode == "annotations" else "kernel pattern",
        start_s=(start - origin_us) * US, span_s=(end - start) * US, busy_s=_busy(kernels) * US,
        kernel_time_s=sum(k.dur_us for k in kernels) * US, num_layers=num_layers,
        modules=_module_times(kernels, num_layers))


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


def _stage_measure(stage: str, steps: list[StepMeasure], layer_sums: _LayerSums, unmatched: Counter,
                   unmatched_time: dict, notes: tuple[str, ...]) -> StageMeasure:
    layer_counts = Counter(s.num_layers for s in steps)
    num_layers = layer_counts.most_common(1)[0][0]
    n = len(steps)
    return StageMeasure(
        stage=stage, steps=tuple(steps), num_layers=num_layers,
        step_time_s=sum(s.span_s for s in steps) / n, busy_s=sum(s.busy_s for s in steps) / n,
        kernel_time_s=sum(s.kernel_time_s for s in steps) / n, modules=_mean_modules(steps),
        layers=layer_sums.mean(num_layers),
        unmatched=tuple(sorted((UnmatchedKernel(name, unmatched[name], unmatched_time[name] * US)
                                for name in unmatched), key=lambda u: -u.time_s)),
        notes=notes)


def _split_by_layers(kernels: list[_Kernel], layers_per_step: int) -> list[list[_Kernel]]:
    """Cut unmarked eager kernels holding several forward passes into steps of N layers.

    Between the last layer of one pass and the first of the next lie the LM head, sampling and the
    next embedding; the cut goes into the longest GPU idle gap there (the scheduler's time between
    two forward passes)."""
    ranges = _pattern_layers(kernels)
    if len(ranges) <= layers_per_step:
        return [kernels]
    cuts = []
    for first in range(layers_per_step, len(ranges), layers_per_step):
        lo, hi = ranges[first - 1][1] + 1, ranges[first][1]  # FFN start of the last layer .. of the next
        ends = [kernels[lo - 1].end_us]
        for j in range(lo, hi):
            ends.append(max(ends[-1], kernels[j].end_us))
        gaps = [(kernels[j].start_us - ends[j - lo], j) for j in range(lo, hi)]
        cuts.append(max(gaps)[1] if gaps else ranges[first][0])
    pieces, prev = [], 0
    for cut in [*cuts, len(kernels)]:
        if cut > prev:
            pieces.append(kernels[prev:cut])
        prev = cut
    return pieces


def _stream_times(lane: _Lane) -> tuple[StreamTime, ...]:
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


def _group_steps(lane: _Lane, group: _StepGroup, options: AnalysisOptions) -> list[tuple[list[_Kernel], str]]:
    """The kernels of a step group (built now, dropped after measuring), cut into several steps
    when --layers-per-step applies."""
    kernels = [lane.kernel(p) for p in group.positions]
    if options.layers_per_step and group.eager_unmarked:
        pieces = _split_by_layers(kernels, options.layers_per_step)
        if len(pieces) > 1:
            source = f"{group.source}, cut every {options.layers_per_step} layers"
            return [(piece, source) for piece in pieces]
    return [(kernels, group.source)]


def analyze_lane(raw: RawTrace, lane_id: int, rules: RuleTable, options: AnalysisOptions) -> LaneMeasure:
    """Measure one GPU of a trace: its steps by stage, layers and modules."""
    lane = _Lane(raw, lane_id, rules)
    rank = options.rank_label or (f"GPU {raw.lanes[lane_id]}" if len(raw.lanes) > 1 else "")
    if not len(lane):
        return LaneMeasure(str(raw.path), rank, (), (), 0, 0.0, 0.0, 0, ("no GPU kernels in this trace",))
    origin = lane.start[0]
    _set_hidden_time(lane)
    groups, leftovers = _form_steps(lane, options)
    by_stage: dict[str, list[StepMeasure]] = defaultdict(list)
    layer_sums: dict[str, _LayerSums] = defaultdict(_LayerSums)
    unmatched: dict[str, Counter] = defaultdict(Counter)
    unmatched_time: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    number = 0
    for group in groups:
        for kernels, source in _group_steps(lane, group, options):
            if group.layer_mode == "annotations":
                layers = _assign_annotated_layers(kernels, group.annotation_layers, lane.launches.kinds)
            else:
                layers = _assign_pattern_layers(kernels)
            _assign_modules(kernels, rules)
            step = _measure_step(kernels, group, source, number, layers, origin)
            number += 1
            by_stage[group.stage].append(step)
            layer_sums[group.stage].add(kernels, layers)
            for k in kernels:
                if k.module == UNMATCHED:
                    unmatched[group.stage][k.name] += 1
                    unmatched_time[group.stage][k.name] += k.dur_us
    notes: list[str] = []
    stages = []
    wanted = options.stage
    if wanted is not None:
        if wanted not in by_stage and "unknown" in by_stage:
            notes.append(f"the trace does not mark steps as prefill or decode: all its steps are taken as {wanted}")
            by_stage = {wanted: by_stage["unknown"]}
            layer_sums[wanted], unmatched[wanted], unmatched_time[wanted] = (
                layer_sums["unknown"], unmatched["unknown"], unmatched_time["unknown"])
        by_stage = {s: v for s, v in by_stage.items() if s == wanted}
    for stage in sorted(by_stage, key=lambda s: STAGES.index(s) if s in STAGES else len(STAGES)):
        if stage == "idle":
            continue
        steps = by_stage[stage]
        stage_notes = []
        if all(s.layer_source == "kernel pattern" and not s.num_layers for s in steps):
            stage_notes.append("no attention kernel matched a rule with role 'attention': layers not found")
        stages.append(_stage_measure(stage, steps, layer_sums[stage], unmatched[stage], unmatched_time[stage],
                                     tuple(stage_notes)))
    if not groups:
        notes.append("no forward step found (no attention kernels and no step annotations)")
    return LaneMeasure(
        path=str(raw.path), rank=rank, stages=tuple(stages), streams=_stream_times(lane), kernels=len(lane),
        kernel_time_s=sum(lane.dur) * US,
        outside_steps_s=sum(lane.dur[p] for p in leftovers) * US, outside_steps_kernels=len(leftovers),
        notes=tuple(notes))


def lane_ids(raw: RawTrace, lane: str | None = None) -> list[int]:
    """GPU lanes that ran kernels, numerically ordered; `lane` picks one by its pid."""
    present = sorted(set(raw.kernel_lane), key=lambda i: (not raw.lanes[i].lstrip("-").isdigit(),
                                                           int(raw.lanes[i]) if raw.lanes[i].lstrip("-").isdigit()
                                                           else 0, raw.lanes[i]))
    if lane is None:
        return present
    return [i for i in present if raw.lanes[i] == lane]
