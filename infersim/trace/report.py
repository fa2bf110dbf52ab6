"""Text and JSON views of trace measurements and comparisons.

Inside everything is seconds; here step-level times print in milliseconds and per-layer times in
microseconds, each column labelled. JSON keeps seconds (keys end in `_s`) so it stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from infersim.cards import categories as cat
from infersim.trace.records import (SOURCE_NONE, SOURCES, LaneMeasure, ModuleTime, StageMeasure,
                                    StepMeasure)
from infersim.trace.bench import BenchComparison
from infersim.trace.compare import ModuleComparison, StageComparison

MAX_LAYER_COLUMNS = 8  # wider traces print min / mean / max per layer instead of one column per layer
NAME_WIDTH = 100


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def pct(error: float | None) -> str:
    return "n/a" if error is None else f"{error * 100:+.1f}%"


def _short(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def _plural(n: float, word: str) -> str:
    return f"{n:g} {word}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------------------------------------
# Text


def _lane_header(lane: LaneMeasure) -> list[str]:
    rank = f" ({lane.rank})" if lane.rank else ""
    lines = [f"Trace {lane.path}{rank}" + (f", {lane.device}" if lane.device else ""),
             f"GPU activities: {lane.kernels} ({ms(lane.kernel_time_s)} ms of kernel time)"]
    streams = ", ".join(f"{s.stream}: {ms(s.kernel_time_s)} ms"
                        + (f" ({ms(s.communication_s)} communication)" if s.communication_s else "")
                        for s in lane.streams)
    if streams:
        lines.append(f"streams: {streams}")
    if lane.outside_steps_kernels:
        lines.append(f"outside any forward step: {lane.outside_steps_kernels} kernels, "
                     f"{ms(lane.outside_steps_s)} ms (backward passes, idle batches, warm-up)")
    lines += [f"note: {n}" for n in lane.notes]
    return lines


def _stage_header(stage: StageMeasure, compared_as: str | None = None) -> list[str]:
    sources = sorted({s.step_source for s in stage.steps})
    layer_sources = sorted({s.layer_source for s in stage.steps})
    title = stage.stage if compared_as in (None, stage.stage) else f"{stage.stage} steps compared as {compared_as}"
    told = sorted({s.stage_source for s in stage.steps if s.stage_source})
    lines = [f"== {title}: {_plural(len(stage.steps), 'step')} ({', '.join(sources)}), "
             f"{stage.num_layers} layers per step (from {', '.join(layer_sources)}) ==",
             *([f"stage told by: {'; '.join(told)}"] if told and stage.stage in ("prefill", "decode") else []),
             (f"step time: {ms(stage.wall_s)} ms ({stage.wall_source}) | GPU span: {ms(stage.step_time_s)} ms | "
              if any(s.synchronous for s in stage.steps) else
              f"step time (GPU span, first kernel start to last kernel end): {ms(stage.step_time_s)} ms | ")
             + f"GPU busy: {ms(stage.busy_s)} ms | kernel time, streams added: {ms(stage.kernel_time_s)} ms",
             f"GPU idle in the step (waiting for the host's launches and work, or between kernels): "
             f"{ms(stage.gpu_idle_s)} ms"
             + (f" | host work in the step: {ms(stage.host_work_s)} ms, {stage.launches:g} launches"
                + (f", {stage.launch_spacing_s * 1e6:.2f} µs per launch in the layers"
                   if stage.launch_spacing_s is not None else "") if stage.host_work_s else "")]
    return lines


def _measured_table(modules: Sequence[ModuleTime]) -> str:
    rows = [[m.module, ms(m.time_s), us(m.per_layer_s), f"{m.kernels:g}",
             ms(m.exposed_s) if m.module in cat.COMMUNICATION else "",
             ms(m.hidden_s) if m.module in cat.COMMUNICATION else ""] for m in modules]
    return tabulate(rows, headers=["module", "per step (ms)", "per layer (µs)", "kernels/step",
                                   "exposed (ms)", "hidden (ms)"], disable_numparse=True)


def _layers_table(stage: StageMeasure) -> str:
    if not stage.layers:
        return ""
    modules = [m.module for m in stage.modules if any(dict(layer.modules).get(m.module) for layer in stage.layers)]
    if len(stage.layers) <= MAX_LAYER_COLUMNS:
        headers = ["module (µs)"] + [f"layer {layer.index}" for layer in stage.layers]
        rows = [[m] + [us(dict(layer.modules).get(m, 0.0)) for layer in stage.layers] for m in modules]
        rows.append(["total"] + [us(layer.time_s) for layer in stage.layers])
    else:
        headers = ["module (µs)", "min layer", "mean layer", "max layer"]
        rows = []
        for m in modules:
            values = [dict(layer.modules).get(m, 0.0) for layer in stage.layers]
            rows.append([m, us(min(values)), us(sum(values) / len(values)), us(max(values))])
        totals = [layer.time_s for layer in stage.layers]
        rows.append(["total", us(min(totals)), us(sum(totals) / len(totals)), us(max(totals))])
    return tabulate(rows, headers=headers, disable_numparse=True)


def _attribution_line(stage: StageMeasure) -> str:
    """How the stage's kernels were classified: share of time by ground, the largest reasons."""
    total = sum(a.time_s for a in stage.attribution)
    if total <= 0:
        return "kernel attribution: no kernel time"
    parts = []
    for source in SOURCES:
        rows = [a for a in stage.attribution if a.source == source]
        time = sum(a.time_s for a in rows)
        if not rows:
            continue
        top = sorted(rows, key=lambda a: -a.time_s)[:3] if source != SOURCE_NONE else []
        detail = ", ".join(f"{a.reason} {a.time_s / total * 100:.0f}%" for a in top
                           if a.reason and a.time_s / total >= 0.005)
        parts.append(f"{source} {time / total * 100:.1f}%" + (f" ({detail})" if detail else ""))
    return (f"kernel attribution: {stage.attributed_share() * 100:.1f}% of kernel time attributed to a module; "
            f"by {'; '.join(parts)}")


