"""A traced run as `mfu from-trace` learns from it: every GEMM, attention, grouped-GEMM and elementwise
operator call of the trace's steps with the kernel time it launched, and the workload the steps ran.

The trace is measured as `compare --trace` measures it (steps, stages, modules); every kernel is
tied to the CPU operator call that launched it, and a call's time is the sum of its kernels. Calls
whose kernels ran in CUDA-graph replays carry no operator and no shapes and are left out (noted).
The traced workload (batch and lengths of the traced stages) comes from the recorded shapes of the
attention calls, else from the GEMM inputs' [batch, seq, hidden]. infersim.trace.learn turns the
calls into table rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from infersim.cards import categories as cat
from infersim.base.errors import InferSimError, NotPossible
from infersim.trace.files import find_trace_files, select_rank_files
from infersim.trace.load import RawTrace, load_trace
from infersim.trace.measure import MeasuredSteps, lane_ids, measure_steps
from infersim.trace.operators import (ATTENTION_OP, CONCAT_OP, ELEMENTWISE_OP, GEMM_OP, GROUPED_GEMM_OP, NORM_PART_OP,
                                      SAMPLING_OP, SOFTMAX_OP, TOPK_OP, AttentionDims, ElementwiseDims, GemmDims,
                                      GroupedDims, attention_dims, elementwise_dims, gemm_dims, grouped_dims, op_class,
                                      parse_shapes)
from infersim.trace.records import AnalysisOptions, LaneMeasure
from infersim.trace.rules import load_rules

#: modules whose GEMM and attention kernels the tables time
TABLE_MODULES = frozenset({cat.ATTN_PROJ, cat.ATTN_CORE, cat.DENSE_FFN, cat.SHARED_EXPERT, cat.MOE_EXPERTS,
                           cat.ROUTER, cat.LM_HEAD})
# operator classes whose kernels are eager elementwise work the elementwise tables key (embedding lookups
# are not: the plan prices the embedding as one gather of its own)
ELEMENTWISE_CLASSES = frozenset({ELEMENTWISE_OP, NORM_PART_OP, CONCAT_OP, SOFTMAX_OP, TOPK_OP, SAMPLING_OP})


@dataclass(frozen=True)
class TracedCall:
    """One GEMM, attention or grouped-GEMM operator call and the kernel time it launched."""

    stage: str
    kind: str  # gemm / attention / grouped_gemm / elementwise
    module: str
    op: str
    dims: GemmDims | AttentionDims | GroupedDims | ElementwiseDims
    time_us: float
    kernels: tuple[str, ...]
    step: int


@dataclass
class TracedRun:
    """What a trace says for learning tables: its calls, its measure and what it lacks."""

    path: Path
    raw: RawTrace
    lane: LaneMeasure
    calls: list[TracedCall]
    notes: list[str] = field(default_factory=list)
    unkeyed_elementwise: dict[str, float] = field(default_factory=dict)  # why not keyed -> kernel µs per step
    # per step (StepMeasure.index): its kernels in launch order as (launches, seconds); a CUDA-graph
    # replay's kernels launch nothing of their own
    launch_order: dict[int, tuple[tuple[int, float], ...]] = field(default_factory=dict)

    def stages(self) -> list[str]:
        return sorted({c.stage for c in self.calls if c.stage in ("prefill", "decode")}, key=("prefill", "decode").index)


def traced_calls(raw: RawTrace, lane_id: int, measured: MeasuredSteps
                 ) -> tuple[list[TracedCall], list[str], dict[str, float], dict[int, tuple[tuple[int, float], ...]]]:
    """Every operator call with shapes in the lane's steps, with its kernels' time; the elementwise
    kernel time no table op keys (why -> µs per step); each step's kernels in launch order."""
    lane = measured.lane
    calls: list[TracedCall] = []
    notes: list[str] = []
    unshaped: dict[str, float] = defaultdict(float)
    graph_us: dict[str, float] = defaultdict(float)
    unkeyed: dict[str, float] = defaultdict(float)
    order: dict[int, tuple[tuple[int, float], ...]] = {}
    steps = 0
    for number, (group, _source, kernels, _layers) in enumerate(measured):
        steps += 1
        launched = sorted((raw.launch_start_us[lane.launch[k.position]] if lane.launch[k.position] >= 0 else k.start_us,
                            k.start_us, 0 if lane.graph[k.position] or lane.launch[k.position] < 0 else 1, k.dur_us)
                           for k in kernels if k.is_kernel)
        order[number] = tuple((launches, dur * 1e-6) for _, _, launches, dur in launched)
        by_op: dict[int, list] = defaultdict(list)
        for k in kernels:
            row = lane.op[k.position]
            if row >= 0:
                by_op[row].append(k)
            elif lane.graph[k.position] and k.module in TABLE_MODULES:
                graph_us[group.stage] += k.dur_us
        for row, ks in by_op.items():
            name = raw.names[raw.op_name[row]]
            cls = op_class(name)
            if cls in ELEMENTWISE_CLASSES:
                call = _elementwise_call(raw, row, name, ks, group.stage, number, unkeyed)
            elif cls in (GEMM_OP, ATTENTION_OP, GROUPED_GEMM_OP):
                call = _shaped_call(raw, row, name, cls, ks, group.stage, number, unshaped)
            else:
                call = None
            if call is not None:
                calls.append(call)
    if unshaped:
        total = sum(unshaped.values())
        notes.append(f"{total / 1e3:.3f} ms of GEMM/attention kernel time ran under operators without recorded shapes "
                     f"({', '.join(sorted(unshaped))}): no rows from them (profile with record_shapes=True)")
    for stage, us in graph_us.items():
        notes.append(f"{stage}: {us / 1e3:.3f} ms of GEMM/attention kernel time ran in CUDA-graph replays, which "
                     "carry no operator and no shapes: no rows from them (record an eager or compiled run without "
                     "CUDA graphs to learn them)")
    return calls, notes, {why: us / max(steps, 1) for why, us in unkeyed.items()}, order


