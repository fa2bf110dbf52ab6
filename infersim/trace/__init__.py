"""Compare real runs with the simulator: PyTorch-profiler (Kineto) traces and SGLang benchmark results.

Public API:

- `measure_trace(spec, rules=None, rank=None, stage=None, layers_per_step=None)`: measured time
  per step, per layer and per module of each analysed rank (`LaneMeasure`).
- `compare_lane(lane, prefill, decode)`: measured against a simulation's prefill / decode
  `StageResult` (`StageComparison` per stage).
- `read_bench_results(path)`, `bench_workload(...)`, `compare_bench_record(...)`: benchmark lines.
- `load_rules(user_files)`: the shipped kernel rule table, user files first.
- `ChromeTraceReader` / `iter_trace_events`: the streaming event reader underneath.

Modules, in the order the data flows: `reader` (streaming JSON), `load` (the events kept, as
columns), `operators` (what CPU operators and nn.Module frames mean), `context` (each launch's
annotations, operator and frames), `attribution` (each kernel's class: operator, rule, family),
`steps`, `layers`, `measure` (times per step, layer, module), `compare` (against a prediction),
`report` (text and JSON), `learn` (`mfu from-trace`: kernel tables from a trace), and beside them
`bench`, `checks`, `cli`, `files`, `host`, `records`, `rules` and `traced_run`. The test traces'
GPU side is made outside the package, by tests/tracegen/synthesis.py. See docs/traces.md.
"""

from __future__ import annotations

from collections import defaultdict

from infersim.base.errors import InferSimError
from infersim.trace.measure import analyze_lane, lane_ids
from infersim.trace.bench import (BenchComparison, BenchRecord, BenchWorkload, MetricComparison, bench_workload,
                                  compare_bench_record, read_bench_results)
from infersim.trace.compare import ModuleComparison, StageComparison, compare_lane, compare_stage
from infersim.trace.files import RankFile, find_trace_files, select_rank_files
from infersim.trace.load import RawTrace, load_trace
from infersim.trace.reader import ChromeTraceReader, TraceFormatError, iter_trace_events
from infersim.trace.records import (STAGES, AnalysisOptions, Attribution, LaneMeasure, LayerTime, ModuleTime,
                                    StageMeasure, StepMeasure, StreamTime, UnmatchedKernel)
from infersim.trace.rules import KernelRule, RuleTable, load_rules

__all__ = [
    "AnalysisOptions", "Attribution", "BenchComparison", "BenchRecord", "BenchWorkload", "ChromeTraceReader", "KernelRule",
    "LaneMeasure", "LayerTime", "MetricComparison", "ModuleComparison", "ModuleTime", "RankFile", "RawTrace",
    "RuleTable", "StageComparison", "StageMeasure", "StepMeasure", "StreamTime", "TraceFormatError",
    "UnmatchedKernel", "analyze_lane", "bench_workload", "compare_bench_record", "compare_lane", "compare_stage",
    "find_trace_files", "iter_trace_events", "lane_ids", "load_rules", "load_trace", "measure_trace",
    "read_bench_results", "select_rank_files",
]


def _rank_label(file: RankFile, raw: RawTrace, lane: int, several_lanes: bool) -> str:
    if file.rank_label:
        return file.rank_label + (f" GPU {raw.lanes[lane]}" if several_lanes else "")
    if several_lanes:
        return f"GPU {raw.lanes[lane]}"
    info = raw.top_level.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return f"rank {info['rank']}"
    return ""


def _merge_same_rank(measures: list[LaneMeasure]) -> LaneMeasure:
    """One rank profiled into several files (one per stage): one measure with all stages."""
    if len(measures) == 1:
        return measures[0]
    streams: dict[int, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    for m in measures:
        for s in m.streams:
            acc = streams[s.stream]
            acc[0] += s.kernel_time_s
            acc[1] += s.kernels
            acc[2] += s.communication_s
    stages = []
    seen: set[str] = set()
    notes = [n for m in measures for n in m.notes]
    for m in measures:
        for stage in m.stages:
            if stage.stage in seen:
                notes.append(f"{m.path}: {stage.stage} steps also found in another file of this rank; "
                             "only the first file's are reported")
                continue
            seen.add(stage.stage)
            stages.append(stage)
    stages.sort(key=lambda s: STAGES.index(s.stage) if s.stage in STAGES else len(STAGES))
    return LaneMeasure(
        path=", ".join(m.path for m in measures), rank=measures[0].rank, stages=tuple(stages),
        streams=tuple(StreamTime(s, v[0], int(v[1]), v[2]) for s, v in sorted(streams.items())),
        kernels=sum(m.kernels for m in measures), kernel_time_s=sum(m.kernel_time_s for m in measures),
        outside_steps_s=sum(m.outside_steps_s for m in measures),
        outside_steps_kernels=sum(m.outside_steps_kernels for m in measures), notes=tuple(notes),
        device=measures[0].device)


def measure_trace(spec: str, rules: RuleTable | None = None, rank: str | None = None, stage: str | None = None,
                  layers_per_step: int | None = None, step_regions: tuple[str, ...] = ()) -> tuple[LaneMeasure, ...]:
    """Measure the trace file(s) named by `spec` (file, directory or glob).

    rank: None = rank 0 (the lowest TP rank; the lowest GPU of a merged file), an integer string =
    that TP rank (or that GPU of a merged file), "all" = every rank. One LaneMeasure per rank.
    step_regions: names of user annotations that mark one step each (default: names that say
    prefill or decode).
    """
    rules = rules or load_rules()
    files = select_rank_files(find_trace_files(spec), rank)
    by_rank: dict[str, list[LaneMeasure]] = defaultdict(list)
    for file in files:
        raw = load_trace(file.path)
        present = lane_ids(raw)
        if not present:
            label = file.rank_label
            by_rank[label or str(file.path)].append(LaneMeasure(str(file.path), label, (), (), 0, 0.0, 0.0, 0,
                                                                ("no GPU kernels in this trace",)))
            continue
        if rank == "all":
            chosen = present
        elif rank is not None and file.tp is None:
            chosen = lane_ids(raw, rank)
            if not chosen:
                gpus = ", ".join(raw.lanes[i] for i in present)
                raise InferSimError(f"{file.path}: --rank {rank}: no GPU {rank} in this trace (GPUs: {gpus})")
        else:
            chosen = present[:1]
        for lane in chosen:
            label = _rank_label(file, raw, lane, len(present) > 1)
            options = AnalysisOptions(stage=stage, layers_per_step=layers_per_step, file_stage=file.stage,
                                      rank_label=label, step_regions=tuple(step_regions))
            by_rank[label or str(file.path)].append(analyze_lane(raw, lane, rules, options))
        del raw  # one file at a time: a 64-rank directory never sits in memory at once
    return tuple(_merge_same_rank(measures) for measures in by_rank.values())