def _unmatched_lines(stage: StageMeasure, steps: int) -> list[str]:
    lines = [_attribution_line(stage)]
    if not stage.unmatched:
        return lines + ["unclassified kernels: none"]
    total = sum(u.time_s for u in stage.unmatched) / steps
    lines.append(f"unclassified kernels (no CPU operator, rule or family says what they are; counted as 'unmatched' "
                 f"above; add rules with --rules): {len(stage.unmatched)} names, {ms(total)} ms per step")
    rows = [[ms(u.time_s / steps), f"{u.count / steps:g}", _short(u.name)] for u in stage.unmatched[:20]]
    lines.append(tabulate(rows, headers=["per step (ms)", "kernels/step", "name"], disable_numparse=True))
    if len(stage.unmatched) > 20:
        lines.append(f"... and {len(stage.unmatched) - 20} more (see --format json)")
    return lines


def _steps_table(steps: Sequence[StepMeasure]) -> str:
    rows = [[s.index, s.stage, _short(s.label, 40), ms(s.start_s), ms(s.wall_s), ms(s.span_s), ms(s.busy_s),
             ms(s.host_work_s) if s.host_extent else "", s.launches, s.num_layers] for s in steps]
    return tabulate(rows, headers=["step", "stage", "from", "start (ms)", "wall (ms)", "GPU span (ms)", "busy (ms)",
                                   "host work (ms)", "launches", "layers"], disable_numparse=True)


def lane_text(lane: LaneMeasure, show_steps: bool = False) -> str:
    out = _lane_header(lane)
    if not lane.stages:
        out.append("no forward steps found: nothing to report")
    for stage in lane.stages:
        out += ["", *_stage_header(stage), "", _measured_table(stage.modules)]
        layers = _layers_table(stage)
        if layers:
            out += ["", "per layer (mean over steps):", layers]
        out += [""] + _unmatched_lines(stage, len(stage.steps))
        if show_steps:
            out += ["", _steps_table(stage.steps)]
        out += [f"note: {n}" for n in stage.notes]
    return "\n".join(out)


#: the comparison row of the engine's host time, named for what each side holds
OVERHEAD_LABEL = "overhead (GPU idle)"


def _comparison_table(rows: Sequence[ModuleComparison]) -> str:
    table = [[OVERHEAD_LABEL if r.module == cat.OVERHEAD else r.module, ms(r.measured_s), ms(r.predicted_s), ms(r.gap_s), pct(r.error),
              us(r.measured_per_layer_s), us(r.predicted_per_layer_s), pct(r.per_layer_error),
              f"{ms(r.measured_exposed_s)} / {ms(r.measured_hidden_s)}" if r.module in cat.COMMUNICATION else ""]
             for r in rows]
    return tabulate(table, headers=["module", "measured/step (ms)", "predicted/step (ms)", "gap (ms)", "error",
                                    "measured/layer (µs)", "predicted/layer (µs)", "error",
                                    "exposed / hidden (ms)"], disable_numparse=True)