def _elementwise_call(raw: RawTrace, row: int, name: str, ks: list, stage: str, number: int,
                      unkeyed: dict[str, float]) -> TracedCall | None:
    """An elementwise operator's call keyed for the elementwise table, or None with its kernel time
    added to `unkeyed` under the reason no key was found."""
    ks = [k for k in ks if k.is_kernel]  # copies and memsets are no elementwise kernel
    if not ks:
        return None
    time = sum(k.dur_us for k in ks)
    shape_id = raw.op_shapes[row]
    if shape_id < 0:
        unkeyed[f"{name}: no recorded shapes"] += time
        return None
    key = elementwise_dims(name, raw.shape_texts[shape_id], tuple(sorted({k.name for k in ks})))
    if isinstance(key, str):
        unkeyed[key] += time
        return None
    return TracedCall(stage, "elementwise", ks[0].module, name, key, time, tuple(sorted({k.name for k in ks})), number)


def _shaped_call(raw: RawTrace, row: int, name: str, cls: str, ks: list, stage: str, number: int,
                 unshaped: dict[str, float]) -> TracedCall | None:
    """A GEMM, attention or grouped-GEMM operator's call with its table dimensions, or None (its
    kernel time added to `unshaped` when its shapes were not recorded or not understood)."""
    shape_id = raw.op_shapes[row]
    time = sum(k.dur_us for k in ks)
    shapes = parse_shapes(raw.shape_texts[shape_id]) if shape_id >= 0 else None
    dims: Any = None
    if shapes is not None and cls == GEMM_OP and gemm_dims(name, shapes) is None:
        return None  # a matmul of two activations (rotary tables, eager attention): no weight GEMM to key
    if shapes is not None:
        if cls == GEMM_OP:
            dims = gemm_dims(name, shapes)
        elif cls == ATTENTION_OP:
            dims = attention_dims(name, shapes)
        else:
            dims = grouped_dims(shapes)
    module = max({k.module for k in ks}, key=lambda m: sum(k.dur_us for k in ks if k.module == m))
    if dims is None:
        unshaped[name] += time
        return None
    kind = {GEMM_OP: "gemm", ATTENTION_OP: "attention", GROUPED_GEMM_OP: "grouped_gemm"}[cls]
    return TracedCall(stage, kind, module, name, dims, time, tuple(sorted({k.name for k in ks})), number)


def read_traced_run(path: str, rank: str | None = None, step_regions: tuple[str, ...] = (),
                    rules_files: Sequence[str] = ()) -> TracedRun:
    files = select_rank_files(find_trace_files(path), rank)
    if len(files) != 1:
        raise InferSimError(f"{path}: mfu from-trace reads one trace file of one rank ({len(files)} selected); "
                            "name the file or --rank")
    raw = load_trace(files[0].path)
    present = lane_ids(raw)
    dropped = [note for note in raw.notes if "GPU event" in note and "dropped" in note]
    if not present and dropped:  # kernels there were, but none a time can be learned from
        raise NotPossible(f"{path}: no GPU kernel left to learn kernel times from: {'; '.join(dropped)}")
    if not present:
        raise NotPossible(f"{path}: no GPU kernels in this trace: nothing to learn kernel times from (a CPU-only "
                          "recording's operator times are the CPU doing the kernels' work, not a GPU launch loop: "
                          "no host costs either; record on the GPU)")
    lane_id = present[0]
    if rank is not None and files[0].tp is None:
        chosen = lane_ids(raw, rank)
        if not chosen:
            raise InferSimError(f"{path}: --rank {rank}: no GPU {rank} in this trace")
        lane_id = chosen[0]
    options = AnalysisOptions(file_stage=files[0].stage, step_regions=step_regions)
    rules = load_rules(rules_files)
    measured = MeasuredSteps(raw, lane_id, rules, options)
    calls, notes, unkeyed, order = traced_calls(raw, lane_id, measured)
    lane = measure_steps(MeasuredSteps(raw, lane_id, rules, options))
    if not raw.has_shapes:
        notes.insert(0, "the trace has no recorded operator shapes (record_shapes=False): no GEMM or attention row "
                        "can be keyed; profile with torch.profiler.profile(record_shapes=True)")
    return TracedRun(files[0].path, raw, lane, calls, [*raw.notes, *notes], unkeyed, order)


