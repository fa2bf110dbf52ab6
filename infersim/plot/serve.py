"""Serving: throughput against p50/p99 latency over a rate sweep, and TTFT/TPOT distributions.

Reads `infersim serve --format json` (vllm `bench serve` style keys):
- top level, one run: `output_throughput` (tokens/s), `request_throughput` (requests/s),
  `median_ttft_ms` (else `p50_ttft_ms`), `p99_ttft_ms`, `mean_ttft_ms`, and the same for `tpot`;
- `rate_sweep` (optional): a list of such records, each with its request `rate` (requests/s);
- `requests` (optional): one record per request with `ttft_ms` and `tpot_ms`;
- `slo` (optional): `ttft_ms` and `tpot_ms` targets.

Top row (always): output throughput (x) against TTFT and TPOT (y), a p50 line and a p99 line over
the rate sweep (a single run is one point), each point annotated with its rate, the SLO as a
horizontal line. Bottom row (when per-request records are present): histograms of TTFT and TPOT
with p50 and p99 and the SLO marked. Missing keys leave their line out rather than failing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infersim.base.errors import InferSimError
from infersim.plot.backend import Drawing, pyplot
from infersim.plot.common import first_number, number
from infersim.base.stats import percentile as sorted_percentile

METRICS = ("ttft", "tpot")
METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT"}


def rate_points(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One point per rate (pure): throughput and p50/p99 of TTFT and TPOT, ordered by rate."""
    records = data.get("rate_sweep")
    if not isinstance(records, list) or not records:
        records = [data]
    points = []
    for r in records:
        if not isinstance(r, Mapping):
            continue
        point = {"rate": number(r.get("rate", r.get("request_rate"))),
                 "output_throughput": number(r.get("output_throughput")),
                 "request_throughput": number(r.get("request_throughput"))}
        for metric in METRICS:
            point[f"p50_{metric}_ms"] = first_number(r, (f"median_{metric}_ms", f"p50_{metric}_ms"))
            point[f"p99_{metric}_ms"] = number(r.get(f"p99_{metric}_ms"))
            point[f"mean_{metric}_ms"] = number(r.get(f"mean_{metric}_ms"))
        if point["output_throughput"] is not None:
            points.append(point)
    return sorted(points, key=lambda p: (p["rate"] is None, p["rate"] or 0.0))


