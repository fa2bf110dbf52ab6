"""Which simulator module a kernel belongs to, and how that was decided.

Three grounds, tried in this order, so that a kernel whose name no rule knows is still placed:

1. The CPU operator that launched it (`context.LaunchContexts`): `aten::linear`/`aten::mm` is a
   GEMM, `aten::scaled_dot_product_attention` (and the cuDNN / flash / efficient variants,
   `flash_attn::*`) the attention core, `aten::_grouped_mm` the routed experts, `aten::rms_norm`,
   `aten::mean`/`aten::rsqrt` a norm, `aten::topk` routing or sampling, `aten::cat` (the KV cache
   of HF's DynamicCache) and other ATen operators elementwise work. Where the profile ran
   `with_stack=True` the nn.Module frames refine it: a GEMM inside `LlamaAttention` is an attention
   projection, inside `MixtralExperts` a routed expert, inside the MoE block's `shared_expert` the
   shared expert, directly under `...ForCausalLM` the LM head; anything in an `RMSNorm` frame is a
   norm, anything in a router frame routing. Memcpy and memset activities are not classified this
   way (they are copies whatever op issued them).
2. The name rules (`kernel_rules.yaml`, with `--rules` first).
3. The kernel's family, from its name: cuBLAS (`nvjet_`, `*_xmma_gemm_*`, `*gemm*`), CUTLASS,
   cuDNN attention (`*sdpa*`, `fmha`), Triton (Inductor `triton_*`), ATen and CUB kernels.

What stays unclassified is reported by name with its time. Each stage lists how many kernels and
how much time each ground classified.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from infersim.cards import categories as cat
from infersim.trace.context import LaunchContexts
from infersim.trace.load import KIND_KERNEL, RawTrace
from infersim.trace.operators import (ATTENTION_OP, BATCHED_MATMUL_OP, COLLECTIVE_OP, CONCAT_OP, ELEMENTWISE_OP,
                                      EMBEDDING_OP, FRAME_ATTENTION, FRAME_EMBEDDING, FRAME_EXPERTS, FRAME_LAYER,
                                      FRAME_LINEAR, FRAME_MLP, FRAME_MODEL, FRAME_MOE, FRAME_NORM, FRAME_OTHER,
                                      FRAME_ROTARY, FRAME_ROUTER, FRAME_SHARED, GATHER_OP, GEMM_OP, GROUPED_GEMM_OP,
                                      NORM_OP, NORM_PART_OP, SAMPLING_OP, SOFTMAX_OP, TOPK_OP, frame_kind, op_class)
from infersim.trace.records import SOURCE_FAMILY, SOURCE_NONE, SOURCE_OP, SOURCE_RULE
from infersim.trace.rules import GEMM, OTHER, UNMATCHED, KernelRule, RuleTable

# operator class -> (module before the kernel's place is known, role)
_OP_MODULES: dict[str, tuple[str, str | None]] = {
    GEMM_OP: (GEMM, None),
    BATCHED_MATMUL_OP: (GEMM, None),
    ATTENTION_OP: (cat.ATTN_CORE, "attention"),
    GROUPED_GEMM_OP: (cat.MOE_EXPERTS, None),
    NORM_OP: (cat.ELEMENTWISE, "norm"),
    NORM_PART_OP: (cat.ELEMENTWISE, "norm"),
    EMBEDDING_OP: (cat.EMBEDDING, None),
    TOPK_OP: (cat.ROUTER, "topk"),
    SOFTMAX_OP: (cat.ELEMENTWISE, None),
    SAMPLING_OP: (cat.ELEMENTWISE, None),
    CONCAT_OP: (cat.ELEMENTWISE, None),
    COLLECTIVE_OP: (cat.ALL_REDUCE, None),
    GATHER_OP: (cat.DP_GATHER, None),
    ELEMENTWISE_OP: (cat.ELEMENTWISE, None),
}
# operator classes whose kernels after the last layer are the LM head's (final norm, sampling)
_AFTER_LAYERS_LM_HEAD = frozenset({NORM_OP, NORM_PART_OP, TOPK_OP, SOFTMAX_OP, SAMPLING_OP})

# kernel families by name, for kernels no rule knows: (family, module, role, pattern)
_FAMILIES: tuple[tuple[str, str, str | None, re.Pattern[str]], ...] = (
    ("cuDNN / CUTLASS attention", cat.ATTN_CORE, "attention",
     re.compile(r"(?i)sdpa|fmha|flash_?attn|flash_fwd|attention_fwd|fprop_attn")),
    ("cuBLAS GEMM", GEMM, None, re.compile(r"(?i)^nvjet|xmma_gemm|gemm|cublas|sgemm|hgemm|gemv")),
    ("CUTLASS GEMM", GEMM, None, re.compile(r"cutlass|cute::")),
    ("Triton (Inductor) fused kernel", cat.ELEMENTWISE, None, re.compile(r"^triton_")),
    ("cuDNN", cat.ELEMENTWISE, None, re.compile(r"(?i)cudnn")),
    ("ATen / CUB kernel", cat.ELEMENTWISE, None, re.compile(r"at::native|at::|c10::|cub::|CUB_")),
)


@dataclass(frozen=True)
class KernelClass:
    """How one kernel (name, launching operator and module frames) is classified."""

    module: str  # before the kernel's place in the step is known: a category, gemm, other or unmatched
    role: str | None  # attention, norm or topk (see rules.py)
    source: str  # records.SOURCE_*
    reason: str  # the operator, rule or family that decided
    op_class: str | None = None  # the launching operator's class, when it decided
    frame_module: str | None = None  # the module the nn.Module frames name (overrides position rules)
    final_norm: bool = False  # a norm outside the decoder layers (the LM head's final norm after them)
    rule: KernelRule | None = None

    @property
    def module1(self) -> str:
        """The most specific module known before places are: the frames', else the classification's."""
        return self.frame_module or self.module


def family_of(name: str) -> tuple[str, str, str | None] | None:
    for family, module, role, pattern in _FAMILIES:
        if pattern.search(name):
            return family, module, role
    return None


def _frame_kinds(raw: RawTrace, chain: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(frame_kind(raw.names[name]) for name in chain)


def _frame_refinement(kinds: tuple[str, ...], module: str, op_cls: str | None
                      ) -> tuple[str | None, str | None, bool]:
    """(module, role, final norm) that nn.Module frames say for a kernel classified as `module`."""
    if not kinds:
        return None, None, False
    in_layer = FRAME_LAYER in kinds
    semantic = [k for k in kinds if k not in (FRAME_LINEAR, FRAME_OTHER, FRAME_LAYER, FRAME_MODEL)]
    inner = semantic[-1] if semantic else None
    if FRAME_ROUTER in kinds:
        return cat.ROUTER, ("topk" if op_cls == TOPK_OP else None), False
    if inner == FRAME_ROTARY:
        return cat.ELEMENTWISE, None, False  # cos/sin tables (a small matmul among them): rotary work
    if inner == FRAME_NORM or (inner is None and op_cls in (NORM_OP, NORM_PART_OP)):
        return None, "norm", not in_layer
    if inner == FRAME_EMBEDDING and not in_layer:
        return cat.EMBEDDING, None, False
    if module == GEMM:
        if op_cls == BATCHED_MATMUL_OP and FRAME_ATTENTION in kinds and FRAME_LINEAR not in kinds:
            return cat.ATTN_CORE, "attention", False  # eager attention: QK^T and PV as batched matmuls
        if inner == FRAME_EXPERTS:
            return cat.MOE_EXPERTS, None, False
        if inner == FRAME_SHARED:
            return cat.SHARED_EXPERT, None, False
        if inner == FRAME_MLP:
            return (cat.SHARED_EXPERT if FRAME_MOE in kinds else cat.DENSE_FFN), None, False
        if inner == FRAME_MOE:
            return cat.ROUTER, None, False  # a Linear directly in the MoE block: the gate
        if inner == FRAME_ATTENTION:
            return cat.ATTN_PROJ, None, False
        if not in_layer and FRAME_MODEL in kinds and inner is None:
            return cat.LM_HEAD, None, False
    if module == cat.MOE_EXPERTS and inner in (FRAME_EXPERTS, FRAME_MOE):
        return cat.MOE_EXPERTS, None, False
    return None, None, False


class Classifier:
    """Kernel classes of one trace, interned by (kernel name, launching operator, frame chain)."""

    def __init__(self, raw: RawTrace, rules: RuleTable, contexts: LaunchContexts) -> None:
        self.raw = raw
        self.rules = rules
        self.contexts = contexts
        self.classes: list[KernelClass] = []
        self._index: dict[tuple[int, int, int, bool], int] = {}

    def classify(self, name_id: int, op_row: int, chain: int, is_kernel: bool) -> int:
        """Index into `classes` of the kernel's class."""
        op_name = self.raw.op_name[op_row] if op_row >= 0 and is_kernel else -1
        key = (name_id, op_name, chain if is_kernel else 0, is_kernel)
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = len(self.classes)
            self.classes.append(self._decide(name_id, op_name, chain if is_kernel else 0, is_kernel))
        return found

    def _decide(self, name_id: int, op_name: int, chain: int, is_kernel: bool) -> KernelClass:
        raw = self.raw
        name = raw.names[name_id]
        kinds = _frame_kinds(raw, self.contexts.frame_chains[chain]) if chain else ()
        op_cls = None
        if op_name >= 0:
            op_text = raw.names[op_name]
            op_cls = op_class(op_text)
            if op_cls is not None:
                module, role = _OP_MODULES[op_cls]
                frame_mod, frame_role, final = _frame_refinement(kinds, module, op_cls)
                # a matmul of two tensors is eager attention, rotary tables or an MLA weight absorb:
                # only frames tell which; without them the kernel's name decides
                if op_cls != BATCHED_MATMUL_OP or frame_mod is not None:
                    return KernelClass(module, frame_role or role, SOURCE_OP, op_text, op_cls, frame_mod, final)
        rule = self.rules.match(name)
        if rule is not None:
            frame_mod, frame_role, final = _frame_refinement(kinds, rule.module, None) if is_kernel else (None, None,
                                                                                                           False)
            return KernelClass(rule.module, frame_role or rule.role, SOURCE_RULE, rule.name, None, frame_mod, final,
                               rule)
        if self.rules.has_place_rule(name):  # a rule for some places only (e.g. the embedding before the layers)
            return KernelClass(UNMATCHED, None, SOURCE_RULE, "", None, None, False)
        family = family_of(name) if is_kernel else None
        if family is not None:
            fam, module, role = family
            frame_mod, frame_role, final = _frame_refinement(kinds, module, None)
            return KernelClass(module, frame_role or role, SOURCE_FAMILY, fam, None, frame_mod, final)
        return KernelClass(UNMATCHED, None, SOURCE_NONE, "", None, None, False)


