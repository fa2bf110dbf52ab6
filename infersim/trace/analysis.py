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

import re
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from infersim.modules import categories as cat
from infersim.trace.load import KIND_KERNEL, RawTrace
from infersim.trace.rules import GEMM, OTHER, UNMATCHED, RuleTable

US = 1e-6  # trace timestamps are microseconds

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
    layers: tuple[LayerTime, ...]


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
    layers: tuple[LayerTime, ...]  # per layer index, mean over the steps with that many layers
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
    index: int  # in the RawTrace columns
    name: str
    start_us: float
    dur_us: float
    stream: int
    is_kernel: bool
    hidden_us: float
    launch_thread: int  # -1: no launch found
    graph: bool  # replayed from a CUDA graph
    step_annotation: int  # -1: none
    region: int  # forward region annotation, -1: none
    backward: bool
    module1: str = ""  # module before position is known
    role: str | None = None
    position: str = "outside_layers"
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
    kernels: list[_Kernel]
    layer_mode: str  # "annotations" / "pattern"
    graph: bool = False
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


class _LaunchIndex:
    """Correlation id -> launch row, with CPU-side annotation context per launch."""

    def __init__(self, raw: RawTrace) -> None:
        self.raw = raw
        corr = raw.launch_correlation
        self.order = sorted(range(len(corr)), key=corr.__getitem__)
        self.sorted_corr = array("q", (corr[i] for i in self.order))
        self.kinds = [_annotation_kind(a.name) for a in raw.annotations]
        self._context: dict[int, tuple[int, int, bool]] = {}

    def candidates(self, correlation: int) -> list[int]:
        lo = bisect_left(self.sorted_corr, correlation)
        hi = bisect_right(self.sorted_corr, correlation, lo)
        return self.order[lo:hi]

    def is_graph(self, launch: int) -> bool:
        return "GraphLaunch" in self.raw.names[self.raw.launch_name[launch]]

    def compute_context(self, launches: set[int]) -> None:
        """Innermost step annotation, forward region and backward flag of each launch."""
        raw = self.raw
        by_thread_ann: dict[int, list[int]] = defaultdict(list)
        for i, ann in enumerate(raw.annotations):
            if self.kinds[i] != "other":  # wrappers like `1F1B` say nothing about steps or modules
                by_thread_ann[ann.thread].append(i)
        by_thread_launch: dict[int, list[int]] = defaultdict(list)
        for launch in launches:
            by_thread_launch[raw.launch_thread[launch]].append(launch)
        for thread, thread_launches in by_thread_launch.items():
            anns = sorted(by_thread_ann.get(thread, ()),
                          key=lambda i: (raw.annotations[i].start_us, -raw.annotations[i].end_us))
            thread_launches.sort(key=raw.launch_start_us.__getitem__)
            stack: list[int] = []
            next_ann = 0
            for launch in thread_launches:
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
                self._context[launch] = (step, region, backward)

    def context(self, launch: int) -> tuple[int, int, bool]:
        return self._context.get(launch, (-1, -1, False))


def _resolve_launches(raw: RawTrace, index: _LaunchIndex, kernel_rows: Sequence[int]) -> dict[int, int]:
    """Kernel row -> launch row. Where correlation ids repeat (a merged multi-process file), the
    launch from the process that launches this lane's other kernels wins, else the latest launch
    before the kernel started."""
    out: dict[int, int] = {}
    ambiguous: list[tuple[int, list[int]]] = []
    pid_votes: Counter[str] = Counter()
    for row in kernel_rows:
        corr = raw.kernel_correlation[row]
        if corr < 0:
            continue
        found = index.candidates(corr)
        if len(found) == 1:
            out[row] = found[0]
            pid_votes[raw.threads[raw.launch_thread[found[0]]][0]] += 1
        elif found:
            ambiguous.append((row, found))
    lane_pid = pid_votes.most_common(1)[0][0] if pid_votes else None
    for row, found in ambiguous:
        same_pid = [f for f in found if raw.threads[raw.launch_thread[f]][0] == lane_pid]
        pool = same_pid or found
        start = raw.kernel_start_us[row]
        before = [f for f in pool if raw.launch_start_us[f] <= start]
        out[row] = max(before or pool, key=raw.launch_start_us.__getitem__)
    return out


# ---------------------------------------------------------------------------------------------
# Overlap of communication with compute on other streams


