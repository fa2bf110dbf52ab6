"""Breakdown: where a step's time goes, module by module, coloured by what bounds each module.

Main run (`python -m infersim --format json`): one panel per stage (prefill, decode), each a
stacked column whose segments are the module categories' kernel times over the whole step
(`module_totals_us`, the same numbers as the text report's `step (ms)` column), largest at the
bottom. A segment's colour is the bound holding most of that module's time (compute, memory, comm,
overhead), the rule of the text report's `bound` column. Without two-batch overlap the column's
height is the step time (TTFT / decode step); with overlap the kernels add up to more than the
step, and a dashed line marks the step time. The title gives TTFT, TPOT and both throughputs.

Sweep (`infersim sweep --out X.json|.csv`): a sweep's rows carry one number per metric and the
step's dominant bound, not module times, so the sweep "breakdown" draws the metric only: one bar
per swept configuration (TPOT, and TTFT when the sweep simulated prefill), coloured by the bound
that dominates that configuration's decode step. The module split of one configuration is the
main run's breakdown: run it with that configuration's `--set` values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.plot.backend import BOUND_COLOURS, Drawing, pyplot
from infersim.plot.common import number, spread_labels
from infersim.base.units import MS, US

STAGES = ("prefill", "decode")

#: sweep rows name the decode bound as a constraint ("memory bandwidth"); the figures use the bound names
SWEEP_BOUNDS = {"compute": "compute", "memory bandwidth": "memory", "memory": "memory",
                "communication": "comm", "comm": "comm", "overhead": "overhead"}

#: a sweep row whose bound is missing or none the figures name: its own colour, said in the legend
#: (not the overhead grey, which would say the row is overhead-bound)
UNRECORDED_BOUND = "unrecorded"
SWEEP_COLOURS = {**BOUND_COLOURS, UNRECORDED_BOUND: "#d9d9d9"}

#: a sweep breakdown draws at most this many configurations (one bar each), so labels stay legible
MAX_SWEEP_BARS = 40


@dataclass(frozen=True)
class ModuleSegment:
    module: str
    time_s: float  # kernel time over the whole step
    bound: str  # the bound holding most of the module's time


def module_segments(stage: Mapping[str, Any]) -> list[ModuleSegment]:
    """One segment per module category with time > 0, largest first, from a stage's operations."""
    operations = stage.get("modules")
    if not isinstance(operations, list):
        raise InferSimError("breakdown: the stage has no 'modules' list (is this `infersim --format json` output?)")
    time_by_module: dict[str, float] = {}
    time_by_bound: dict[str, dict[str, float]] = {}
    for op in operations:
        seconds = (number(op.get("time_us")) or 0.0) * US
        module = str(op.get("module", "?"))
        time_by_module[module] = time_by_module.get(module, 0.0) + seconds
        bounds = time_by_bound.setdefault(module, {})
        bound = str(op.get("bound", "overhead"))
        bounds[bound] = bounds.get(bound, 0.0) + seconds
    segments = [ModuleSegment(m, t, max(time_by_bound[m], key=time_by_bound[m].__getitem__))
                for m, t in time_by_module.items() if t > 0]
    # ties broken by name so the picture does not depend on operation order
    return sorted(segments, key=lambda s: (-s.time_s, s.module))


def stage_step_time_s(stage_name: str, stage: Mapping[str, Any]) -> float:
    """The prefill step for prefill, the whole decode step (draft + verification under speculation) for decode."""
    key = "step_time_ms"
    value = number(stage.get(key))
    if value is None and stage_name == "prefill":
        value = number(stage.get("ttft_ms"))  # a result saved before the prefill step had its own key
    if value is None and stage_name == "decode":
        value = number(stage.get("tpot_ms"))
    if value is None:
        raise InferSimError(f"breakdown: {stage_name} has no {key}")
    return value * MS


