"""Predicted vs measured: `compare` results as side-by-side bars, `validate` results as a scatter.

`compare --trace ... --config ... --format json` (infersim/trace/report.py `comparison_json`):
one panel per compared stage of the first lane (rank) that has comparisons: per module, the
measured and predicted time per step (ms) side by side, largest first, with the error of each.
Without `--config` the JSON holds only the measured breakdown; then the measured bars are drawn.

`compare --bench-result ... --format json` (`bench_json`): one panel per metric (TTFT, TPOT,
throughputs), one pair of bars (measured, predicted) per benchmark line. Times are drawn in ms.

`validate` JSON: log-log scatters of measured against predicted, one panel per unit (like compared
with like), one point per case, coloured by the case's `source`, with the y = x line and the +-15%
band; cases outside the band get a number, listed with their error under the panels, where the
legend is too (outside the data).
The reader is tolerant, so the validation report of any tool can be drawn:
- the cases: the list under `points`, else `cases`, else `results`;
- measured: `measured`, else `actual`, `measured_tgs`, `actual_tgs`; predicted: `predicted`, else
  `predicted_tgs` (cases without both as positive numbers are skipped and counted);
- name: `id`, else `name`, `case`, `label`; colour group: `source` (else "unknown");
- error: `error_pct` (percent), else `error` (a fraction), else computed as predicted / measured - 1;
- `unit` (optional): when every case shares one, the axes name it.
`benchmarks/validate_published.py --format json` output reads as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.plot.backend import Drawing, pyplot
from infersim.plot.common import first_number, number, place_point_labels, plain_log_ticks, plain_number
from infersim.base.units import MS

#: the band a prediction should fall in (the project's accuracy target)
TOLERANCE = 0.15

MEASURED_COLOUR = "#4c72b0"
PREDICTED_COLOUR = "#dd8452"


def comparison_lane(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The lane the picture shows: the first with comparisons, else the first."""
    lanes = data.get("lanes")
    if not isinstance(lanes, list) or not lanes:
        raise InferSimError("compare: no 'lanes' in the data (is this `infersim compare --format json` output?)")
    return next((lane for lane in lanes if lane.get("comparisons")), lanes[0])


def module_pairs(comparison: Mapping[str, Any]) -> list[dict[str, Any]]:
    """(module, measured ms, predicted ms, error) of one stage comparison, largest first (pure)."""
    rows = []
    for m in comparison.get("modules") or []:
        measured = number(m.get("measured_s")) or 0.0
        predicted = number(m.get("predicted_s")) or 0.0
        rows.append({"module": str(m.get("module", "?")), "measured_ms": measured / MS, "predicted_ms": predicted / MS,
                     "error": number(m.get("error"))})
    return sorted(rows, key=lambda r: -max(r["measured_ms"], r["predicted_ms"]))


def _paired_bars(ax: Any, labels: Sequence[str], measured: Sequence[float | None],
                 predicted: Sequence[float | None], unit: str) -> None:
    import numpy as np

    y = np.arange(len(labels))
    height = 0.38
    ax.barh(y - height / 2, [m or 0.0 for m in measured], height, color=MEASURED_COLOUR, label="measured")
    ax.barh(y + height / 2, [p or 0.0 for p in predicted], height, color=PREDICTED_COLOUR, label="predicted")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()  # largest first, at the top
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


