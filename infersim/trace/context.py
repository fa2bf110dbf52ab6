"""The CPU context of every launch: which annotations, operators and module frames enclose it.

A kernel's launch call (`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaGraphLaunch`, ...) happens on
one CPU thread at one instant; everything that was open on that thread at that instant is its
context. Per thread, one sweep over the intervals (user annotations, CPU operators, nn.Module
frames) in start order and the launches in time order finds it:

- intervals that ended are taken off the stack *before* a new one is pushed or a launch is looked
  up, so the stack only ever holds what is open (its depth is the nesting depth, not the trace's
  length);
- each stack entry carries the context it implies, derived once from its parent's when it is
  pushed, so a launch reads its whole context from the top entry in constant time.

The context of a launch:
- step: the innermost step annotation (SGLang `step[...]`, a user step region, `ProfilerStep#N`);
- region: the innermost forward region (`attn(F)`, `mlp(F)`, ...) unless a backward region is
  closer; `backward` when the launch belongs to a backward pass;
- op: the outermost CPU operator with a class (`aten::linear` rather than the `aten::mm` inside);
- frames: the chain of nn.Module frames (interned), the innermost decoder-layer frame and the
  outermost model frame (a forward pass).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence

from infersim.trace.load import RawTrace
from infersim.trace.operators import FRAME_LAYER, FRAME_MODEL, frame_kind, op_class

_SGLANG_STEP = re.compile(r"^step\[(?P<mode>[A-Za-z_]+)")
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_FORWARD_REGION = re.compile(r"\(F\)\s*$")
_BACKWARD_REGION = re.compile(r"\((B|W)\)\s*$|(?i:backward)")
_ATTENTION_REGION = re.compile(r"(?i)^\s*(attn|attention|self_attn|mla)")
_FFN_REGION = re.compile(r"(?i)^\s*(mlp|moe|ffn|expert|shared|dispatch|combine)")
# user record_function regions that say which stage they hold (taken as steps without --step-regions)
_PREFILL_WORDS = re.compile(r"(?i)(^|[^a-z])(prefill|extend|prompt|context_phase)([^a-z]|$)")
_DECODE_WORDS = re.compile(r"(?i)(^|[^a-z])(decode|decoding|generation_phase|generate_step)([^a-z]|$)")

STEP_KINDS = ("step", "profiler_step", "region")
FORWARD_KINDS = ("fwd_attn", "fwd_ffn", "fwd_other")


def region_stage(name: str) -> str | None:
    """prefill / decode when a user region's name says so."""
    if _PREFILL_WORDS.search(name):
        return "prefill"
    if _DECODE_WORDS.search(name):
        return "decode"
    return None


def annotation_kind(name: str, step_regions: Sequence[str] = ()) -> str:
    """step (SGLang), profiler_step, region (a user step region), fwd_attn / fwd_ffn / fwd_other
    (forward regions of a layer), backward, or other."""
    if step_regions and name in step_regions:
        return "region"
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
    if not step_regions and region_stage(name) is not None:
        return "region"
    return "other"


def is_sorted(values: array) -> bool:
    return all(values[i] <= values[i + 1] for i in range(len(values) - 1))


# interval sources in the sweep
_ANNOTATION, _OP, _FRAME = 0, 1, 2