# ---------------------------------------------------------------------------------------------
# The traced workload


@dataclass(frozen=True)
class TracedWorkload:
    """Batch and lengths of the traced stages, as run-config workload fields."""

    isl: int
    osl: int
    prefill_tokens: int
    decode_batch: int
    prefill_batch: int
    prompt: int
    decode_kv: float

    def overrides(self) -> list[str]:
        out = [f"workload.isl={self.isl}", f"workload.osl={self.osl}"]
        if self.prefill_tokens:
            out.append(f"workload.prefill_tokens_per_gpu={self.prefill_tokens}")
        if self.decode_batch:
            out.append(f"workload.decode_batch_per_gpu={self.decode_batch}")
        return out

    def describe(self) -> str:
        parts = []
        if self.prefill_tokens:
            parts.append(f"prefill {self.prefill_batch} x {self.prompt} tokens")
        if self.decode_batch:
            parts.append(f"decode batch {self.decode_batch} at a mean context of {self.decode_kv:.1f} tokens")
        return ", ".join(parts)


def _traced_count(value: Any, run: TracedRun, call: Any, what: str) -> int:
    """A batch or length read from a traced operator's recorded shapes, through the number rule,
    naming the trace and the operator (not the --set override the workload becomes)."""
    from infersim.cards.schema import check_number

    return int(check_number(value, str(run.path), f"{call.stage} {call.op} {what} (its recorded Input Dims)",
                            whole=True, ge=1))


def traced_workload(run: TracedRun) -> TracedWorkload:
    prefill = [c for c in run.calls if c.stage == "prefill" and isinstance(c.dims, AttentionDims)]
    decode = [c for c in run.calls if c.stage == "decode" and isinstance(c.dims, AttentionDims)]
    batch_prompt = None
    if prefill:
        first = prefill[0]
        batch_prompt = (_traced_count(first.dims.batch, run, first, "batch"),
                        _traced_count(first.dims.q_len, run, first, "query length"))
    else:  # no attention shapes: the GEMM inputs' [batch, seq, hidden]
        gemm = next((c for c in run.calls if c.stage == "prefill" and isinstance(c.dims, GemmDims) and c.dims.seq),
                    None)
        if gemm is not None:
            batch_prompt = (_traced_count(gemm.dims.batch or 1, run, gemm, "batch"),
                            _traced_count(gemm.dims.seq, run, gemm, "sequence length"))
    if decode:
        decode_batch = max(_traced_count(c.dims.batch, run, c, "batch") for c in decode)
        kv = fmean(_traced_count(c.dims.kv_len, run, c, "key length") for c in decode)
    else:
        decode_gemm = [c for c in run.calls if c.stage == "decode" and isinstance(c.dims, GemmDims)]
        decode_batch = max((_traced_count(c.dims.batch or c.dims.m, run, c, "rows") for c in decode_gemm), default=0)
        kv = 0.0
    if batch_prompt is not None:  # the prefill step's tokens: a count too
        _traced_count(batch_prompt[0] * batch_prompt[1], run, first if prefill else gemm, "batch x length")
    if batch_prompt is None and not decode_batch:
        raise NotPossible(f"{run.path}: no prefill or decode step with recorded GEMM or attention shapes: "
                          "nothing to learn (profile with record_shapes=True, without CUDA graphs)")
    if batch_prompt is not None:
        isl = batch_prompt[1]
    else:
        isl = max(1, round(kv) - 1)
    osl = max(1, round(2 * (kv - isl))) if kv else 1
    return TracedWorkload(isl, osl, batch_prompt[0] * batch_prompt[1] if batch_prompt else 0, decode_batch,
                          batch_prompt[0] if batch_prompt else 0, batch_prompt[1] if batch_prompt else 0, kv)