def draw_trace_compare(data: Mapping[str, Any]) -> Drawing:
    lane = comparison_lane(data)
    comparisons = lane.get("comparisons") or []
    plt = pyplot("the compare picture")
    drawn: dict[str, Any] = {"kind": "compare", "source": "trace", "lane": lane.get("path"), "rank": lane.get("rank"),
                             "stages": {}}
    if comparisons:
        panels = comparisons
    else:
        panels = [s for s in lane.get("stages") or [] if s.get("modules")]
        if not panels:
            raise InferSimError("compare: the trace lane has no measured modules to draw")
    figure, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 0.42 * max(
        len(p.get("modules") or []) for p in panels) + 2.6), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        stage = str(panel.get("stage", "?"))
        if comparisons:
            rows = module_pairs(panel)
            _paired_bars(ax, [r["module"] for r in rows], [r["measured_ms"] for r in rows],
                         [r["predicted_ms"] for r in rows], "time per step (ms)")
            for k, r in enumerate(rows):
                if r["error"] is not None:
                    ax.annotate(f"{100 * r['error']:+.0f}%", xy=(max(r["measured_ms"], r["predicted_ms"]), k),
                                xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
            step_error = number(panel.get("step_error"))
            measured_step = number(panel.get("measured_step_s"))
            predicted_step = number(panel.get("predicted_step_s"))
            title = f"{stage}: step measured {measured_step / MS:,.2f} ms, predicted {predicted_step / MS:,.2f} ms" \
                if measured_step is not None and predicted_step is not None else stage
            if step_error is not None:
                title += f" ({100 * step_error:+.1f}%)"
            ax.set_title(title, fontsize=9)
            ax.margins(x=0.12)
            drawn["stages"][stage] = rows
        else:
            modules = sorted(panel["modules"], key=lambda m: -(number(m.get("time_s")) or 0.0))
            rows = [{"module": str(m.get("module")), "measured_ms": (number(m.get("time_s")) or 0.0) / MS,
                     "predicted_ms": None, "error": None} for m in modules]
            _paired_bars(ax, [r["module"] for r in rows], [r["measured_ms"] for r in rows], [None] * len(rows),
                         "time per step (ms)")
            ax.set_title(f"{stage}: measured only (run compare with --config for the prediction)", fontsize=9)
            drawn["stages"][stage] = rows
    axes[0][-1].legend(fontsize=8, loc="lower right")
    rank = f", rank {lane.get('rank')}" if lane.get("rank") is not None else ""
    figure.suptitle(f"measured vs predicted per module: {lane.get('path', '?')}{rank}", fontsize=9)
    figure.tight_layout()
    return Drawing(figure, drawn)


_STATISTICS = ("mean", "median", "p50", "p90", "p95", "p99")


def _panel_of(metric: str, unit: str) -> tuple[tuple[str, str], str]:
    """((panel title, unit), bar label) of a metric: the statistics of one quantity ("mean TTFT",
    "p99 TTFT") share a panel, one bar pair each; any other metric is a panel of its own."""
    head, _, rest = metric.partition(" ")
    if head in _STATISTICS and rest:
        return (rest, unit), head
    return (metric, unit), ""


def draw_bench_compare(data: Mapping[str, Any]) -> Drawing:
    """One panel per quantity (TTFT, TPOT, ..., throughput): a measured and a predicted bar per
    statistic (mean, median, p99) and benchmark line, each with its error."""
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise InferSimError("compare: no 'results' in the bench comparison")
    panels: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (title, unit) -> [(metric, statistic)]
    for r in results:
        for m in r.get("metrics") or []:
            metric, unit = str(m.get("metric")), str(m.get("unit", ""))
            panel, statistic = _panel_of(metric, unit)
            if (metric, statistic) not in panels.setdefault(panel, []):
                panels[panel].append((metric, statistic))
    if not panels:
        raise InferSimError("compare: the bench results compare no metric")
    plt = pyplot("the compare picture")
    line_labels = [str(r.get("label") or f"line {r.get('line', k + 1)}") for k, r in enumerate(results)]
    bars = max(len(entries) for entries in panels.values()) * len(results)
    columns = min(2, len(panels))  # two panels a row keeps the figure a readable width
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.4 * columns + 1.4, (0.42 * bars + 1.6) * rows + 1.0),
                                squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_axis_off()
    drawn: dict[str, Any] = {"kind": "compare", "source": "bench", "labels": line_labels, "metrics": {}}
    from matplotlib.ticker import MaxNLocator

    for ax, ((title, unit), entries) in zip(axes.flat, panels.items()):
        scale, shown_unit = (1 / MS, "ms") if unit == "s" else (1.0, unit)
        labels, measured, predicted, errors = [], [], [], []
        for metric, statistic in entries:
            for r, line_label in zip(results, line_labels):
                m = next((m for m in r.get("metrics") or [] if m.get("metric") == metric), None)
                if m is None:
                    continue
                mv, pv = number(m.get("measured")), number(m.get("predicted"))
                measured.append(mv * scale if mv is not None else None)
                predicted.append(pv * scale if pv is not None else None)
                errors.append(number(m.get("error")))
                labels.append(", ".join(part for part in (statistic, line_label if len(results) > 1 else "") if part)
                              or line_label)
                drawn["metrics"].setdefault(metric, {"unit": shown_unit, "measured": [], "predicted": []})
                drawn["metrics"][metric]["measured"].append(measured[-1])
                drawn["metrics"][metric]["predicted"].append(predicted[-1])
        _paired_bars(ax, labels, measured, predicted, shown_unit)
        for k, error in enumerate(errors):
            if error is not None:
                ax.annotate(f"{100 * error:+.0f}%", xy=(max(measured[k] or 0.0, predicted[k] or 0.0), k),
                            xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
        ax.margins(x=0.14)  # room for the error beside the longest bar
        ax.xaxis.set_major_locator(MaxNLocator(5))  # large throughputs: few ticks so their labels do not touch
        ax.set_title(title, fontsize=9)
    title = f"benchmark vs prediction: {Path(str(data.get('bench_result', '?'))).name}"
    if data.get("config"):
        title += f" with {Path(str(data['config'])).name}"
    runs = sorted({str(r["predicted_run"]) for r in results if r.get("predicted_run")})
    if runs:
        title += "\npredicted: " + "; ".join(runs)
    height = figure.get_figheight()
    title_in = 0.2 + 0.17 * (title.count("\n") + 1)
    figure.suptitle(title, fontsize=9, y=1 - 0.1 / height, va="top")
    # the legend under the title, outside every panel
    figure.legend(*axes.flat[0].get_legend_handles_labels(), loc="center", ncol=2, fontsize=8, frameon=False,
                  bbox_to_anchor=(0.5, 1 - (title_in + 0.08) / height))
    figure.tight_layout(rect=(0, 0, 1, 1 - (title_in + 0.18) / height))
    return Drawing(figure, drawn)


def draw_compare(data: Mapping[str, Any]) -> Drawing:
    """`compare` JSON of either kind: a trace comparison (lanes) or a bench comparison (results)."""
    if "lanes" in data:
        return draw_trace_compare(data)
    if "results" in data:
        return draw_bench_compare(data)
    raise InferSimError("compare: expected 'lanes' (compare --trace) or 'results' (compare --bench-result)")


# ---------------------------------------------------------------------------------------------
# Validation


def validation_cases(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The drawable cases (pure) and how many were skipped (see the module doc for the fields read)."""
    items = next((data[k] for k in ("points", "cases", "results") if isinstance(data.get(k), list)), None)
    if not items:
        raise InferSimError("validate: expected a list of cases under 'points' (or 'cases')")
    cases, skipped = [], 0
    for k, item in enumerate(items):
        if not isinstance(item, Mapping):
            skipped += 1
            continue
        measured = first_number(item, ("measured", "actual", "measured_tgs", "actual_tgs"))
        predicted = first_number(item, ("predicted", "predicted_tgs"))
        if measured is None or predicted is None or measured <= 0 or predicted <= 0:
            skipped += 1
            continue
        error_pct = number(item.get("error_pct"))
        if error_pct is None:
            fraction = number(item.get("error"))
            error_pct = 100 * fraction if fraction is not None else 100 * (predicted / measured - 1)
        name = next((str(item[key]) for key in ("id", "name", "case", "label") if item.get(key) is not None),
                    f"case {k + 1}")
        cases.append({"id": name, "source": str(item.get("source") or "unknown"), "measured": measured,
                      "predicted": predicted, "error_pct": error_pct, "unit": item.get("unit"),
                      "outlier": abs(error_pct) > 100 * TOLERANCE,
                      # listed and drawn, out of the statistics (validate's accepted outliers of their own runs)
                      "excluded": bool(item.get("accepted_outlier"))})
    if not cases:
        raise InferSimError(f"validate: none of the {len(items)} cases has positive measured and predicted values")
    return cases, skipped


#: units that name the same quantity, written differently by different reference files
_UNIT_ALIASES = {"tok/s (per GPU)": "tok/s/GPU", "tok/s per GPU": "tok/s/GPU", "tokens/s/GPU": "tok/s/GPU"}


def unit_panels(cases: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Case indices by unit (a scatter of measured against predicted compares like with like),
    the unit with the most cases first; cases without a unit share one panel."""
    panels: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        unit = str(case.get("unit") or "")
        panels.setdefault(_UNIT_ALIASES.get(unit, unit), []).append(i)
    return dict(sorted(panels.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def draw_validate(data: Mapping[str, Any]) -> Drawing:
    """One log-log panel per unit: measured against predicted, coloured by source, the +-15% band;
    points outside the band get a number, and the list under the panels names them. The legend
    and the list sit outside the data."""
    cases, skipped = validation_cases(data)
    plt = pyplot("the validation picture")
    import numpy as np
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    panels = unit_panels(cases)
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    outliers = [i for i, c in enumerate(cases) if c["outlier"]]
    tag = {i: n + 1 for n, i in enumerate(sorted(outliers, key=lambda i: -abs(cases[i]["error_pct"])))}
    key_rows = -(-len(outliers) // 2) if outliers else 0  # the outlier list, two columns
    # heights in inches, from the bottom: the outlier list, the legend, the panels (with their tick
    # labels and axis names below them), the title
    panel_in, key_in = 3.5, 0.115
    key_h = key_in * key_rows + (0.25 if key_rows else 0.0)
    legend_h = 0.45
    figure = plt.figure(figsize=(3.9 * columns + 0.6, panel_in * rows + 0.75 + 0.75 + legend_h + key_h))
    height = figure.get_figheight()
    top = 1 - 0.75 / height
    bottom = (key_h + legend_h + 0.75) / height
    grid = figure.add_gridspec(rows, columns, top=top, bottom=bottom, left=0.09, right=0.98, hspace=0.42, wspace=0.32)
    sources = sorted({c["source"] for c in cases})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {source: colours[k % len(colours)] for k, source in enumerate(sources)}
    drawn_sources: dict[str, list[int]] = {source: [i for i, c in enumerate(cases) if c["source"] == source]
                                           for source in sources}
    drawn_panels = {}
    for k, (unit, idx) in enumerate(panels.items()):
        ax = figure.add_subplot(grid[k // columns, k % columns])
        values = [cases[i][key] for i in idx for key in ("measured", "predicted")]
        low, high = min(values), max(values)
        pad = max(1.25, (high / low) ** 0.08)
        low, high = low / pad, high * pad
        line = np.array([low, high])
        ax.fill_between(line, line * (1 - TOLERANCE), line * (1 + TOLERANCE), color="#cccccc", alpha=0.6,
                        label=f"within ±{100 * TOLERANCE:.0f}%")
        ax.plot(line, line, color="black", linewidth=0.8, label="predicted = measured")
        for source in sources:
            mine = [i for i in idx if cases[i]["source"] == source]
            if mine:
                ax.scatter([cases[i]["measured"] for i in mine], [cases[i]["predicted"] for i in mine], s=26,
                           color=colour[source], edgecolors="black", linewidths=0.4, zorder=3, label=source)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal")
        ticks = plain_log_ticks(low, high)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(FixedLocator(ticks))
            axis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))
            axis.set_minor_locator(NullLocator())
            axis.set_minor_formatter(NullFormatter())
        ax.tick_params(labelsize=7)
        for label in ax.get_xticklabels():
            label.set_rotation(30)
            label.set_horizontalalignment("right")
        ax.grid(True, which="major", alpha=0.3)
        shown = unit or "each case in its own unit"
        ax.set_xlabel(f"measured ({shown})", fontsize=8)
        ax.set_ylabel(f"predicted ({shown})", fontsize=8)
        within = sum(1 for i in idx if not cases[i]["outlier"])
        ax.set_title(f"{unit or 'no unit'}: {len(idx)} case{'s' if len(idx) > 1 else ''}, {within} within "
                     f"±{100 * TOLERANCE:.0f}%", fontsize=8.5)
        drawn_panels[unit] = idx
        # a number beside each point outside the band (the list below names it), placed clear of the
        # other numbers and points and inside the panel
        tagged = [(cases[i]["measured"], cases[i]["predicted"], str(tag[i])) for i in idx if i in tag]
        place_point_labels(ax, tagged, fontsize=6.5, avoid_points=[(cases[i]["measured"], cases[i]["predicted"])
                                                                   for i in idx],
                           marker_radius_px=3.5, inside=True, required=len(tagged))
    handles = [Patch(facecolor="#cccccc", alpha=0.6, label=f"within ±{100 * TOLERANCE:.0f}%"),
               plt.Line2D([], [], color="black", linewidth=0.8, label="predicted = measured")]
    handles += [plt.Line2D([], [], linestyle="none", marker="o", markersize=5, markerfacecolor=colour[s],
                           markeredgecolor="black", markeredgewidth=0.4, label=s) for s in sources]
    legend_y = (key_h + legend_h / 2) / height
    figure.legend(handles=handles, loc="center", bbox_to_anchor=(0.5, legend_y), ncol=min(len(handles), 6),
                  fontsize=7.5, title="source", title_fontsize=7.5, frameon=False)
    if outliers:
        ordered = sorted(outliers, key=lambda i: tag[i])
        half = -(-len(ordered) // 2)
        for column, chunk in enumerate((ordered[:half], ordered[half:])):
            text = "\n".join(f"{tag[i]:>2}  {cases[i]['id']}  {cases[i]['error_pct']:+.0f}%"
                             + ("  (excluded)" if cases[i]["excluded"] else "") for i in chunk)
            figure.text(0.04 + 0.5 * column, (key_h - 0.05) / height, text,
                        fontsize=6.5, family="monospace", va="top", ha="left")
    counted = [c for c in cases if not c["excluded"]] or cases
    errors = [abs(c["error_pct"]) for c in counted]
    within = sum(1 for c in counted if not c["outlier"])
    excluded = len(cases) - len(counted)
    title = (f"predicted vs measured: {len(counted)} cases, median |error| {float(np.median(errors)):.1f}%, "
             f"mean {sum(errors) / len(errors):.1f}%, {within}/{len(counted)} within ±{100 * TOLERANCE:.0f}%"
             + (f" ({excluded} accepted outlier{'s' if excluded > 1 else ''} drawn, not counted)" if excluded else "")
             + (f"; numbered: outside ±{100 * TOLERANCE:.0f}%, listed below" if outliers else ""))
    if skipped:
        title += f"\n({skipped} cases without positive measured and predicted values not drawn)"
    import textwrap

    per_line = int(figure.get_figwidth() * 72 / (0.6 * 9))  # a generous average glyph width at 9 points
    title = "\n".join(textwrap.fill(part, per_line, break_long_words=False, break_on_hyphens=False)
                      for part in title.split("\n"))
    figure.suptitle(title, fontsize=9, y=1 - 0.12 / height, va="top")
    return Drawing(figure, {"kind": "validate", "cases": cases, "skipped": skipped, "sources": drawn_sources,
                            "panels": drawn_panels, "outliers": [cases[i]["id"] for i in sorted(outliers, key=tag.get)],
                            "tolerance": TOLERANCE})