class LaunchContexts:
    """Correlation id -> launch row, and each launch's CPU context (typed columns, one per launch)."""

    def __init__(self, raw: RawTrace, step_regions: Sequence[str] = ()) -> None:
        self.raw = raw
        corr = raw.launch_correlation
        # Kineto numbers launches in call order, so the ids are usually sorted already
        if is_sorted(corr):
            self.order: array | None = None
            self.sorted_corr = corr
        else:
            self.order = array("l", sorted(range(len(corr)), key=corr.__getitem__))
            self.sorted_corr = array("q", (corr[i] for i in self.order))
        self.kinds = [annotation_kind(a.name, step_regions) for a in raw.annotations]
        self.op_classes = [op_class(raw.names[name]) for name in raw.op_name]
        # nn.Module frame chains, interned: context id -> tuple of frame name ids (outermost first)
        self.frame_chains: list[tuple[int, ...]] = [()]
        self._chain_ids: dict[tuple[int, ...], int] = {(): 0}
        n = len(corr)
        self.step = array("i", [-1]) * n
        self.region = array("i", [-1]) * n
        self.backward = array("b", [0]) * n
        self.op = array("i", [-1]) * n
        self.frames = array("i", [0]) * n
        self.layer_frame = array("i", [-1]) * n
        self.model_frame = array("i", [-1]) * n
        self._sweep()

    def candidates(self, correlation: int) -> list[int]:
        lo = bisect_left(self.sorted_corr, correlation)
        hi = bisect_right(self.sorted_corr, correlation, lo)
        if self.order is None:
            return list(range(lo, hi))
        return [self.order[i] for i in range(lo, hi)]

    def first_and_count(self, correlation: int) -> tuple[int, int]:
        """(a launch row of this correlation id or -1, how many launches share it), without listing them."""
        lo = bisect_left(self.sorted_corr, correlation)
        hi = bisect_right(self.sorted_corr, correlation, lo)
        if hi == lo:
            return -1, 0
        return (lo if self.order is None else self.order[lo]), hi - lo

    def is_graph(self, launch: int) -> bool:
        return "GraphLaunch" in self.raw.names[self.raw.launch_name[launch]]

    def _chain_id(self, chain: tuple[int, ...]) -> int:
        found = self._chain_ids.get(chain)
        if found is None:
            found = self._chain_ids[chain] = len(self.frame_chains)
            self.frame_chains.append(chain)
        return found

    def _intervals_by_thread(self) -> dict[int, list[tuple[float, float, int, int]]]:
        """Per thread: (start, end, source, row) of every interval that can shape a context."""
        raw = self.raw
        out: dict[int, list[tuple[float, float, int, int]]] = defaultdict(list)
        for i, ann in enumerate(raw.annotations):
            if self.kinds[i] != "other":  # wrappers like `1F1B` say nothing about steps or modules
                out[ann.thread].append((ann.start_us, ann.end_us, _ANNOTATION, i))
        for i in range(len(raw.op_name)):
            out[raw.op_thread[i]].append((raw.op_start_us[i], raw.op_end_us[i], _OP, i))
        for i in range(len(raw.frame_name)):
            out[raw.frame_thread[i]].append((raw.frame_start_us[i], raw.frame_end_us[i], _FRAME, i))
        return out

    def _sweep(self) -> None:
        raw = self.raw
        intervals = self._intervals_by_thread()
        if not intervals:
            return
        launches_of: dict[int, array] = defaultdict(lambda: array("l"))
        for launch in range(len(raw.launch_thread)):
            if raw.launch_thread[launch] in intervals:
                launches_of[raw.launch_thread[launch]].append(launch)
        frame_kinds = {name: frame_kind(raw.names[name]) for name in set(raw.frame_name)}
        for thread, launches in launches_of.items():
            starts = raw.launch_start_us
            if not all(starts[launches[i]] <= starts[launches[i + 1]] for i in range(len(launches) - 1)):
                launches = array("l", sorted(launches, key=starts.__getitem__))
            spans = intervals[thread]
            spans.sort(key=lambda s: (s[0], -s[1]))  # an enclosing interval before one that starts with it
            self._sweep_thread(launches, spans, frame_kinds)

    def _sweep_thread(self, launches: array, spans: list[tuple[float, float, int, int]],
                      frame_kinds: dict[int, str]) -> None:
        raw = self.raw
        kinds, op_classes = self.kinds, self.op_classes
        # stack entries: [end, step, region, backward, op, chain id, layer frame, model frame]
        root = [float("inf"), -1, -1, 0, -1, 0, -1, -1]
        stack = [root]
        chains = self.frame_chains
        next_span, total = 0, len(spans)
        for launch in launches:
            ts = raw.launch_start_us[launch]
            while next_span < total and spans[next_span][0] <= ts:
                start, end, source, row = spans[next_span]
                next_span += 1
                if end < ts:
                    continue  # opened and closed before this launch: nothing of it can enclose a later one
                while stack[-1][0] < start:  # close what ended before this interval opens
                    stack.pop()
                parent = stack[-1]
                entry = parent[:]
                entry[0] = end
                if source == _ANNOTATION:
                    kind = kinds[row]
                    if kind in STEP_KINDS:
                        entry[1] = row
                    elif kind in FORWARD_KINDS:
                        entry[2], entry[3] = row, 0
                    elif kind == "backward":
                        entry[2], entry[3] = -1, 1
                elif source == _OP:
                    if parent[4] < 0 and op_classes[row] is not None:
                        entry[4] = row
                else:
                    name = raw.frame_name[row]
                    entry[5] = self._chain_id(chains[parent[5]] + (name,))
                    kind = frame_kinds[name]
                    if kind == FRAME_LAYER:
                        entry[6] = row
                    elif kind == FRAME_MODEL and parent[7] < 0:
                        entry[7] = row
                stack.append(entry)
            while stack[-1][0] < ts:
                stack.pop()
            top = stack[-1]
            self.step[launch] = top[1]
            self.region[launch] = top[2]
            self.backward[launch] = top[3]
            self.op[launch] = top[4]
            self.frames[launch] = top[5]
            self.layer_frame[launch] = top[6]
            self.model_frame[launch] = top[7]