def request_samples(data: Mapping[str, Any]) -> dict[str, list[float]]:
    requests = data.get("requests")
    samples: dict[str, list[float]] = {m: [] for m in METRICS}
    if isinstance(requests, list):
        for r in requests:
            if isinstance(r, Mapping):
                for metric in METRICS:
                    x = number(r.get(f"{metric}_ms"))
                    if x is not None:
                        samples[metric].append(x)
    return samples


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default) of unsorted values."""
    return sorted_percentile(sorted(values), q)


def histogram_bins(values: Sequence[float], most: int = 40) -> list[float]:
    """Bin edges sized to the data: numpy's automatic width over the values' range, at most `most`
    bins; a spread below 2% of the median (a closed loop of one client gives every request the same
    TTFT to the last bit) is drawn over +-2% of it in 5 bins, so the bar has a width one can see."""
    import numpy as np

    low, high = min(values), max(values)
    middle = percentile(values, 50)
    floor = max(abs(middle) * 0.02, 1e-3)
    if high - low < floor:
        return [float(e) for e in np.linspace(middle - floor, middle + floor, 6)]
    edges = np.histogram_bin_edges(values, bins="auto")
    if len(edges) - 1 > most:
        edges = np.linspace(low, high, most + 1)
    return [float(e) for e in edges]


def serve_title(data: Mapping[str, Any]) -> str:
    """Model, GPUs, engine and load of a serving result (its `run` block), else what it names."""
    run = data.get("run")
    if isinstance(run, Mapping) and run.get("title"):
        return str(run["title"])
    name = data.get("model") or data.get("config") or ""
    return f"serving{': ' + str(name) if name else ''}"


def _single_run_line(point: Mapping[str, Any]) -> str:
    parts = [f"output {point['output_throughput']:,.0f} tok/s"]
    for metric in METRICS:
        p50, p99 = point.get(f"p50_{metric}_ms"), point.get(f"p99_{metric}_ms")
        if p50 is not None and p99 is not None:
            parts.append(f"{METRIC_NAMES[metric]} p50 {p50:,.1f} / p99 {p99:,.1f} ms")
    return "; ".join(parts)


def draw_serve(data: Mapping[str, Any]) -> Drawing:
    """Latency against throughput over a rate sweep (a single run with per-request records shows
    its numbers in the title instead of two lone points), and TTFT / TPOT histograms."""
    points = rate_points(data)
    samples = request_samples(data)
    has_requests = any(samples.values())
    if not points and not has_requests:
        raise InferSimError("serve: no output_throughput and no per-request records to draw "
                            "(is this `infersim serve --format json` output?)")
    slo = data.get("slo") if isinstance(data.get("slo"), Mapping) else {}
    curves = bool(points) and (len(points) > 1 or not has_requests)
    rows = (1 if curves else 0) + (1 if has_requests else 0)
    plt = pyplot("the serving picture")
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(rows, 2, figsize=(11, 4.1 * rows + 0.9), squeeze=False)
    drawn: dict[str, Any] = {"kind": "serve", "points": points, "histograms": {}, "slo": dict(slo),
                             "curves": curves}
    row = 0
    if curves:
        for ax, metric in zip(axes[row], METRICS):
            xs = [p["output_throughput"] for p in points]
            top = 0.0
            for q, style in (("p50", "-o"), ("p99", "--s")):
                ys = [p[f"{q}_{metric}_ms"] for p in points]
                pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
                if pairs:
                    ax.plot([x for x, _ in pairs], [y for _, y in pairs], style, markersize=4, linewidth=1.4,
                            label=f"{q} {METRIC_NAMES[metric]}")
                    top = max(top, max(y for _, y in pairs))
            for p in points:
                y = p[f"p99_{metric}_ms"] or p[f"p50_{metric}_ms"]
                if p["rate"] is not None and y is not None:
                    ax.annotate(f"{p['rate']:g}/s", xy=(p["output_throughput"], y), xytext=(3, 4),
                                textcoords="offset points", fontsize=7, color="#555555")
            target = number(slo.get(f"{metric}_ms"))
            if target is not None:
                ax.axhline(target, color="#d62728", linestyle=":", linewidth=1.4,
                           label=f"SLO {METRIC_NAMES[metric]} {target:g} ms")
                top = max(top, target)
            ax.set_ylim(0, top * 1.15 if top > 0 else 1)  # latency from zero: a spread reads as it is
            ax.ticklabel_format(axis="both", style="plain", useOffset=False)
            ax.set_xlabel("output throughput (tokens/s)")
            ax.set_ylabel(f"{METRIC_NAMES[metric]} (ms)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            ax.set_title(f"{METRIC_NAMES[metric]} vs throughput" + (" (labels: request rate)" if len(points) > 1
                                                                     else ""), fontsize=9)
        row += 1
    if has_requests:
        for ax, metric in zip(axes[row], METRICS):
            values = samples[metric]
            if not values:
                ax.set_axis_off()
                continue
            counts, edges, _ = ax.hist(values, bins=histogram_bins(values), color="#4c72b0", edgecolor="white")
            p50, p99 = percentile(values, 50), percentile(values, 99)
            ax.axvline(p50, color="black", linestyle="-", linewidth=1.2, label=f"p50 {p50:,.1f} ms")
            ax.axvline(p99, color="black", linestyle="--", linewidth=1.2, label=f"p99 {p99:,.1f} ms")
            target = number(slo.get(f"{metric}_ms"))
            if target is not None:
                ax.axvline(target, color="#d62728", linestyle=":", linewidth=1.4, label=f"SLO {target:g} ms")
            ax.ticklabel_format(axis="x", style="plain", useOffset=False)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of requests
            ax.set_xlabel(f"{METRIC_NAMES[metric]} (ms)")
            ax.set_ylabel("requests")
            ax.legend(fontsize=8)
            ax.set_title(f"{METRIC_NAMES[metric]} of {len(values)} requests", fontsize=9)
            drawn["histograms"][metric] = {"values": list(values), "counts": [float(c) for c in counts],
                                           "edges": [float(e) for e in edges], "p50": p50, "p99": p99}
    title = serve_title(data)
    if points and not curves:
        title += "\n" + _single_run_line(points[0])
    drawn["title"] = title
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return Drawing(figure, drawn)
