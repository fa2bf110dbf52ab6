"""Leave-one-out error of the kernel-table interpolation, over every table directory.

For every grid point of every table: remove it, rebuild that grid from the remaining points, predict
the point's kernel time with the lookup's interpolation, and compare with the measured time.
Points whose removal leaves them inside their grid's range test interpolation (the target:
median error <= 5%, 90th percentile <= 15%); points on a grid's edge are predicted by the edge
rule (extended at the last doubling's slope above a work axis, else the roofline at the edge
efficiency) and are reported apart, since the lookup marks such
predictions as "edge" with a warning rather than passing them off as interpolation.

    python benchmarks/mfu_leave_one_out.py                      # every directory under mfu_tables/
    python benchmarks/mfu_leave_one_out.py mfu_tables/imported/h20 --format json
    python benchmarks/mfu_leave_one_out.py --interpolation time             # an alternative

A thinned table directory (the bundled aiconfigurator tables are converted with --compact) is
judged by what it leaves out: `--reference FULL_DIR` predicts every point of the full conversion
that the thinned directory does not hold, with the lookup (`load_tables`) of the thinned one:

    python benchmarks/mfu_leave_one_out.py mfu_tables/aiconfigurator/h100-sxm/trtllm-1.3.0rc20 \
        --reference /tmp/full/h100-sxm/trtllm-1.3.0rc20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.tables.format import CollectiveRow  # noqa: E402
from infersim.tables.table_files import read_table_dir, table_directories  # noqa: E402
from infersim.tables.grid_keys import describe_key, row_grid_key
from infersim.tables.interpolation import DEFAULT_INTERPOLATION, INTERPOLATIONS, Interpolation
from infersim.tables.grid_points import grid_from_points, grid_points
from infersim.tables.lookup import load_tables
from infersim.tables.series import collective_series

TARGET_MEDIAN = 0.05
TARGET_P90 = 0.15
NOISE_MIN_MFU = 0.1  # published mfu is rounded to 2-3 decimals: below this its rounding dominates


@dataclass(frozen=True)
class Prediction:
    directory: str
    family: str
    grid: str
    point: tuple[float, ...]
    measured_us: float
    predicted_us: float
    edge: bool
    source_disagreement: float | None  # |published mfu / efficiency from latency - 1|, imported rows


    @property
    def relative_error(self) -> float:
        return abs(self.predicted_us - self.measured_us) / self.measured_us


def family_label(key: tuple) -> str:
    if key[0] == "attention":
        return f"attention_{key[1]}"
    if key[0] == "grouped_gemm":
        return f"grouped_gemm_{key[3]}"  # the stage
    return str(key[0])


def leave_one_out(directory: Path, interpolation: Interpolation) -> list[Prediction]:
    table_dir = read_table_dir(directory)
    predictions = []
    for key, source in grid_points(table_dir).items():
        for i, point in enumerate(source.points):
            rest = [p for j, p in enumerate(source.points) if j != i and p.coords != point.coords]
            if not rest:
                continue  # a one-point grid has nothing to predict from
            grid = grid_from_points(source, rest, interpolation)
            flops = point.efficiency * point.seconds * source.peak_flops
            value = grid.evaluate(point.coords, flops)
            published = point.row.source_mfu
            disagreement = (abs(published / point.efficiency - 1.0)
                            if published is not None and published >= NOISE_MIN_MFU else None)
            predictions.append(Prediction(str(directory), family_label(key), describe_key(key), point.coords,
                                          point.row.latency_us, value.seconds * 1e6, bool(value.clamps),
                                          disagreement))
    # collectives: piecewise linear in message bytes, as the lookup; the end points are edges
    for (kind, ranks), (points, _) in collective_series(table_dir, directory.name).items():
        for i in range(1, len(points) - 1):
            (b0, t0), (b, t), (b1, t1) = points[i - 1], points[i], points[i + 1]
            predicted = t0 + (t1 - t0) * (b - b0) / (b1 - b0)
            predictions.append(Prediction(str(directory), "collective", f"{kind} {ranks} GPUs", (b,), t * 1e6,
                                          predicted * 1e6, False, None))
    return predictions


def held_out(thinned: Path, full: Path) -> list[Prediction]:
    """Every point of `full` that `thinned` does not hold, predicted by the lookup of `thinned`
    (points no grid of `thinned` covers are left out)."""
    tables = load_tables(thinned)
    held = {(key, coords) for key, source in grid_points(read_table_dir(thinned)).items()
            for coords in (p.coords for p in source.points)}
    reference = read_table_dir(full)
    predictions = []
    for _, row in (item for name in reference.tables for item in reference.rows_of(
            reference.provenance.tables[name].family) if item[0] == name):
        if isinstance(row, CollectiveRow):
            continue  # collectives are not thinned: every point is held
        key, coords, _ = row_grid_key(row)
        if (key, coords) in held:
            continue
        hit = tables.lookup(row.shape(), tables.provenance.peak_flops[row.dtype])
        if hit is None:
            continue
        predictions.append(Prediction(str(thinned), family_label(key), describe_key(key), coords, row.latency_us,
                                      hit.seconds * 1e6, hit.method in ("edge", "extrapolated"), None))
    return predictions


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(predictions: list[Prediction]) -> dict[str, float]:
    errors = [p.relative_error for p in predictions]
    if not errors:
        return {"points": 0, "median": float("nan"), "p90": float("nan"), "max": float("nan")}
    return {"points": len(errors), "median": statistics.median(errors), "p90": percentile(errors, 0.9),
            "max": max(errors)}


def report(predictions: list[Prediction]) -> dict:
    inside = [p for p in predictions if not p.edge]
    edge = [p for p in predictions if p.edge]
    overall = summarise(inside)
    by_group: dict[str, dict[str, float]] = {}
    for label in sorted({(Path(p.directory).name, p.family) for p in predictions}):
        members = [p for p in inside if (Path(p.directory).name, p.family) == label]
        edges = [p for p in edge if (Path(p.directory).name, p.family) == label]
        noise = [p.source_disagreement for p in predictions
                 if (Path(p.directory).name, p.family) == label and p.source_disagreement is not None]
        by_group[f"{label[0]}/{label[1]}"] = {**summarise(members),
                                              "edge_points": len(edges),
                                              "edge_median": summarise(edges)["median"],
                                              "source_disagreement_p90": percentile(noise, 0.9)}
    worst = sorted(inside, key=lambda p: p.relative_error, reverse=True)[:10]
    return {
        "interpolated": overall,
        "edge": summarise(edge),
        "all_points": summarise(predictions),
        "targets": {"median": TARGET_MEDIAN, "p90": TARGET_P90},
        "met": bool(overall["points"]) and overall["median"] <= TARGET_MEDIAN and overall["p90"] <= TARGET_P90,
        "by_table": by_group,
        "worst": [{"table": f"{Path(p.directory).name} {p.grid}", "point": p.point, "measured_us": p.measured_us,
                   "predicted_us": round(p.predicted_us, 3), "error": round(p.relative_error, 4)} for p in worst],
    }


def print_text(result: dict, directories: list[Path], scheme: str) -> None:
    def pct(x: float) -> str:
        return f"{100 * x:5.1f}%"

    print(f"Leave-one-out over {len(directories)} table directories "
          f"({', '.join(str(d) for d in directories)}); interpolation: {scheme}")
    print(f"{'table':30s} {'points':>6s} {'median':>7s} {'p90':>7s} {'max':>7s}   {'edge pts':>8s} {'edge med':>8s}"
          f"   {'data p90':>8s}")
    for name, s in result["by_table"].items():
        noise = s["source_disagreement_p90"]
        print(f"{name:30s} {s['points']:6d} {pct(s['median'])} {pct(s['p90'])} {pct(s['max'])}   "
              f"{s['edge_points']:8d} {pct(s['edge_median']) if s['edge_points'] else '     -':>8s}"
              f"   {pct(noise) if noise == noise else '     -':>8s}")
    print("(data p90: imported tables only, rows with published mfu >= 0.1: 90th percentile of |published mfu / "
          "efficiency from the published latency - 1|,\n the measurements' own disagreement, a floor for any "
          "prediction error)")
    inter, edge, every = result["interpolated"], result["edge"], result["all_points"]
    print(f"\ninterpolated points: {inter['points']}, median {pct(inter['median'])}, p90 {pct(inter['p90'])} "
          f"(targets: median <= {pct(TARGET_MEDIAN)}, p90 <= {pct(TARGET_P90)}): "
          f"{'MET' if result['met'] else 'NOT MET'}")
    print(f"edge points (predicted by the edge rule, reported as warnings): {edge['points']}, "
          f"median {pct(edge['median'])}, p90 {pct(edge['p90'])}")
    print(f"all points: {every['points']}, median {pct(every['median'])}, p90 {pct(every['p90'])}")
    print("\nworst interpolated points:")
    for w in result["worst"]:
        print(f"  {w['table']} at {w['point']}: measured {w['measured_us']:.3f} us, "
              f"predicted {w['predicted_us']:.3f} us ({100 * w['error']:.1f}%)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", type=Path,
                        help="table directories or roots holding them (default: mfu_tables/)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--reference", type=Path, default=None,
                        help="the full conversion of the one (thinned) directory given: predict its points "
                             "the thinned directory left out, instead of leave-one-out")
    default = next(name for name, scheme in INTERPOLATIONS.items() if scheme == DEFAULT_INTERPOLATION)
    parser.add_argument("--interpolation", choices=sorted(INTERPOLATIONS), default=default,
                        help="envelope: kernel time in work coordinates, bounded by the convex envelope "
                             "across knees (what the lookup uses); time: plain multilinear time in work "
                             "coordinates; log-efficiency: log(efficiency) multilinear in log2 of the axes "
                             "(the first design); the last two for comparison")
    args = parser.parse_args(argv)
    roots = args.directories or [REPO / "mfu_tables"]
    directories = sorted({d for root in roots for d in table_directories(root)})
    if not directories:
        print(f"no table directories (with provenance.yaml) under {', '.join(map(str, roots))}", file=sys.stderr)
        return 2
    scheme = INTERPOLATIONS[args.interpolation]
    if args.reference is not None:
        if len(directories) != 1:
            print("--reference compares one thinned table directory with its full conversion", file=sys.stderr)
            return 2
        predictions = held_out(directories[0], args.reference)
    else:
        predictions = [p for d in directories for p in leave_one_out(d, scheme)]
    result = report(predictions)
    if args.format == "json":
        result["directories"] = [str(d) for d in directories]
        result["interpolation"] = scheme.name
        print(json.dumps(result, indent=2))
    else:
        print_text(result, directories, scheme.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
