"""Roofline: the hardware card's ceilings and every module of a stage at its intensity and achieved rate.

Axes (log-log): arithmetic intensity in FLOP per byte of HBM traffic, and FLOP/s.

Ceilings, from `hardware_peaks` in the run's JSON (the card's `peak` and `derates`):
- solid lines: the datasheet roofs, min(peak.flops[format], peak.hbm_bandwidth x intensity), one per
  tensor-core format (formats with the same peak share a line, e.g. bf16/fp16);
- dashed lines: the derated roofs the roofline fallback times kernels with,
  min(peak.flops[format] x derates.compute_efficiency[format],
      peak.hbm_bandwidth x derates.memory_efficiency x intensity);
- dotted line: attention kernels' compute roof, bf16 peak x derates.attention_compute_efficiency.
The ridge point (where the memory slope meets the compute roof) of the run's GEMM format is
marked: filled for the datasheet roofs, hollow for the derated ones.

Points: each module category of a stage, with the FLOPs, bytes and kernel time of its operations
summed over the step: intensity = FLOPs / bytes, achieved = FLOPs / time (the time includes kernel
launch overhead, and comes from a measured table where one covers the kernel). Modules that do no
FLOPs (norms, rotary, KV writes, the scheduler) cannot sit on a log axis, and communication modules
move bytes over links, not HBM; both are listed under the plot instead of drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from infersim.base.errors import InferSimError
from infersim.plot.backend import BOUND_COLOURS, Drawing, pyplot
from infersim.plot.common import number, place_point_labels, si_format
from infersim.base.units import US

STAGE_MARKERS = {"prefill": "o", "decode": "^"}
CEILING_COLOURS = ("#222222", "#8c564b", "#9467bd", "#e377c2", "#17becf")


def hardware_peaks(data: Mapping[str, Any]) -> dict[str, Any]:
    peaks = data.get("hardware_peaks")
    if not isinstance(peaks, Mapping) or not isinstance(peaks.get("flops"), Mapping) or \
            number(peaks.get("hbm_bandwidth")) is None:
        raise InferSimError("roofline: the data has no 'hardware_peaks' (written by `infersim --format json` "
                            "since the roofline picture was added); rerun the simulation, or use "
                            "`infersim roofline --config X.yaml`")
    return dict(peaks)


def module_points(stage_name: str, stage: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Roofline points of a stage's modules (pure) and the modules left out, with why."""
    totals: dict[str, dict[str, float]] = {}
    comm: set[str] = set()
    for op in stage.get("modules") or []:
        module = str(op.get("module", "?"))
        t = totals.setdefault(module, {"flops": 0.0, "bytes": 0.0, "time_s": 0.0})
        t["flops"] += number(op.get("flops")) or 0.0
        t["bytes"] += number(op.get("bytes")) or 0.0
        t["time_s"] += (number(op.get("time_us")) or 0.0) * US
        if op.get("bound") == "comm":
            comm.add(module)
    points, left_out = [], []
    for module, t in totals.items():
        if module in comm:
            left_out.append(f"{module} (communication)")
        elif t["flops"] <= 0 or t["bytes"] <= 0 or t["time_s"] <= 0:
            left_out.append(f"{module} (no FLOPs)" if t["flops"] <= 0 else f"{module} (no HBM bytes)")
        else:
            points.append({"stage": stage_name, "module": module, "flops": t["flops"], "bytes": t["bytes"],
                           "time_s": t["time_s"], "intensity": t["flops"] / t["bytes"],
                           "achieved_flops_per_s": t["flops"] / t["time_s"]})
    return sorted(points, key=lambda p: -p["time_s"]), sorted(left_out)