def _union(intervals: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    intervals.sort()
    starts: list[float] = []
    ends: list[float] = []
    for start, end in intervals:
        if starts and start <= ends[-1]:
            if end > ends[-1]:
                ends[-1] = end
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


def _overlap(starts: list[float], ends: list[float], start: float, end: float) -> float:
    i = max(bisect_right(starts, start) - 1, 0)
    total = 0.0
    while i < len(starts) and starts[i] < end:
        lo, hi = max(starts[i], start), min(ends[i], end)
        if hi > lo:
            total += hi - lo
        i += 1
    return total


def _busy(kernels: Sequence[_Kernel]) -> float:
    starts, ends = _union([(k.start_us, k.end_us) for k in kernels])
    return sum(e - s for s, e in zip(starts, ends))


def _set_hidden_time(kernels: list[_Kernel]) -> None:
    """Hidden time of each communication kernel: overlap with compute kernels on other streams."""
    comm_streams = {k.stream for k in kernels if k.module1 in cat.COMMUNICATION}
    for stream in comm_streams:
        starts, ends = _union([(k.start_us, k.end_us) for k in kernels
                               if k.is_kernel and k.stream != stream and k.module1 not in cat.COMMUNICATION
                               and k.dur_us > 0])
        for k in kernels:
            if k.stream == stream and k.module1 in cat.COMMUNICATION:
                k.hidden_us = _overlap(starts, ends, k.start_us, k.end_us)


# ---------------------------------------------------------------------------------------------
# Steps


def _stage_of_annotation(name: str) -> str:
    match = _SGLANG_STEP.match(name)
    if not match:
        return "unknown"
    return _MODE_STAGE.get(match.group("mode").upper(), "unknown")


def _stage_from_attention(kernels: Sequence[_Kernel]) -> str:
    names = [k.name for k in kernels if k.role == "attention"]
    if any(_DECODE_ATTENTION.search(n) for n in names):
        return "decode"
    if any(_PREFILL_ATTENTION.search(n) for n in names):
        return "prefill"
    return "unknown"


def _has_attention(kernels: Sequence[_Kernel]) -> bool:
    return any(k.role == "attention" for k in kernels)


def _form_steps(raw: RawTrace, lane: list[_Kernel], index: _LaunchIndex,
                options: AnalysisOptions) -> tuple[list[_StepGroup], list[_Kernel]]:
    """Group the lane's kernels (in start order) into steps; return the steps and the leftovers."""
    annotations = raw.annotations
    kinds = index.kinds
    leftovers: list[_Kernel] = []

    # A. forward regions (attn(F), mlp(F), ...): layers come from the annotations
    if any(k.region >= 0 for k in lane):
        regions = sorted({k.region for k in lane if k.region >= 0},
                         key=lambda r: (annotations[r].thread, annotations[r].start_us))
        region_step: dict[int, int] = {}
        for r in regions:
            a = annotations[r]
            enclosing = [i for i, s in enumerate(annotations)
                         if kinds[i] in ("step", "profiler_step") and s.thread == a.thread
                         and s.start_us <= a.start_us <= s.end_us]
            key = min(enclosing, key=lambda i: annotations[i].end_us - annotations[i].start_us) if enclosing else -1
            region_step[r] = key
        groups: dict[int, _StepGroup] = {}
        layer_counter: dict[int, int] = defaultdict(lambda: -1)
        for r in regions:  # in (thread, start) order: a new layer at each attention region
            key = region_step[r]
            if key not in groups:
                label = annotations[key].name if key >= 0 else "forward regions"
                stage = _stage_of_annotation(label) if key >= 0 else "unknown"
                groups[key] = _StepGroup(label, stage, "forward annotations", [], "annotations")
            group = groups[key]
            if kinds[r] == "fwd_attn" or layer_counter[key] < 0:
                layer_counter[key] += 1
            group.annotation_layers[r] = layer_counter[key]
        step_threads = {key: {annotations[r].thread for r in group.annotation_layers}
                        for key, group in groups.items()}
        for k in lane:
            if k.region >= 0:
                groups[region_step[k.region]].kernels.append(k)
                continue
            # bare kernels (no region, not backward) launched on the thread of a step's forward
            # regions within that step: embedding before the first layer, LM head after the last
            key = next((key for key, threads in step_threads.items()
                        if k.launch_thread in threads and (key < 0 or k.step_annotation == key)), None)
            if key is not None and not k.backward:
                groups[key].kernels.append(k)
            else:
                leftovers.append(k)
        steps = [g for g in groups.values() if g.kernels]
        for g in steps:
            g.kernels.sort(key=lambda k: k.start_us)
            if g.stage == "unknown" and options.file_stage:
                g.stage = options.file_stage
        return steps, leftovers

    # B. no forward regions: SGLang step spans, CUDA-graph replays, profiler steps, eager runs
    by_annotation: dict[int, _StepGroup] = {}
    graph_groups: dict[tuple[int, int], _StepGroup] = {}
    profiler_groups: dict[int, _StepGroup] = {}
    eager: list[_Kernel] = []
    for k in lane:
        ann = k.step_annotation
        if ann >= 0 and kinds[ann] == "step":
            group = by_annotation.get(ann)
            if group is None:
                name = annotations[ann].name
                group = by_annotation[ann] = _StepGroup(name, _stage_of_annotation(name), "step annotation",
                                                        [], "pattern")
            group.kernels.append(k)
        elif k.graph:
            key = (k.launch_thread, raw.kernel_correlation[k.index])
            group = graph_groups.get(key)
            if group is None:
                group = graph_groups[key] = _StepGroup(
                    f"CUDA-graph replay (correlation {key[1]})", "decode", "CUDA-graph replay", [], "pattern",
                    graph=True)
            group.kernels.append(k)
        elif ann >= 0 and kinds[ann] == "profiler_step":
            group = profiler_groups.get(ann)
            if group is None:
                group = profiler_groups[ann] = _StepGroup(annotations[ann].name, "unknown", "profiler step",
                                                          [], "pattern")
            group.kernels.append(k)
        else:
            eager.append(k)
    steps = [*by_annotation.values(), *graph_groups.values(), *profiler_groups.values()]
    # eager kernels outside any marker: split into runs at the other steps
    if eager:
        boundaries = sorted(g.kernels[0].start_us for g in steps)
        runs: dict[int, list[_Kernel]] = defaultdict(list)
        for k in eager:
            runs[bisect_right(boundaries, k.start_us)].append(k)
        for run in runs.values():
            steps.append(_StepGroup("eager kernels", "unknown", "eager kernels between steps" if boundaries
                                    else "whole trace", run, "pattern", eager_unmarked=True))
    steps.sort(key=lambda g: g.kernels[0].start_us)
    # groups without attention are the tail of the step before (sampling, next-batch preparation)
    merged: list[_StepGroup] = []
    pending: list[_Kernel] = []
    for group in steps:
        if _has_attention(group.kernels) or group.layer_mode == "annotations":
            if pending:
                group.kernels = sorted(pending + group.kernels, key=lambda k: k.start_us)
                pending = []
            merged.append(group)
        elif merged:
            merged[-1].kernels.extend(group.kernels)
        else:
            pending.extend(group.kernels)
    if pending:
        if merged:
            merged[-1].kernels = sorted(merged[-1].kernels + pending, key=lambda k: k.start_us)
        else:
            leftovers.extend(pending)  # no attention anywhere: no step to compare
    for g in merged:
        g.kernels.sort(key=lambda k: k.start_us)
        if g.stage == "unknown":
            g.stage = options.file_stage or _stage_from_attention(g.kernels)
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
            k.position = "outside_layers"
        return 0
    first, last_end = layers[0][0], layers[-1][2]
    for k in kernels[:first]:
        k.position = "before_layers"
    for k in kernels[last_end:]:
        k.position = "after_layers"
    for number, (start, ffn, end) in enumerate(layers):
        for j in range(start, end):
            k = kernels[j]
            k.position, k.layer, k.ffn_phase = "in_layers", number, j >= ffn
    return len(layers)


def _assign_annotated_layers(group: _StepGroup, kinds: Sequence[str]) -> int:
    kernels = group.kernels
    in_layers = [i for i, k in enumerate(kernels) if k.region >= 0]
    if not in_layers:
        return 0
    first, last = in_layers[0], in_layers[-1]
    by_layer: dict[int, list[_Kernel]] = defaultdict(list)
    for i, k in enumerate(kernels):
        if k.region >= 0:
            k.position, k.layer = "in_layers", group.annotation_layers[k.region]
            by_layer[k.layer].append(k)
        else:
            k.position = "before_layers" if i < first else "after_layers" if i > last else "in_layers"
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
    if k.position == "after_layers":
        return cat.LM_HEAD
    if k.position != "in_layers" or k.layer < 0:
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
        rule = rules.match(k.name, k.position)
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


def _layer_times(kernels: Sequence[_Kernel], num_layers: int) -> tuple[LayerTime, ...]:
    per: list[dict[str, float]] = [defaultdict(float) for _ in range(num_layers)]
    for k in kernels:
        if 0 <= k.layer < num_layers:
            per[k.layer][k.module] += k.dur_us
    return tuple(LayerTime(i, sum(m.values()) * US,
                           tuple(sorted(((mod, t * US) for mod, t in m.items()), key=lambda x: -x[1])))
                 for i, m in enumerate(per))


def _measure_step(group: _StepGroup, number: int, num_layers: int, origin_us: float) -> StepMeasure:
    kernels = group.kernels
    start = min(k.start_us for k in kernels)
    end = max(k.end_us for k in kernels)
    return StepMeasure(
        index=number, label=group.label, stage=group.stage, step_source=group.source,
        layer_source="annotations" if group.layer_mode == "annotations" else "kernel pattern",
        start_s=(start - origin_us) * US, span_s=(end - start) * US, busy_s=_busy(kernels) * US,
        kernel_time_s=sum(k.dur_us for k in kernels) * US, num_layers=num_layers,
        modules=_module_times(kernels, num_layers), layers=_layer_times(kernels, num_layers))


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


def _mean_layers(steps: Sequence[StepMeasure], num_layers: int) -> tuple[LayerTime, ...]:
    chosen = [s for s in steps if s.num_layers == num_layers]
    if not chosen or not num_layers:
        return ()
    out = []
    for i in range(num_layers):
        acc: dict[str, float] = defaultdict(float)
        for s in chosen:
            for module, t in s.layers[i].modules:
                acc[module] += t / len(chosen)
        out.append(LayerTime(i, sum(acc.values()),
                             tuple(sorted(acc.items(), key=lambda x: -x[1]))))
    return tuple(out)


def _stage_measure(stage: str, steps: list[StepMeasure], unmatched: Counter, unmatched_time: dict,
                   notes: tuple[str, ...]) -> StageMeasure:
    layer_counts = Counter(s.num_layers for s in steps)
    num_layers = layer_counts.most_common(1)[0][0]
    n = len(steps)
    return StageMeasure(
        stage=stage, steps=tuple(steps), num_layers=num_layers,
        step_time_s=sum(s.span_s for s in steps) / n, busy_s=sum(s.busy_s for s in steps) / n,
        kernel_time_s=sum(s.kernel_time_s for s in steps) / n, modules=_mean_modules(steps),
        layers=_mean_layers(steps, num_layers),
        unmatched=tuple(sorted((UnmatchedKernel(name, unmatched[name], unmatched_time[name] * US)
                                for name in unmatched), key=lambda u: -u.time_s)),
        notes=notes)


def _split_by_layers(group: _StepGroup, layers_per_step: int) -> list[_StepGroup]:
    """Cut an unmarked eager group holding several forward passes into steps of N layers.

    Between the last layer of one pass and the first of the next lie the LM head, sampling and the
    next embedding; the cut goes into the longest GPU idle gap there (the scheduler's time between
    two forward passes)."""
    kernels = group.kernels
    ranges = _pattern_layers(kernels)
    if len(ranges) <= layers_per_step:
        return [group]
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
            pieces.append(_StepGroup(group.label, group.stage, f"{group.source}, cut every {layers_per_step} layers",
                                     kernels[prev:cut], group.layer_mode, eager_unmarked=True))
        prev = cut
    return pieces


def _lane_kernels(raw: RawTrace, lane_id: int, rules: RuleTable) -> tuple[list[_Kernel], _LaunchIndex]:
    rows = [i for i in range(raw.kernel_count) if raw.kernel_lane[i] == lane_id]
    rows.sort(key=raw.kernel_start_us.__getitem__)
    index = _LaunchIndex(raw)
    launch_of = _resolve_launches(raw, index, rows)
    index.compute_context(set(launch_of.values()))
    corr_counts = Counter(raw.kernel_correlation[r] for r in rows if raw.kernel_correlation[r] >= 0)
    no_launches = len(raw.launch_correlation) == 0
    kernels = []
    for row in rows:
        launch = launch_of.get(row, -1)
        step, region, backward = index.context(launch) if launch >= 0 else (-1, -1, False)
        if launch >= 0:
            graph = index.is_graph(launch)
        else:  # CPU activities not recorded: replayed graph kernels still share one correlation
            graph = no_launches and corr_counts.get(raw.kernel_correlation[row], 0) > 1
        name = raw.names[raw.kernel_name[row]]
        rule = rules.match(name)
        k = _Kernel(index=row, name=name, start_us=raw.kernel_start_us[row], dur_us=raw.kernel_dur_us[row],
                    stream=raw.kernel_stream[row], is_kernel=raw.kernel_kind[row] == KIND_KERNEL, hidden_us=0.0,
                    launch_thread=raw.launch_thread[launch] if launch >= 0 else -1, graph=graph,
                    step_annotation=step, region=region, backward=backward,
                    module1=rule.module if rule else UNMATCHED, role=rule.role if rule else None)
        kernels.append(k)
    return kernels, index


def _stream_times(kernels: Sequence[_Kernel]) -> tuple[StreamTime, ...]:
    total: dict[int, float] = defaultdict(float)
    comm: dict[int, float] = defaultdict(float)
    count: Counter[int] = Counter()
    for k in kernels:
        total[k.stream] += k.dur_us
        count[k.stream] += 1
        if k.module1 in cat.COMMUNICATION:
            comm[k.stream] += k.dur_us
    return tuple(StreamTime(s, total[s] * US, count[s], comm[s] * US) for s in sorted(total))


def analyze_lane(raw: RawTrace, lane_id: int, rules: RuleTable, options: AnalysisOptions) -> LaneMeasure:
    kernels, index = _lane_kernels(raw, lane_id, rules)
    lane_label = raw.lanes[lane_id]
    rank = options.rank_label or (f"GPU {lane_label}" if len(raw.lanes) > 1 else "")
    if not kernels:
        return LaneMeasure(str(raw.path), rank, (), (), 0, 0.0, 0.0, 0, ("no GPU kernels in this trace",))
    origin = kernels[0].start_us
    _set_hidden_time(kernels)
    groups, leftovers = _form_steps(raw, kernels, index, options)
    if options.layers_per_step:
        groups = [piece for g in groups for piece in
                  (_split_by_layers(g, options.layers_per_step) if g.eager_unmarked else [g])]
    by_stage: dict[str, list[StepMeasure]] = defaultdict(list)
    unmatched: dict[str, Counter] = defaultdict(Counter)
    unmatched_time: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for number, group in enumerate(groups):
        if group.layer_mode == "annotations":
            layers = _assign_annotated_layers(group, index.kinds)
        else:
            layers = _assign_pattern_layers(group.kernels)
        _assign_modules(group.kernels, rules)
        step = _measure_step(group, number, layers, origin)
        by_stage[group.stage].append(step)
        for k in group.kernels:
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
        by_stage = {s: v for s, v in by_stage.items() if s == wanted}
    for stage in sorted(by_stage, key=lambda s: STAGES.index(s) if s in STAGES else len(STAGES)):
        stage_notes = []
        steps = by_stage[stage]
        if stage == "idle":
            continue
        if any(s.layer_source == "kernel pattern" for s in steps) and not any(s.num_layers for s in steps):
            stage_notes.append("no attention kernel matched a rule with role 'attention': layers not found")
        stages.append(_stage_measure(stage, steps, unmatched[stage], unmatched_time[stage], tuple(stage_notes)))
    if not groups:
        notes.append("no forward step found (no attention kernels and no step annotations)")
    return LaneMeasure(
        path=str(raw.path), rank=rank, stages=tuple(stages), streams=_stream_times(kernels), kernels=len(kernels),
        kernel_time_s=sum(k.dur_us for k in kernels) * US,
        outside_steps_s=sum(k.dur_us for k in leftovers) * US, outside_steps_kernels=len(leftovers),
        notes=tuple(notes))


def lane_ids(raw: RawTrace, lane: str | None = None) -> list[int]:
    """GPU lanes that ran kernels, numerically ordered; `lane` picks one by its pid."""
    present = sorted(set(raw.kernel_lane), key=lambda i: (not raw.lanes[i].lstrip("-").isdigit(),
                                                           int(raw.lanes[i]) if raw.lanes[i].lstrip("-").isdigit()
                                                           else 0, raw.lanes[i]))
    if lane is None:
        return present
    return [i for i in present if raw.lanes[i] == lane]