def comparison_text(lane: LaneMeasure, comparisons: Sequence[StageComparison], show_steps: bool = False) -> str:
    out = _lane_header(lane)
    if not comparisons:
        out.append("no forward steps found: nothing to compare")
    for comp in comparisons:
        stage = comp.measured
        out += ["", *_stage_header(stage, comp.stage)]
        out.append(f"step: measured {ms(comp.measured_step_s)} ms, predicted {ms(comp.predicted_step_s)} ms "
                   f"({'TTFT' if comp.stage == 'prefill' else 'TPOT'}), error {pct(comp.step_error)}; "
                   f"layers: measured {comp.measured_layers}, predicted {comp.predicted_layers}")
        out += ["", "per module, largest gap first (error = (predicted - measured) / measured):",
                _comparison_table(comp.modules), _table_modules_line(comp)]
        layers = _layers_table(stage)
        if layers:
            out += ["", "measured per layer (mean over steps):", layers]
        out += [""] + _unmatched_lines(stage, len(stage.steps))
        if show_steps:
            out += ["", _steps_table(stage.steps)]
        out += [f"note: {n}" for n in (*stage.notes, *comp.notes)]
    return "\n".join(out)


def _table_modules_line(comp: StageComparison) -> str:
    from infersim.trace.learn import TABLE_TIMED

    rows = {r.module: r for r in comp.modules}
    measured = sum(rows[m].measured_s for m in TABLE_TIMED if m in rows)
    predicted = sum(rows[m].predicted_s for m in TABLE_TIMED if m in rows)
    error = (predicted - measured) / measured if measured > 0 else None
    return (f"GEMM, attention and expert modules ({', '.join(m for m in TABLE_TIMED if m in rows)}): measured "
            f"{ms(measured)} ms, predicted {ms(predicted)} ms, error {pct(error)}")


def learned_text(out: Any, table_dir: Any, workload: Any, checks: Sequence[Any]) -> str:
    """What `mfu from-trace` wrote, and how the tables reproduce the trace they came from."""
    prov = table_dir.provenance
    lines = [f"wrote {out}: kernel tables learned from {prov.source.get('trace', '?')}",
             f"device: {prov.device.name}" + (f", {prov.device.sm_count} SMs" if prov.device.sm_count else "")
             + f"; measured on {prov.measured_on}; traced workload: {workload.describe()}"]
    lines += [f"  {name}: {len(rows)} rows, {prov.tables[name].library}" for name, rows in table_dir.tables.items()]
    if prov.elementwise_memory_efficiency is not None:
        lines.append(f"  elementwise_memory_efficiency: {prov.elementwise_memory_efficiency:.3f} (fitted, see "
                     "provenance.yaml)")
    if prov.launch_cpu is not None or prov.step_cpu is not None:
        said = ", ".join(f"{name} {value * 1e6:.1f} µs" for name, value in (("launch_cpu", prov.launch_cpu),
                                                                             ("step_cpu", prov.step_cpu))
                         if value is not None)
        lines.append(f"  host costs: {said} (provenance host_source says how)")
    lines += [f"note: {n}" for n in prov.notes]
    lines += ["", "the trace predicted again with these tables (per step; the whole step is its wall time against "
                  "TTFT / TPOT; error = (predicted - measured) / measured):"]
    rows = []
    for c in checks:
        rows.append([c.stage, "GEMM, attention, experts", ms(c.measured_table_s), ms(c.predicted_table_s),
                     pct(c.error(c.predicted_table_s, c.measured_table_s))])
        rows.append([c.stage, "all kernels", ms(c.measured_kernel_s), ms(c.predicted_kernel_s),
                     pct(c.error(c.predicted_kernel_s, c.measured_kernel_s))])
        rows.append([c.stage, "GPU idle / overhead (host)", ms(c.measured_idle_s), ms(c.predicted_overhead_s),
                     pct(c.error(c.predicted_overhead_s, c.measured_idle_s))])
        rows.append([c.stage, f"whole step ({'TTFT' if c.stage == 'prefill' else 'TPOT'})", ms(c.measured_step_s),
                     ms(c.predicted_step_s), pct(c.error(c.predicted_step_s, c.measured_step_s))])
    lines.append(tabulate(rows, headers=["stage", "what", "measured (ms)", "predicted (ms)", "error"],
                          disable_numparse=True))
    for c in checks:
        lines += ["", f"{c.stage}, per module:", _comparison_table(c.modules)]
    return "\n".join(lines)


def bench_text(source: str, config: str, comparisons: Sequence[BenchComparison]) -> str:
    out = [f"Benchmark {source} against {config}"]
    for comp in comparisons:
        rec, wl = comp.record, comp.workload
        out += ["", f"== line {rec.line} ({rec.kind}): {rec.label} ==",
                f"server batch {rec.batch_size:g}, input {rec.input_len}, output {rec.output_len} -> simulated per GPU: "
                f"{wl.prefill_tokens_per_gpu} prompt tokens, decode batch {wl.decode_batch_per_gpu}"]
        rows = []
        for m in comp.metrics:
            if m.unit == "s":
                rows.append([m.metric + " (ms)", ms(m.measured), ms(m.predicted), pct(m.error)])
            else:
                rows.append([m.metric + " (tok/s)", f"{m.measured:.1f}", f"{m.predicted:.1f}", pct(m.error)])
        out.append(tabulate(rows, headers=["metric", "measured", "predicted", "error"], disable_numparse=True))
        out += [f"note: {n}" for n in comp.notes]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# JSON


