"""How well a kernel table extends above its range: constant edge efficiency vs the last interval's slope.

For every row of every table (one value of every column but the work axis), each point is predicted
from the two points below it, as the lookup extends a row above its last point:
  - edge:  time proportional to work at the edge efficiency, t = t2 * w / w2;
  - slope: the last interval's time per unit of work carried on, t = t2 + s (w - w2) with
           s = max(0, (t2 - t1) / (w2 - w1)), capped at t2 / w2 (the rule infersim.mfu.lookup uses).
Work is m, tokens per GPU or kv_len as they are, a prefill's seq_len as s(s+1)/2. Only predictions
from a last point of at least --min-axis (default 512) count, the regime beyond a table's end.

    python benchmarks/mfu_extrapolation.py                       # every table directory under mfu_tables/
    python benchmarks/mfu_extrapolation.py mfu_tables/aiconfigurator/h100-sxm/trtllm-1.3.0rc20
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK_AXES = ("m", "tokens_per_gpu", "kv_len")
NOT_KEYS = {"latency_us", "efficiency", "source_mfu"}


def work(axis: str, x: float) -> float:
    return x * (x + 1) / 2 if axis == "seq_len" else x


def predictions(path: Path, min_axis: float) -> tuple[str, list[float], list[float]] | None:
    with path.open() as f:
        reader = csv.DictReader(line for line in f if not line.startswith("#"))
        rows = list(reader)
        fields = reader.fieldnames or []
    axis = next((a for a in WORK_AXES if a in fields), None)
    if axis is None or not rows:
        return None
    if axis == "kv_len" and "q_len" in fields and any(r["q_len"] == r["kv_len"] for r in rows):
        axis = "seq_len"  # prefill rows: one sequence of q_len == kv_len
    column = "kv_len" if axis == "seq_len" else axis
    keys = [c for c in fields if c not in NOT_KEYS and c not in (column, "q_len" if axis == "seq_len" else "")]
    series: dict[tuple[str, ...], dict[float, float]] = defaultdict(dict)
    for r in rows:
        if r.get("window") not in (None, "", "0"):
            continue  # sliding-window rows: the lookup extends them by another rule (flat above the window)
        series[tuple(r[k] for k in keys)][float(r[column])] = float(r["latency_us"])
    edge, slope = [], []
    for points in series.values():
        xs = sorted(points)
        for i in range(2, len(xs)):
            x1, x2 = xs[i - 2], xs[i - 1]
            if x2 < min_axis:
                continue
            t1, t2 = points[x1], points[x2]
            w1, w2 = work(axis, x1), work(axis, x2)
            for x in xs[i:i + 2]:  # the next point and the one after
                w, measured = work(axis, x), points[x]
                s = min(t2 / w2, max(0.0, (t2 - t1) / (w2 - w1)))
                edge.append(abs(t2 * w / w2 / measured - 1))
                slope.append(abs((t2 + s * (w - w2)) / measured - 1))
    return axis, edge, slope


def summary(errors: list[float]) -> str:
    ordered = sorted(errors)
    return f"median {statistics.median(ordered):6.1%}  p90 {ordered[int(0.9 * (len(ordered) - 1))]:6.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", type=Path)
    parser.add_argument("--min-axis", type=float, default=512.0)
    args = parser.parse_args(argv)
    dirs = args.directories or sorted(p.parent for p in (ROOT / "mfu_tables").rglob("provenance.yaml"))
    total_edge, total_slope = [], []
    print(f"{'table':70s} {'n':>6s}   {'edge efficiency':24s} {'last-interval slope':24s}")
    for directory in dirs:
        for path in sorted(directory.glob("*.csv")):
            found = predictions(path, args.min_axis)
            if not found or not found[1]:
                continue
            _axis, edge, slope = found
            total_edge += edge
            total_slope += slope
            name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
            print(f"{name:70s} {len(edge):6d}   {summary(edge):24s} {summary(slope):24s}")
    if total_edge:
        print(f"{'all':70s} {len(total_edge):6d}   {summary(total_edge):24s} {summary(total_slope):24s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