@dataclass(slots=True)
class Kernel:
    """One kernel of the step being analysed (built per step: a lane can hold millions)."""

    position: int  # in the lane's start order
    name: str
    start_us: float
    dur_us: float
    stream: int
    is_kernel: bool
    hidden_us: float
    region: int  # forward region annotation, -1: none
    layer_frame: int  # decoder-layer nn.Module frame (row), -1: none
    kclass: KernelClass
    place: str = "outside_layers"
    layer: int = -1
    ffn_phase: bool = False
    module: str = ""
    source: str = ""  # how the module was decided (records.SOURCE_*)
    reason: str = ""  # the operator, rule or family that decided it

    @property
    def module1(self) -> str:
        return self.kclass.module1

    @property
    def role(self) -> str | None:
        return self.kclass.role

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def _rows_in_start_order(raw: RawTrace, lane_id: int) -> array:
    """The lane's kernel rows by start time (ties by row). Each stream runs its kernels one after
    another, so the file usually lists a stream in order already: merging the streams needs no
    copy of the whole lane as Python objects (a sort would, for millions of kernels)."""
    import heapq
    from collections import defaultdict

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


class Lane:
    """One GPU's kernels in start order, as typed columns, each with its launch context and class."""

    def __init__(self, raw: RawTrace, lane_id: int, rules: RuleTable, step_regions: tuple[str, ...] = ()) -> None:
        self.raw = raw
        self.rules = rules
        self.rows = rows = _rows_in_start_order(raw, lane_id)
        n = len(rows)
        self.start = array("d", (raw.kernel_start_us[r] for r in rows))
        self.dur = array("d", (raw.kernel_dur_us[r] for r in rows))
        self.stream = array("q", (raw.kernel_stream[r] for r in rows))
        self.is_kernel = array("b", (raw.kernel_kind[r] == KIND_KERNEL for r in rows))
        self.hidden = array("d", [0.0]) * n
        self.launches = contexts = LaunchContexts(raw, step_regions)
        self.graph = array("b", [0]) * n
        self.launch = self._resolve_launches()

        def per_kernel(column: array, default: int, replayed: bool = True) -> array:
            """A launch column per kernel; `replayed` False: a CUDA-graph replay's kernels get the
            default (the graph launch is no operator of theirs)."""
            graph, launch = self.graph, self.launch
            return array(column.typecode, (column[launch[p]] if launch[p] >= 0 and (replayed or not graph[p])
                                           else default for p in range(n)))

        self.thread = per_kernel(raw.launch_thread, -1)
        self.step_ann = per_kernel(contexts.step, -1)
        self.region = per_kernel(contexts.region, -1)
        self.backward = per_kernel(contexts.backward, 0)
        self.model_frame = per_kernel(contexts.model_frame, -1)
        self.op = per_kernel(contexts.op, -1, replayed=False)
        self.frames = per_kernel(contexts.frames, 0, replayed=False)
        self.layer_frame = per_kernel(contexts.layer_frame, -1, replayed=False)
        self.classifier = Classifier(raw, rules, self.launches)
        self.kclass = array("i", [0]) * n
        classify = self.classifier.classify
        names = raw.kernel_name
        for p, r in enumerate(rows):
            self.kclass[p] = classify(names[r], self.op[p], self.frames[p], bool(self.is_kernel[p]))

    def __len__(self) -> int:
        return len(self.rows)

    def name(self, p: int) -> str:
        return self.raw.names[self.raw.kernel_name[self.rows[p]]]

    def correlation(self, p: int) -> int:
        return self.raw.kernel_correlation[self.rows[p]]

    def klass(self, p: int) -> KernelClass:
        return self.classifier.classes[self.kclass[p]]

    def module1(self, p: int) -> str:
        return self.classifier.classes[self.kclass[p]].module1

    def role(self, p: int) -> str | None:
        return self.classifier.classes[self.kclass[p]].role

    def kernel(self, p: int) -> Kernel:
        return Kernel(p, self.name(p), self.start[p], self.dur[p], self.stream[p], bool(self.is_kernel[p]),
                      self.hidden[p], self.region[p], self.layer_frame[p], self.klass(p))

    def _resolve_launches(self) -> array:
        """Launch row of each kernel (-1: none). Where correlation ids repeat (a merged multi-process
        file), the launch from the process that launches this lane's other kernels wins, else the
        latest launch before the kernel started. Marks the kernels of CUDA-graph replays."""
        from collections import Counter

        raw, launches = self.raw, self.launches
        chosen = array("i", [-1]) * len(self)
        if len(raw.launch_correlation) == 0:
            # CPU activities not recorded: kernels of one graph replay still share a correlation
            counts = Counter(self.correlation(p) for p in range(len(self)))
            for p in range(len(self)):
                corr = self.correlation(p)
                self.graph[p] = corr >= 0 and counts[corr] > 1
            return chosen
        ambiguous: dict[int, list[int]] = {}  # correlation id -> its kernels, where launches share the id
        pid_votes: Counter[str] = Counter()
        for p in range(len(self)):
            corr = self.correlation(p)
            if corr < 0:
                continue
            first, count = launches.first_and_count(corr)
            if count == 1:
                chosen[p] = first
                pid_votes[raw.threads[raw.launch_thread[first]][0]] += 1
            elif count:
                ambiguous.setdefault(corr, []).append(p)
        lane_pid = pid_votes.most_common(1)[0][0] if pid_votes else None
        for corr, kernels in ambiguous.items():
            self._choose_shared(chosen, launches.candidates(corr), kernels, lane_pid)
        for p in range(len(self)):
            if chosen[p] >= 0:
                self.graph[p] = launches.is_graph(chosen[p])
        return chosen

    def _choose_shared(self, chosen: array, found: list[int], kernels: list[int], lane_pid: str | None) -> None:
        """Each kernel of one shared correlation id gets the latest launch before it started (from the
        lane's own process where it has any), else the latest of them; equal start times go to the
        first listed. Sorted once per id, so K kernels sharing an id with L launches cost
        O((K + L) log L), not K x L."""
        raw = self.raw
        same_pid = [f for f in found if raw.threads[raw.launch_thread[f]][0] == lane_pid]
        pool = sorted(same_pid or found, key=raw.launch_start_us.__getitem__)  # stable: listed order within a tie
        starts = [raw.launch_start_us[f] for f in pool]
        for p in kernels:
            i = bisect_right(starts, self.start[p])
            latest = starts[i - 1] if i else starts[-1]
            chosen[p] = pool[bisect_left(starts, latest)]