def _module_json(m: ModuleTime) -> dict[str, Any]:
    return {"module": m.module, "time_s": m.time_s, "per_layer_s": m.per_layer_s, "exposed_s": m.exposed_s,
            "hidden_s": m.hidden_s, "kernels_per_step": m.kernels}


def _step_json(s: StepMeasure) -> dict[str, Any]:
    return {"index": s.index, "label": s.label, "stage": s.stage, "step_source": s.step_source,
            "layer_source": s.layer_source, "stage_source": s.stage_source, "start_s": s.start_s,
            "span_s": s.span_s, "busy_s": s.busy_s, "wall_s": s.wall_s, "wall_source": s.wall_source, "synchronous": s.synchronous,
            "gpu_idle_s": s.gpu_idle_s, "host_extent": s.host_extent, "host_work_s": s.host_work_s,
            "launches": s.launches, "layer_launch_s": s.layer_launch_s, "layer_launch_gaps": s.layer_launch_gaps,
            "kernel_time_s": s.kernel_time_s, "num_layers": s.num_layers,
            "modules": [_module_json(m) for m in s.modules]}


def stage_json(stage: StageMeasure) -> dict[str, Any]:
    return {"stage": stage.stage, "steps": len(stage.steps), "num_layers": stage.num_layers,
            "step_time_s": stage.step_time_s, "busy_s": stage.busy_s, "kernel_time_s": stage.kernel_time_s,
            "wall_s": stage.wall_s, "wall_source": stage.wall_source, "gpu_idle_s": stage.gpu_idle_s,
            "host_work_s": stage.host_work_s, "launches": stage.launches,
            "launch_spacing_s": stage.launch_spacing_s,
            "modules": [_module_json(m) for m in stage.modules],
            "layers": [{"index": layer.index, "time_s": layer.time_s, "modules": dict(layer.modules)}
                       for layer in stage.layers],
            "unmatched": [{"name": u.name, "count": u.count, "time_s": u.time_s} for u in stage.unmatched],
            "attributed_share": stage.attributed_share(),
            "attribution": [{"source": a.source, "reason": a.reason, "kernels": a.kernels, "time_s": a.time_s}
                            for a in stage.attribution],
            "notes": list(stage.notes), "step_list": [_step_json(s) for s in stage.steps]}


def lane_json(lane: LaneMeasure) -> dict[str, Any]:
    return {"path": lane.path, "rank": lane.rank, "device": lane.device, "kernels": lane.kernels,
            "kernel_time_s": lane.kernel_time_s,
            "outside_steps_s": lane.outside_steps_s, "outside_steps_kernels": lane.outside_steps_kernels,
            "streams": [{"stream": s.stream, "kernel_time_s": s.kernel_time_s, "kernels": s.kernels,
                         "communication_s": s.communication_s} for s in lane.streams],
            "stages": [stage_json(s) for s in lane.stages], "notes": list(lane.notes)}


def comparison_json(lane: LaneMeasure, comparisons: Sequence[StageComparison]) -> dict[str, Any]:
    data = lane_json(lane)
    data["comparisons"] = [
        {"stage": c.stage, "measured_stage": c.measured.stage, "measured_step_s": c.measured_step_s,
         "predicted_step_s": c.predicted_step_s, "step_error": c.step_error, "measured_layers": c.measured_layers,
         "predicted_layers": c.predicted_layers, "notes": list(c.notes),
         "modules": [{"module": r.module, "measured_s": r.measured_s, "predicted_s": r.predicted_s, "gap_s": r.gap_s,
                      "error": r.error, "measured_per_layer_s": r.measured_per_layer_s,
                      "predicted_per_layer_s": r.predicted_per_layer_s, "per_layer_error": r.per_layer_error,
                      "measured_exposed_s": r.measured_exposed_s, "measured_hidden_s": r.measured_hidden_s}
                     for r in c.modules]}
        for c in comparisons]
    return data


def bench_json(source: str, config: str, comparisons: Sequence[BenchComparison]) -> dict[str, Any]:
    return {"bench_result": source, "config": config, "results": [
        {"line": c.record.line, "kind": c.record.kind, "label": c.record.label, "batch_size": c.record.batch_size,
         "input_len": c.record.input_len, "output_len": c.record.output_len,
         "simulated_prefill_tokens_per_gpu": c.workload.prefill_tokens_per_gpu,
         "simulated_decode_batch_per_gpu": c.workload.decode_batch_per_gpu,
         "metrics": [{"metric": m.metric, "unit": m.unit, "measured": m.measured, "predicted": m.predicted,
                      "error": m.error} for m in c.metrics],
         "notes": list(c.notes)} for c in comparisons]}