def breakdown_title(data: Mapping[str, Any]) -> str:
    prefill, decode = data["prefill"], data["decode"]
    head = f"{data.get('model', '?')} on {data.get('hardware', '?')}"
    workload = data.get("workload") or {}
    if workload.get("isl") is not None:
        head += f", ISL {workload['isl']} / OSL {workload.get('osl', '?')}"
    step = prefill.get("step_time_ms", prefill.get("ttft_ms"))
    single = prefill.get("single_request_ttft_ms")
    ttft = f", one request's TTFT {single:,.1f} ms" if single is not None else ""
    return (f"{head}\nprefill step {step:,.1f} ms ({prefill['tgs']:,.0f} tokens/GPU/s{ttft})   "
            f"TPOT {decode['tpot_ms']:,.2f} ms ({decode['tgs']:,.0f} tokens/GPU/s decode)")


def _bound_legend(figure: Any, bounds: Sequence[str],
                  title: str = "colour: what bounds the module (most of its time)", extra: Sequence[Any] = ()) -> None:
    """One legend for the figure, below the panels, so it never covers a bar or a label."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=SWEEP_COLOURS[b], edgecolor="white",
                     label="bound not recorded" if b == UNRECORDED_BOUND else f"{b}-bound")
               for b in SWEEP_COLOURS if b in bounds] + list(extra)
    figure.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
                  title=title, title_fontsize=8)


def draw_breakdown(data: Mapping[str, Any]) -> Drawing:
    """Main-run breakdown (see the module doc). Drawn data: per stage, the segments in ms."""
    for name in STAGES:
        if not isinstance(data.get(name), Mapping):
            raise InferSimError(f"breakdown: no '{name}' stage in the data (is this `infersim --format json` output?)")
    plt = pyplot("the breakdown picture")
    figure, axes = plt.subplots(1, 2, figsize=(11, 6.2))
    drawn: dict[str, Any] = {"kind": "breakdown", "stages": {}}
    all_bounds: set[str] = set()
    for ax, name in zip(axes, STAGES):
        stage = data[name]
        segments = module_segments(stage)
        step_s = stage_step_time_s(name, stage)
        total_s = sum(s.time_s for s in segments)
        bottom_ms = 0.0
        records = []
        for seg in segments:
            height_ms = seg.time_s / MS
            colour = BOUND_COLOURS.get(seg.bound, BOUND_COLOURS["overhead"])
            ax.bar(0, height_ms, width=0.5, bottom=bottom_ms, color=colour, edgecolor="white", linewidth=0.8,
                   label=seg.module)
            records.append({"module": seg.module, "time_ms": height_ms, "bottom_ms": bottom_ms, "bound": seg.bound,
                            "share": seg.time_s / total_s if total_s else 0.0})
            bottom_ms += height_ms
            all_bounds.add(seg.bound)
        total_ms = total_s / MS
        # labels beside the column at their segment's centre, pushed apart where segments are thin
        label_gap = 0.058 * max(total_ms, step_s / MS)
        centres = [r["bottom_ms"] + r["time_ms"] / 2 for r in records]
        label_y = spread_labels(centres, label_gap, 0.0, max(total_ms, step_s / MS) * 1.0)
        for r, centre, y in zip(records, centres, label_y):
            ax.annotate(f"{r['module']}  {r['time_ms']:,.2f} ms ({100 * r['share']:.1f}%)", xy=(0.25, centre),
                        xytext=(0.42, y), textcoords="data", va="center", fontsize=8,
                        arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.6,
                                    "shrinkA": 0, "shrinkB": 0})
        overlap_note = ""
        # with two-batch overlap the step differs from the kernels' sum (shorter where communication
        # hides, longer where SMs held by communication slow compute): mark where the step ends
        if (stage.get("micro_batches") or 1) > 1 and abs(step_s - total_s) > 1e-3 * total_s:
            ax.hlines(step_s / MS, -0.35, 0.35, colors="black", linestyles="--", linewidth=1.2)
            ax.annotate(f"step {step_s / MS:,.2f} ms", xy=(-0.35, step_s / MS), xytext=(0, 3),
                        textcoords="offset points", fontsize=8,
                        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
            overlap_note = f"\ntwo-batch overlap: kernels sum to {total_ms:,.2f} ms (step dashed)"
        label = "prefill step (TTFT)" if name == "prefill" else "decode step"
        ax.set_title(f"{label}: {step_s / MS:,.2f} ms, bound by {stage.get('bound', '?')}{overlap_note}", fontsize=9)
        ax.set_xlim(-0.45, 2.1)
        ax.set_ylim(0, max(total_ms, step_s / MS) * 1.04)
        ax.set_xticks([])
        ax.set_ylabel(f"{name} kernel time per step (ms)")
        ax.spines[["top", "right"]].set_visible(False)
        drawn["stages"][name] = {"step_time_ms": step_s / MS, "kernel_time_ms": total_ms, "segments": records}
    _bound_legend(figure, sorted(all_bounds))
    figure.suptitle(breakdown_title(data), fontsize=10)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    return Drawing(figure, drawn)


# ---------------------------------------------------------------------------------------------
# Sweeps


def configuration_label(row: Mapping[str, Any], axes: Sequence[str]) -> str:
    """Short text for one swept configuration: its grid values by the last part of the field name."""
    parts = [f"{axis.rsplit('.', 1)[-1]}={row.get(axis)}" for axis in axes]
    return ", ".join(parts) or "base"


def draw_sweep_breakdown(data: Mapping[str, Any]) -> Drawing:
    """Sweep "breakdown": the metric per configuration, coloured by its decode bound (module doc).
    A configuration that does not fit in memory is hatched and counted in the legend: its TPOT is
    no speed that can happen. A row without the metric gets no bar and says so."""
    from infersim.plot.sweep import fits, sweep_axes, sweep_rows

    rows = [r for r in sweep_rows(data) if r.get("status", "ok") == "ok" and number(r.get("tpot_ms")) is not None]
    if not rows:
        raise InferSimError("breakdown: the sweep has no simulated rows to draw")
    axes_names = sweep_axes(data, rows)
    shown = rows[:MAX_SWEEP_BARS]
    metrics = [m for m in ("tpot_ms", "ttft_ms") if any(number(r.get(m)) is not None for r in shown)]
    plt = pyplot("the sweep breakdown picture")
    figure, axes = plt.subplots(len(metrics), 1, figsize=(max(7.0, 0.32 * len(shown) + 3), 3.2 * len(metrics) + 1.6),
                                squeeze=False)
    labels = [configuration_label(r, axes_names) for r in shown]
    bounds = [SWEEP_BOUNDS.get(str(r.get("bound")), UNRECORDED_BOUND) for r in shown]
    fit = [fits(r) for r in shown]
    drawn: dict[str, Any] = {"kind": "breakdown", "source": "sweep", "labels": labels, "metrics": {},
                             "bounds": bounds, "fits": fit, "rows_in_sweep": len(rows)}
    for ax, metric in zip(axes[:, 0], metrics):
        drawn["metrics"][metric] = _sweep_bars(ax, shown, metric, bounds, fit)
        ax.set_ylabel("TPOT (ms)" if metric == "tpot_ms" else "TTFT (ms)")
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(labels if ax is axes[-1, 0] else [], rotation=60, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    unfit = fit.count(False)
    extra = []
    if unfit:
        from matplotlib.patches import Patch

        extra.append(Patch(facecolor="white", edgecolor="#555555", hatch="///",
                           label=f"does not fit in memory ({unfit} of {len(shown)}): no speed that can happen"))
    _bound_legend(figure, sorted(set(bounds)), "colour: what bounds the configuration's decode step", extra)
    more = f" (first {len(shown)} of {len(rows)})" if len(rows) > len(shown) else ""
    config = Path(str(data.get("config") or data.get("source_file") or "?")).name
    figure.suptitle(f"sweep of {config}: one bar per configuration{more}", fontsize=9)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return Drawing(figure, drawn)


def _sweep_bars(ax: Any, rows: Sequence[Mapping[str, Any]], metric: str, bounds: Sequence[str],
                fit: Sequence[bool]) -> list[float | None]:
    """One bar per row of `metric` (None where the row has none: no bar, a 'no value' mark)."""
    values = [number(r.get(metric)) for r in rows]
    bars = ax.bar(range(len(rows)), [v if v is not None else 0.0 for v in values],
                  color=[SWEEP_COLOURS[b] for b in bounds], edgecolor="white")
    for i, (bar, value, fits_) in enumerate(zip(bars, values, fit)):
        if not fits_:
            bar.set_hatch("///")
            bar.set_alpha(0.5)
        if value is None:
            ax.annotate("no value", (i, 0), ha="center", va="bottom", rotation=90, fontsize=6)
    return values
