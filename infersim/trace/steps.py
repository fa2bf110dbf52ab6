"""Group a GPU's kernels into forward steps, and say whether each is prefill or decode.

Steps, in order of preference:
1. DeepSeek-style forward regions (`attn(F)`, `mlp(F)`, ...) grouped by their enclosing
   `ProfilerStep#N` / `step[...]`: layers then come from the regions.
2. Step annotations: SGLang's `step[EXTEND ...]` / `step[DECODE ...]`, and the user's own
   `record_function` regions: any name given with `--step-regions`, else names that say `prefill`
   or `decode` (`prefill`, `decode`, `extend`, ...).
3. One step per CUDA-graph replay (all kernels of a `cudaGraphLaunch` share its correlation).
4. One step per model forward pass, where nn.Module frames were recorded (with_stack=True): the
   outermost model frame (`nn.Module: LlamaForCausalLM_0`) around the launches. A step annotation
   holding several forward passes (one `decode` region around four decode steps) is cut at them.
5. Kernels under one `ProfilerStep#N`.
6. The eager kernels between those, cut into one step per forward pass where the pattern repeats:
   at each embedding lookup followed by attention, or every N layers with `--layers-per-step N`.

Groups without an attention kernel (sampling, batch preparation between decode replays) join the
step before them. A step's stage comes from its annotation (SGLang mode, region name), the file
name (`-EXTEND` / `-DECODE`), the recorded shapes (the attention's query length, else the
sequence dimension of the GEMM inputs: 1 token per sequence is decode) or the attention kernel's
name; otherwise it is `unknown`.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from infersim.cards import categories as cat
from infersim.trace.attribution import Kernel, Lane
from infersim.trace.context import region_stage
from infersim.trace.layers import pattern_layers
from infersim.trace.operators import ATTENTION_OP, GEMM_OP, attention_dims, gemm_dims, op_class, parse_shapes
from infersim.trace.records import AnalysisOptions

_SGLANG_STEP = re.compile(r"^step\[(?P<mode>[A-Za-z_]+)")
_MODE_STAGE = {"EXTEND": "prefill", "PREFILL": "prefill", "MIXED": "prefill", "DRAFT_EXTEND": "prefill",
               "DECODE": "decode", "TARGET_VERIFY": "decode", "DRAFT_DECODE": "decode", "IDLE": "idle"}
_DECODE_ATTENTION = re.compile(r"(?i)decode|splitkv|_stage1|kernel_mha$|paged_attention")
_PREFILL_ATTENTION = re.compile(r"(?i)prefill|extend|^_fwd_kernel$|fmha_v2|varlen")


@dataclass
class StepGroup:
    label: str
    stage: str
    source: str
    positions: array  # lane positions (typed "i"), in start order
    layer_mode: str  # "annotations" / "frames" / "pattern"
    eager_unmarked: bool = False
    annotation_layers: dict[int, int] = field(default_factory=dict)  # region -> layer number
    ffn_regions: frozenset[int] = frozenset()
    stage_source: str = ""
    annotation: int = -1  # the step annotation (a user region, SGLang's step[...]) the group is, -1: none


def _stage_of_annotation(name: str) -> str:
    match = _SGLANG_STEP.match(name)
    if not match:
        return region_stage(name) or "unknown"
    return _MODE_STAGE.get(match.group("mode").upper(), "unknown")


def _stage_from_attention(lane: Lane, positions: Sequence[int]) -> str:
    names = [lane.name(p) for p in positions if lane.role(p) == "attention"]
    if any(_DECODE_ATTENTION.search(n) for n in names):
        return "decode"
    if any(_PREFILL_ATTENTION.search(n) for n in names):
        return "prefill"
    return "unknown"


def stage_from_shapes(lane: Lane, positions: Sequence[int]) -> tuple[str, str] | None:
    """(stage, how) from the recorded shapes of the operators that launched the step's kernels:
    the attention's query length, else the sequence dimension of the GEMM inputs."""
    raw = lane.raw
    seen: set[int] = set()
    gemm_seq: int | None = None
    for p in positions:
        row = lane.op[p]
        if row < 0 or row in seen:
            continue
        seen.add(row)
        shape_id = raw.op_shapes[row]
        if shape_id < 0:
            continue
        name = raw.names[raw.op_name[row]]
        shapes = parse_shapes(raw.shape_texts[shape_id])
        if shapes is None:
            continue
        cls = op_class(name)
        if cls == ATTENTION_OP:
            dims = attention_dims(name, shapes)
            if dims is not None:
                stage = "decode" if dims.q_len == 1 else "prefill"
                return stage, f"attention query length {dims.q_len} (recorded shapes)"
        elif cls == GEMM_OP and gemm_seq is None:
            dims = gemm_dims(name, shapes)
            if dims is not None and dims.seq is not None:
                gemm_seq = dims.seq
    if gemm_seq is not None:
        return ("decode" if gemm_seq == 1 else "prefill"), f"{gemm_seq} tokens per sequence in the GEMM inputs"
    return None


