"""How well a kernel table extends above its range, near it and far beyond it.

Near the range (the default): every point of every row is predicted from the two points below it,
  - edge:  time proportional to work at the edge efficiency, t = t2 * w / w2;
  - slope: the last interval's time per unit of work carried on, t = t2 + s (w - w2) with
           s = max(0, (t2 - t1) / (w2 - w1)), capped at t2 / w2 (the rule before the last doubling's);
  - doubling: the same with s over the row's last doubling, from the time at w2 / 2 (interpolated) to t2
           (what infersim.tables.interpolation extends with).
Only predictions from a last point of at least --min-axis (default 512) count.

Far beyond it (--far): every row is cut at each of its points from --min-axis up, the points 4-32x
above the cut (in the axis value) are held out, and the grid built from the rest (other rows intact)
prices them through infersim.tables.lookup, as a lookup would, under three rules:
  - slope: the lookup's slope (the last doubling's) carried on however far (the rule before the beyond-range rule);
  - edge:  the edge's FLOP efficiency carried (time proportional to FLOPs);
  - rule:  infersim.tables.beyond_range: the slope, except where an MoE grouped GEMM crosses from
           its row's memory-bound last point into the compute regime in a grid of several rows: there
           the roofline anchored at the table (its streaming rate at the edge, its grid's best efficiency).
Each family is reported whole and for the held-out points that cross regimes (memory -> compute).
Regimes come from the hardware card of the table's device (mfu_tables/<set>/<card>/...).

    python benchmarks/mfu_extrapolation.py                 # near the range, every table directory
    python benchmarks/mfu_extrapolation.py --far           # 4-32x beyond, every table directory
    python benchmarks/mfu_extrapolation.py --far mfu_tables/aiconfigurator/h100-sxm/trtllm-1.3.0rc20
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORK_AXES = ("m", "tokens_per_gpu", "kv_len")
NOT_KEYS = {"latency_us", "efficiency", "source_mfu"}
FAR = (4.0, 32.0)  # held-out points this many times the cut's axis value
RULES = ("slope", "edge", "rule")


def work(axis: str, x: float) -> float:
    return x * (x + 1) / 2 if axis == "seq_len" else x


def predictions(path: Path, min_axis: float) -> tuple[str, list[float], list[float], list[float]] | None:
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
    edge, slope, doubling = [], [], []
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
                w_half, t_half = _half_work_point(axis, xs[:i], points)
                s = min(t2 / w2, max(0.0, (t2 - t_half) / (w2 - w_half)))
                doubling.append(abs((t2 + s * (w - w2)) / measured - 1))
    return axis, edge, slope, doubling


def _half_work_point(axis: str, xs: list[float], points: dict[float, float]) -> tuple[float, float]:
    """(work, time) at half the work of the last of `xs` (ascending), interpolated linearly in work
    between the points around it; the first point where the row starts above half."""
    works = [work(axis, x) for x in xs]
    target = max(works[0], min(works[-2], works[-1] / 2.0))
    for (wa, xa), (wb, xb) in zip(zip(works, xs), zip(works[1:], xs[1:])):
        if wa <= target <= wb:
            return target, points[xa] + (points[xb] - points[xa]) * (target - wa) / (wb - wa)
    return works[0], points[xs[0]]


def summary(errors: list[float]) -> str:
    ordered = sorted(errors)
    return f"median {statistics.median(ordered):6.1%}  p90 {ordered[int(0.9 * (len(ordered) - 1))]:6.1%}"


def near(dirs: list[Path], min_axis: float) -> None:
    total_edge, total_slope, total_doubling = [], [], []
    print(f"{'table':70s} {'n':>6s}   {'edge efficiency':24s} {'last-interval slope':24s} {'last-doubling slope':24s}")
    for directory in dirs:
        for path in sorted(directory.glob("*.csv")):
            found = predictions(path, min_axis)
            if not found or not found[1]:
                continue
            _axis, edge, slope, doubling = found
            total_edge += edge
            total_slope += slope
            total_doubling += doubling
            name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
            print(f"{name:70s} {len(edge):6d}   {summary(edge):24s} {summary(slope):24s} {summary(doubling):24s}")
    if total_edge:
        print(f"{'all':70s} {len(total_edge):6d}   {summary(total_edge):24s} {summary(total_slope):24s} "
              f"{summary(total_doubling):24s}")


def card_of(directory: Path):
    """The hardware card of a table directory: mfu_tables/<set>/<card>[/<engine>]."""
    from infersim.cards.registry import bundled_names
    from infersim.run.config import load_hardware_card

    names = set(bundled_names("hardware"))
    for part in reversed(directory.parts):
        if part in names:
            return load_hardware_card(part)[0]
    return None


def far_errors(directory: Path, min_axis: float) -> dict[str, dict[str, list[float]]]:
    """Per family, per rule: |predicted / measured - 1| of held-out points 4-32x beyond a cut."""
    from infersim.tables import beyond_range, grid_points, interpolation
    from infersim.tables.table_files import read_table_dir
    from infersim.costing.timing import roofline_rates

    hw = card_of(directory)
    if hw is None:
        return {}

    def roofline(shape):
        return roofline_rates(shape, hw)

    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: {rule: [] for rule in RULES})
    for key, source in grid_points.grid_points(read_table_dir(directory)).items():
        if key[0] == "attention" and key[-1]:
            continue  # sliding-window grids: extended flat above the window, another rule
        family = key[0] if key[0] != "attention" else f"attention {key[1]}"
        for a, axis in enumerate(source.axes):
            if axis not in interpolation.EXTENDED_AXES or axis not in beyond_range._WORK_FIELDS:
                continue
            rows: dict[tuple[float, ...], list] = defaultdict(list)
            for p in source.points:
                rows[p.coords[:a] + p.coords[a + 1:]].append(p)
            for row_key, row in rows.items():
                row.sort(key=lambda p: p.coords[a])
                for cut in range(1, len(row)):
                    top = row[cut].coords[a]
                    if top < min_axis:
                        continue
                    held = [p for p in row if FAR[0] <= p.coords[a] / top <= FAR[1]]
                    if not held:
                        continue
                    kept = [p for p in source.points
                            if not (p.coords[:a] + p.coords[a + 1:] == row_key and p.coords[a] > top)]
                    grid = grid_points.grid_from_points(source, kept)
                    _held_out_errors(grid, held, family, source.peak_flops, roofline, errors)
    return errors


def _held_out_errors(grid, held: list, family: str, peak_flops: float, roofline,
                     errors: dict[str, dict[str, list[float]]]) -> None:
    """Each rule's |predicted / measured - 1| at the held-out points the grid extrapolates to, under
    the family and, where the edge is memory-bound and the point compute-bound, its crossing set."""
    from infersim.shapes.kernels import TableHit
    from infersim.tables import beyond_range

    for p in held:
        shape = p.row.shape()
        value = grid.evaluate(p.coords, shape.flops)
        if not value.clamps or not all(c.extrapolated for c in value.clamps):
            continue
        edge = beyond_range.edge_of(grid, p.coords, value.clamps, shape.flops)
        if edge is None:
            continue
        hit = TableHit(value.seconds, "held-out", "extrapolated", value.efficiency, "", *edge,
                       grid.best_efficiency if len(grid.axes) > 1 else 0.0)
        at_edge = beyond_range.with_work(shape, edge[0], edge[1])
        predicted = {
            "slope": value.seconds,
            "edge": edge[2] * shape.flops / at_edge.flops,
            "rule": beyond_range.beyond_range(shape, hit, roofline, peak_flops).seconds,
        }
        crossing = (beyond_range.regime(at_edge, roofline) == "memory"
                    and beyond_range.regime(shape, roofline) == "compute")
        for name in (family, f"{family} crossing") if crossing else (family,):
            for rule, seconds in predicted.items():
                errors[name][rule].append(abs(seconds / p.seconds - 1))


def far(dirs: list[Path], min_axis: float) -> None:
    totals: dict[str, list[float]] = {rule: [] for rule in RULES}
    print(f"held-out points {FAR[0]:g}-{FAR[1]:g}x beyond a row's cut; |predicted / measured - 1|, median and p90; "
          f"cuts at axis values >= {min_axis:g}")
    print(f"{'tables':52s} {'family':30s} {'n':>6s}  " + "  ".join(f"{rule:>16s}" for rule in RULES))
    for directory in dirs:
        for family, by_rule in sorted(far_errors(directory, min_axis).items()):
            if not by_rule["rule"]:
                continue
            if not family.endswith("crossing"):
                for rule in RULES:
                    totals[rule] += by_rule[rule]
            name = str(directory.relative_to(ROOT) if directory.is_relative_to(ROOT) else directory)
            cells = "  ".join(f"{statistics.median(by_rule[r]):7.1%} {sorted(by_rule[r])[int(0.9 * (len(by_rule[r]) - 1))]:7.1%}"
                              for r in RULES)
            print(f"{name:52s} {family:30s} {len(by_rule['rule']):6d}  {cells}")
    if totals["rule"]:
        cells = "  ".join(f"{statistics.median(totals[r]):7.1%} {sorted(totals[r])[int(0.9 * (len(totals[r]) - 1))]:7.1%}"
                          for r in RULES)
        print(f"{'all':52s} {'':30s} {len(totals['rule']):6d}  {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", type=Path)
    parser.add_argument("--min-axis", type=float, default=512.0)
    parser.add_argument("--far", action="store_true", help="held-out points 4-32x beyond a row's cut, four rules")
    args = parser.parse_args(argv)
    dirs = args.directories or sorted(p.parent for p in (ROOT / "mfu_tables").rglob("provenance.yaml"))
    if args.far:
        far([d.resolve() for d in dirs], args.min_axis)
    else:
        near(dirs, args.min_axis)
    return 0


if __name__ == "__main__":
    sys.exit(main())