def ceilings(peaks: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Compute roofs: datasheet per group of formats with equal peaks, and the derated ones (pure)."""
    groups: dict[float, list[str]] = {}
    for fmt, flops in peaks["flops"].items():
        groups.setdefault(float(flops), []).append(fmt)
    efficiency = peaks.get("compute_efficiency") or {}
    out = []
    for flops, formats in sorted(groups.items(), key=lambda kv: -kv[0]):
        name = "/".join(formats)
        out.append({"formats": formats, "label": name, "flops_per_s": flops, "derated": False})
        effs = {number(efficiency.get(f)) for f in formats} - {None}
        if len(effs) == 1:
            eff = effs.pop()
            out.append({"formats": formats, "label": f"{name} x {eff:g}", "flops_per_s": flops * eff,
                        "derated": True, "efficiency": eff})
    attention_eff = number(peaks.get("attention_compute_efficiency"))
    bf16 = number(peaks["flops"].get("bf16"))
    if attention_eff and bf16:
        out.append({"formats": ["bf16"], "label": f"attention: bf16 x {attention_eff:g}",
                    "flops_per_s": bf16 * attention_eff, "derated": True, "efficiency": attention_eff,
                    "attention": True})
    return out


def draw_roofline(data: Mapping[str, Any], stages: Sequence[str] = ("prefill", "decode")) -> Drawing:
    peaks = hardware_peaks(data)
    bandwidth = float(peaks["hbm_bandwidth"])
    memory_eff = number(peaks.get("memory_efficiency")) or 1.0
    roofs = ceilings(peaks)
    points: list[dict[str, Any]] = []
    left_out: dict[str, list[str]] = {}
    for name in stages:
        if not isinstance(data.get(name), Mapping):
            raise InferSimError(f"roofline: no '{name}' stage in the data")
        stage_points, skipped = module_points(name, data[name])
        points += stage_points
        left_out[name] = skipped
    gemm = str((data.get("deployment") or {}).get("precision", {}).get("gemm", "bf16"))
    gemm_peak = number(peaks["flops"].get(gemm)) or max(float(v) for v in peaks["flops"].values())
    gemm_eff = number((peaks.get("compute_efficiency") or {}).get(gemm)) or 1.0
    ridge = {"format": gemm, "intensity": gemm_peak / bandwidth, "flops_per_s": gemm_peak,
             "derated_intensity": gemm_peak * gemm_eff / (bandwidth * memory_eff),
             "derated_flops_per_s": gemm_peak * gemm_eff}

    plt = pyplot("the roofline picture")

    figure, ax = plt.subplots(figsize=(10, 6.4))
    ax.set_xscale("log")
    ax.set_yscale("log")
    intensities = [p["intensity"] for p in points] + [ridge["intensity"], ridge["derated_intensity"]]
    x_low = min(intensities) / 4
    x_high = max(intensities) * 8
    top = max(r["flops_per_s"] for r in roofs)
    # memory roofs: one slope each, up to the highest compute roof (the roofs below branch off it)
    for factor, style in ((1.0, "-"), (memory_eff, "--")):
        ax.plot([x_low, top / (bandwidth * factor)], [bandwidth * factor * x_low, top], linestyle=style,
                color="#222222", linewidth=1.6 if style == "-" else 1.1)
    datasheet = [r for r in roofs if not r["derated"]]
    colour_of = {r["label"]: CEILING_COLOURS[i % len(CEILING_COLOURS)] for i, r in enumerate(datasheet)}
    fixed_labels: list[Any] = []
    roof_labels: list[tuple[str, float, bool, str]] = []
    for roof in roofs:
        colour = "#ff7f0e" if roof.get("attention") else colour_of.get("/".join(roof["formats"]), "#444444")
        slope = bandwidth * (memory_eff if roof["derated"] else 1.0)
        knee = roof["flops_per_s"] / slope
        style = (":" if roof.get("attention") else "--") if roof["derated"] else "-"
        ax.plot([knee, x_high], [roof["flops_per_s"]] * 2, linestyle=style, color=colour,
                linewidth=1.1 if roof["derated"] else 1.6)
        if roof.get("attention"):
            continue  # named in the legend: a label on its line would print over the GEMM roof of its format
        roof_labels.append((f"{roof['label']}: {si_format(roof['flops_per_s'], 'FLOP/s')}", roof["flops_per_s"],
                            roof["derated"], colour))
    ax.plot([ridge["intensity"]], [ridge["flops_per_s"]], marker="o", color="black", markersize=7, zorder=4)
    ax.plot([ridge["derated_intensity"]], [ridge["derated_flops_per_s"]], marker="o", markerfacecolor="white",
            color="black", markersize=7, zorder=4)
    fixed_labels.append(ax.annotate(
        f"ridge ({gemm}): {ridge['intensity']:,.0f} FLOP/B\nderated (hollow): {ridge['derated_intensity']:,.0f} FLOP/B",
        xy=(ridge["intensity"], ridge["flops_per_s"]), xytext=(-10, 10), textcoords="offset points", ha="right",
        fontsize=7.5))
    for p in points:
        colour = BOUND_COLOURS.get(_bound_of(data[p["stage"]], p["module"]), "#444444")
        ax.scatter([p["intensity"]], [p["achieved_flops_per_s"]], marker=STAGE_MARKERS.get(p["stage"], "s"),
                   s=46, color=colour, edgecolors="black", linewidths=0.5, zorder=5)
    all_y = [p["achieved_flops_per_s"] for p in points] + [bandwidth * memory_eff * x_low]
    ax.set_xlim(x_low, x_high)
    ax.set_ylim(min(all_y) / 3, top * 2.5)
    _axes_text(ax, stages, roofs, points, data)
    footnote = _footnote(figure, left_out)
    figure.tight_layout(rect=(0, footnote, 1, 1))
    roof_notes = _roof_label_column(ax, roof_labels)
    figure.tight_layout(rect=(0, footnote, 1, 1))  # again: room for the roof labels right of the axes
    _spread_vertically(ax, roof_notes, sorted(merge_heights(roof_labels)), figure.canvas.get_renderer())
    fixed_labels += _memory_roof_labels(ax, bandwidth, memory_eff, x_low)
    lines = [line for line in ax.lines if len(line.get_xdata()) > 1]
    place_point_labels(ax, [(p["intensity"], p["achieved_flops_per_s"], f"{p['module']} ({p['stage']})")
                            for p in points], avoid=fixed_labels + roof_notes + list(ax.get_legend() and
                                                                                      [ax.get_legend()] or []),
                       avoid_points=[(ridge["intensity"], ridge["flops_per_s"]),
                                     (ridge["derated_intensity"], ridge["derated_flops_per_s"])],
                       required=len(points), avoid_lines=lines)
    drawn = {"kind": "roofline", "points": points, "ceilings": roofs, "hbm_bandwidth": bandwidth,
             "memory_efficiency": memory_eff, "ridge": ridge, "left_out": left_out,
             "roof_labels": [n.get_text() for n in roof_notes]}
    return Drawing(figure, drawn)


def _memory_roof_labels(ax: Any, bandwidth: float, memory_eff: float, x_low: float) -> list[Any]:
    """The memory roofs' names along their slopes (the angle on screen follows the final layout)."""
    slope_x = x_low * 1.6
    (x0, y0), (x1, y1) = ax.transData.transform([(slope_x, bandwidth * slope_x),
                                                  (slope_x * 2, bandwidth * slope_x * 2)])
    angle = math.degrees(math.atan2(y1 - y0, x1 - x0))
    return [ax.annotate(f"HBM {si_format(bandwidth, 'B/s')}", xy=(slope_x, bandwidth * slope_x), xytext=(0, 4),
                        textcoords="offset points", fontsize=7.5, color="#222222", rotation=angle,
                        rotation_mode="anchor"),
            ax.annotate(f"HBM x {memory_eff:g}", xy=(slope_x, bandwidth * memory_eff * slope_x), xytext=(0, -10),
                        textcoords="offset points", fontsize=7.5, color="#222222", rotation=angle,
                        rotation_mode="anchor")]


def _axes_text(ax: Any, stages: Sequence[str], roofs: Sequence[dict[str, Any]], points: Sequence[dict[str, Any]],
               data: Mapping[str, Any]) -> None:
    """Axis names, tick formats, grid, legend and title."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter, FuncFormatter

    from infersim.plot.common import plain_number

    ax.set_xlabel("arithmetic intensity (FLOP per byte of HBM traffic)")
    ax.set_ylabel("FLOP/s (achieved by the module; ceilings of the card)")
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s", places=0))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))  # 100 FLOP/B, not 10^2
    ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], color="#444444", linestyle="-", label="datasheet peak"),
               Line2D([], [], color="#444444", linestyle="--", label="derated (what the roofline fallback uses)")]
    handles += [Line2D([], [], color="#ff7f0e", linestyle=":",
                       label=f"attention roof: {r['label'].split(': ', 1)[1]} = "
                             f"{si_format(r['flops_per_s'], 'FLOP/s')}")
                for r in roofs if r.get("attention")]
    handles += [Line2D([], [], linestyle="", marker=STAGE_MARKERS[s], color="#999999", markeredgecolor="black",
                       label=f"{s} module") for s in stages]
    bounds = sorted({_bound_of(data[p["stage"]], p["module"]) for p in points})
    handles += [Line2D([], [], linestyle="", marker="s", color=BOUND_COLOURS[b], label=f"{b}-bound")
                for b in bounds if b in BOUND_COLOURS]
    ax.legend(handles=handles, loc="lower right", fontsize=7.5, framealpha=0.9)
    gemm = str((data.get("deployment") or {}).get("precision", {}).get("gemm", "bf16"))
    ax.set_title(f"Roofline: {data.get('model', '?')} on {data.get('hardware', '?')} (GEMM {gemm})", fontsize=10)


def _footnote(figure: Any, left_out: Mapping[str, Sequence[str]], fontsize: float = 7) -> float:
    """What is not drawn, under the axes, in lines that break between its entries (never inside a
    module's name or its reason); returns the share of the figure's height it takes."""
    entries = [f"{stage}: {item}" if i == 0 else item for stage, items in left_out.items()
               for i, item in enumerate(items)]
    if not entries:
        return 0.0
    width_pt = figure.get_figwidth() * 72 * 0.96
    per_line = max(20, int(width_pt / (0.6 * fontsize)))  # a generous average glyph width
    lines, line = [], "not drawn -"
    for entry in entries:
        piece = f" {entry};"
        if len(line) + len(piece) > per_line:
            lines.append(line)
            line = " " + entry + ";"
        else:
            line += piece
    lines.append(line.rstrip(";"))
    figure.text(0.01, 0.01, "\n".join(lines), fontsize=fontsize, color="#555555", va="bottom")
    return (len(lines) * fontsize * 1.35 + 6) / (figure.get_figheight() * 72)


def merge_heights(labels: Sequence[tuple[str, float, bool, str]]) -> list[float]:
    """The distinct FLOP/s of the roof labels (roofs of equal FLOP/s share one label)."""
    heights: list[float] = []
    for _text, y, _derated, _colour in labels:
        if not any(abs(h - y) <= 1e-6 * max(h, y) for h in heights):
            heights.append(y)
    return heights


def _bound_of(stage: Mapping[str, Any], module: str) -> str:
    """The bound holding most of a module's time (as the text report's bound column)."""
    by_bound: dict[str, float] = {}
    for op in stage.get("modules") or []:
        if op.get("module") == module:
            bound = str(op.get("bound"))
            by_bound[bound] = by_bound.get(bound, 0.0) + (number(op.get("time_us")) or 0.0)
    return max(by_bound, key=by_bound.__getitem__) if by_bound else "overhead"


def _roof_label_column(ax: Any, labels: Sequence[tuple[str, float, bool, str]], fontsize: float = 7.5) -> list[Any]:
    """Name each compute roof in a column right of the axes, at its height: never on a line. Roofs
    of the same FLOP/s share one label; labels closer than a line of text are spread apart, each
    joined to its roof's end by a thin leader."""
    merged: dict[float, list[tuple[str, str]]] = {}
    for text, y, _derated, colour in labels:
        key = next((k for k in merged if abs(k - y) <= 1e-6 * max(k, y)), y)
        merged.setdefault(key, []).append((text, colour))
    rows = sorted(merged.items())
    renderer = ax.figure.canvas.get_renderer()
    notes = []
    for y, parts in rows:
        text = "; ".join(t.rsplit(": ", 1)[0] for t, _ in parts) + ": " + parts[0][0].rsplit(": ", 1)[1]
        notes.append(ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(8, 0),
                                 textcoords="offset points", ha="left", va="center", fontsize=fontsize,
                                 color=parts[0][1], annotation_clip=False,
                                 arrowprops={"arrowstyle": "-", "color": parts[0][1], "linewidth": 0.5,
                                             "shrinkA": 0, "shrinkB": 0}))
    _spread_vertically(ax, notes, [y for y, _ in rows], renderer)
    return notes


def _spread_vertically(ax: Any, notes: Sequence[Any], heights: Sequence[float], renderer: Any) -> None:
    """Move labels (sorted by height) apart so that no two overlap: upwards from the lowest, then
    down from the axes' top if the highest went past it. Offsets in points."""
    if not notes:
        return
    ax.figure.canvas.draw()  # positions after layout
    scale = ax.figure.dpi / 72.0
    from matplotlib.text import Text

    gap = max(Text.get_window_extent(n, renderer).height for n in notes) / scale + 1.5  # the words, not the leader
    wanted = [ax.transData.transform((1.0, y))[1] / scale for y in heights]  # points, bottom up
    placed: list[float] = []
    for target in wanted:
        placed.append(max(target, placed[-1] + gap) if placed else target)
    top = ax.get_window_extent(renderer).y1 / scale + gap
    for i in range(len(placed) - 1, -1, -1):
        limit = top if i == len(placed) - 1 else placed[i + 1] - gap
        placed[i] = min(placed[i], limit)
    for note, target, at in zip(notes, wanted, placed):
        note.xyann = (8, at - target)