def _has_attention(lane: Lane, positions: Sequence[int]) -> bool:
    return any(lane.role(p) == "attention" for p in positions)


def _split_by_forward(lane: Lane, group: StepGroup) -> list[StepGroup]:
    """A group holding several model forward passes (frames), one step each."""
    frames = {lane.model_frame[p] for p in group.positions} - {-1}
    if len(frames) < 2:
        return [group]
    pieces: list[StepGroup] = []
    current = -2
    for p in group.positions:
        frame = lane.model_frame[p]
        if frame >= 0 and frame != current:
            current = frame
            pieces.append(StepGroup(group.label, group.stage, f"{group.source}, one step per model forward",
                                    array("i"), group.layer_mode, stage_source=group.stage_source))
        if not pieces:
            pieces.append(StepGroup(group.label, group.stage, group.source, array("i"), group.layer_mode,
                                    stage_source=group.stage_source))
        pieces[-1].positions.append(p)
    return pieces


def _forward_region_steps(lane: Lane, options: AnalysisOptions, regions: list[int]) -> tuple[list[StepGroup], array]:
    """Steps from forward regions (attn(F), mlp(F), ...): layers come from the annotations."""
    annotations = lane.raw.annotations
    kinds = lane.launches.kinds
    n = len(lane)
    leftovers = array("i")
    # the step annotation holding each region: the innermost one open at its kernels' launches (read
    # from the launch context, not searched per region: a long trace has thousands of each)
    region_step: dict[int, int] = {}
    for p in range(n):
        region = lane.region[p]
        if region >= 0 and region not in region_step:
            region_step[region] = lane.step_ann[p]
    groups: dict[int, StepGroup] = {}
    layer_counter: dict[int, int] = defaultdict(lambda: -1)
    for r in regions:  # in (thread, start) order: a new layer at each attention region
        key = region_step[r]
        if key not in groups:
            label = annotations[key].name if key >= 0 else "forward regions"
            stage = _stage_of_annotation(label) if key >= 0 else "unknown"
            groups[key] = StepGroup(label, stage, "forward annotations", array("i"), "annotations",
                                    stage_source="annotation" if stage != "unknown" else "", annotation=key)
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
        key = lane.step_ann[p]
        if key not in step_threads or lane.thread[p] not in step_threads[key]:
            key = -1 if lane.thread[p] in step_threads.get(-1, ()) else None
        if key is not None and not lane.backward[p]:
            groups[key].positions.append(p)
        else:
            leftovers.append(p)
    steps = [g for g in groups.values() if g.positions]
    for g in steps:
        g.ffn_regions = frozenset(r for r in g.annotation_layers if kinds[r] == "fwd_ffn")
        if g.stage == "unknown" and options.file_stage:
            g.stage, g.stage_source = options.file_stage, "file name"
    return steps, leftovers


def _forward_starts(lane: Lane, positions: Sequence[int]) -> list[int]:
    """Indices into `positions` where a forward pass starts: an embedding lookup with attention
    after it and before the next lookup (the repeating pattern of eager kernels)."""
    starts: list[int] = []
    seen_attention = True
    for i, p in enumerate(positions):
        module = lane.module1(p)
        if module == cat.EMBEDDING and seen_attention:
            starts.append(i)
            seen_attention = False
        elif lane.role(p) == "attention":
            seen_attention = True
    return starts if len(starts) >= 2 else []


def form_steps(lane: Lane, options: AnalysisOptions) -> tuple[list[StepGroup], array]:
    """Group the lane's kernels into steps; return the steps and the positions left over."""
    annotations = lane.raw.annotations
    n = len(lane)

    regions = sorted({lane.region[p] for p in range(n) if lane.region[p] >= 0},
                     key=lambda r: (annotations[r].thread, annotations[r].start_us))
    if regions:
        return _forward_region_steps(lane, options, regions)

    steps, eager = _marked_steps(lane)
    # eager kernels outside any marker: split into runs at the other steps
    if eager:
        steps += _eager_steps(lane, options, steps, eager)
    steps.sort(key=lambda g: g.positions[0])
    merged, leftovers = _merge_tails(lane, steps)
    for g in merged:
        g.positions = array("i", sorted(g.positions))  # positions are in start order
        if any(lane.layer_frame[p] >= 0 for p in g.positions):
            g.layer_mode = "frames"
        if g.stage == "unknown":
            _set_stage(lane, g, options)
    return merged, leftovers