def final_module(k: Kernel, rules: RuleTable) -> tuple[str, str, str]:
    """(module, source, reason) of the kernel at its place in the step. The module is `gemm` for a
    GEMM whose module follows from its position in the layer (resolved by the caller) and
    `unmatched` (source SOURCE_NONE) when nothing classified it."""
    c = k.kclass
    source, reason = c.source, c.reason
    if c.source in (SOURCE_OP, SOURCE_RULE, SOURCE_FAMILY) and (c.final_norm or (c.role == "norm" and
                                                                                  c.source == SOURCE_OP)):
        if k.place == "after_layers":
            return cat.LM_HEAD, source, reason
        if c.frame_module is None and c.source == SOURCE_OP:
            return cat.ELEMENTWISE, source, reason
    if c.frame_module is not None:
        if c.frame_module == cat.LM_HEAD and k.place == "before_layers":
            return OTHER, source, reason
        return c.frame_module, source, reason
    if c.source == SOURCE_RULE:
        rule = rules.match(k.name, k.place)
        if rule is None:
            return UNMATCHED, SOURCE_NONE, ""
        return rule.module, source, rule.name
    if c.source == SOURCE_OP and c.op_class in _AFTER_LAYERS_LM_HEAD and k.place == "after_layers":
        return cat.LM_HEAD, source, reason
    if c.source == SOURCE_OP and c.op_class == TOPK_OP and k.place != "in_layers":
        return cat.ELEMENTWISE, source, reason
    return c.module, source, reason