def _marked_steps(lane: Lane) -> tuple[list[StepGroup], array]:
    """Kernels grouped by what marks their step (step annotation or user region, CUDA-graph replay,
    model forward frame, profiler step), and the positions of the unmarked (eager) kernels."""
    annotations = lane.raw.annotations
    kinds = lane.launches.kinds
    by_annotation: dict[int, StepGroup] = {}
    graph_groups: dict[tuple[int, int], StepGroup] = {}
    forward_groups: dict[int, StepGroup] = {}
    profiler_groups: dict[int, StepGroup] = {}
    eager = array("i")
    for p in range(len(lane)):
        ann = lane.step_ann[p]
        if ann >= 0 and kinds[ann] in ("step", "region"):
            group = by_annotation.get(ann)
            if group is None:
                name = annotations[ann].name
                source = "step annotation" if kinds[ann] == "step" else "user region"
                stage = _stage_of_annotation(name)
                group = by_annotation[ann] = StepGroup(name, stage, source, array("i"), "pattern",
                                                       stage_source="annotation" if stage != "unknown" else "",
                                                       annotation=ann)
            group.positions.append(p)
        elif lane.graph[p]:
            key = (lane.thread[p], lane.correlation(p))
            group = graph_groups.get(key)
            if group is None:
                group = graph_groups[key] = StepGroup(
                    f"CUDA-graph replay (correlation {key[1]})", "decode", "CUDA-graph replay", array("i"), "pattern",
                    stage_source="a CUDA-graph replay")
            group.positions.append(p)
        elif lane.model_frame[p] >= 0 and not lane.backward[p]:
            frame = lane.model_frame[p]
            group = forward_groups.get(frame)
            if group is None:
                raw = lane.raw
                label = raw.names[raw.frame_name[frame]]
                group = forward_groups[frame] = StepGroup(label, "unknown", "model forward frame", array("i"),
                                                          "pattern")
            group.positions.append(p)
        elif ann >= 0 and kinds[ann] == "profiler_step":
            group = profiler_groups.get(ann)
            if group is None:
                group = profiler_groups[ann] = StepGroup(annotations[ann].name, "unknown", "profiler step",
                                                         array("i"), "pattern")
            group.positions.append(p)
        else:
            eager.append(p)
    steps = [piece for g in by_annotation.values() for piece in _split_by_forward(lane, g)]
    steps += [*graph_groups.values(), *forward_groups.values()]
    steps += [piece for g in profiler_groups.values() for piece in _split_by_forward(lane, g)]
    return steps, eager


def _eager_steps(lane: Lane, options: AnalysisOptions, steps: list[StepGroup], eager: array) -> list[StepGroup]:
    """Unmarked kernels as steps: runs between the marked steps, each cut at its embedding lookups
    (unless the user gave layers per step)."""
    out: list[StepGroup] = []
    boundaries = sorted(lane.start[g.positions[0]] for g in steps)
    runs: dict[int, array] = defaultdict(lambda: array("i"))
    for p in eager:
        runs[bisect_right(boundaries, lane.start[p])].append(p)
    for run in runs.values():
        source = "eager kernels between steps" if boundaries else "whole trace"
        cuts = [] if options.layers_per_step else _forward_starts(lane, run)
        if cuts:
            edges = [0 if i == 0 else c for i, c in enumerate(cuts)] + [len(run)]
            for lo, hi in zip(edges, edges[1:]):
                out.append(StepGroup("eager kernels", "unknown", f"{source}, cut at each embedding lookup",
                                     array("i", run[lo:hi]), "pattern"))
        else:
            out.append(StepGroup("eager kernels", "unknown", source, run, "pattern", eager_unmarked=True))
    return out


def _merge_tails(lane: Lane, steps: list[StepGroup]) -> tuple[list[StepGroup], array]:
    """Groups without attention are the tail of the step before (sampling, next-batch preparation);
    before any step with attention they join the first. Positions left when no group has attention."""
    leftovers = array("i")
    merged: list[StepGroup] = []
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
    return merged, leftovers


def _set_stage(lane: Lane, group: StepGroup, options: AnalysisOptions) -> None:
    if options.file_stage:
        group.stage, group.stage_source = options.file_stage, "file name"
        return
    from_shapes = stage_from_shapes(lane, group.positions)
    if from_shapes is not None:
        group.stage, group.stage_source = from_shapes
        return
    stage = _stage_from_attention(lane, group.positions)
    if stage != "unknown":
        group.stage, group.stage_source = stage, "attention kernel name"


def frame_layers(kernels: Sequence[Kernel]) -> dict[int, int]:
    """Decoder-layer frame -> layer number, in the order the frames first run."""
    out: dict[int, int] = {}
    for k in kernels:
        if k.layer_frame >= 0 and k.layer_frame not in out:
            out[k.layer_frame] = len(out)
    return out


def split_by_layers(kernels: list[Kernel], layers_per_step: int) -> list[list[Kernel]]:
    """Cut unmarked eager kernels holding several forward passes into steps of N layers.

    Between the last layer of one pass and the first of the next lie the LM head, sampling and the
    next embedding; the cut goes into the longest GPU idle gap there (the scheduler's time between
    two forward passes)."""
    ranges = pattern_layers(kernels)
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
