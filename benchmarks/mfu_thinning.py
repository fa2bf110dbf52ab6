"""Lookup error before and after thinning, per table directory: the leave-one-out error of the full
conversion, the error of the points the thinned directory left out (as its lookup predicts them),
and the leave-one-out error of the thinned grid itself.

    python benchmarks/mfu_thinning.py FULL_ROOT THINNED_ROOT      # e.g. /tmp/full mfu_tables/aiconfigurator

Each root holds <device>/<engine>-<version>/ directories (`infersim mfu import-aiconfigurator` without
and with --compact). Points are predicted along each grid row's innermost work axis with the lookup's
own rule (infersim.tabletools.thinning reproduces it exactly; tests/test_table_thinning.py checks it against
the lookup): removing one point of a row leaves every other row, and the outer axes' exact match, as
they are, so this is what benchmarks/mfu_leave_one_out.py measures for points inside their row's range,
at a fraction of its cost. Points at a row's ends (the edge rule) are left out, as there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.tables.format import CollectiveRow, ElementwiseRow
from infersim.tables.grid_keys import row_grid_key
from infersim.tables.interpolation import DEFAULT_INTERPOLATION
from infersim.tables.table_files import read_table_dir, table_directories
from infersim.tabletools.thinning import _row_values

FAMILIES = {"gemm": "GEMM", "grouped_gemm": "MoE", "prefill": "attn prefill", "decode": "attn decode"}


def rows_by_line(directory: Path) -> dict[tuple, dict[float, float]]:
    """(family, grid key, outer coordinates) -> {innermost axis value: mean time in us}."""
    lines: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    axes_of: dict[tuple, str] = {}
    for rows in read_table_dir(directory).tables.values():
        for row in rows:
            if isinstance(row, (CollectiveRow, ElementwiseRow)):
                continue
            key, coords, axes = row_grid_key(row)
            if key[0] == "grouped_gemm" and key[3] == "decode":
                continue  # the same measurements as the prefill rows (one kernel serves both stages)
            family = key[0] if key[0] != "attention" else key[1]
            line = (family, key, coords[:-1])
            lines[line][coords[-1]].append(row.latency_us)
            axes_of[line] = axes[-1]
    return {(line, axes_of[line]): {v: statistics.fmean(t) for v, t in pts.items()} for line, pts in lines.items()}


def loo_errors(points: dict[float, float], axis: str) -> list[float]:
    values = sorted(points)
    coords = [DEFAULT_INTERPOLATION.coordinate(axis, v) for v in values]
    times = [points[v] for v in values]
    errors = []
    for j in range(1, len(values) - 1):
        kept = [i for i in range(len(values)) if i != j]
        errors.append(abs(_row_values(coords, times, kept, j) / times[j] - 1))
    return errors


def held_out_errors(full: dict[float, float], thinned: dict[float, float], axis: str) -> list[float]:
    values = sorted(full)
    coords = [DEFAULT_INTERPOLATION.coordinate(axis, v) for v in values]
    times = [full[v] for v in values]
    kept = [i for i, v in enumerate(values) if v in thinned]
    return [abs(_row_values(coords, times, kept, j) / times[j] - 1)
            for j in range(len(values)) if values[j] not in thinned and kept[0] < j < kept[-1]]


def summary(errors: list[float]) -> str:
    if not errors:
        return "-"
    ordered = sorted(errors)
    return f"{statistics.median(ordered):.1%} / {ordered[int(0.9 * (len(ordered) - 1))]:.1%}"


def compare(full_dir: Path, thin_dir: Path) -> dict[str, str]:
    full, thin = rows_by_line(full_dir), rows_by_line(thin_dir)
    before: dict[str, list[float]] = defaultdict(list)
    after_loo: dict[str, list[float]] = defaultdict(list)
    held: list[float] = []
    kept = total = 0
    for (line, axis), points in full.items():
        thinned = thin.get((line, axis), {})
        if not thinned:
            continue  # a table the bundle does not hold (left out on import, as its notes say)
        family = FAMILIES[line[0]]
        before[family] += loo_errors(points, axis)
        before["all"] += loo_errors(points, axis)
        after_loo["all"] += loo_errors(thinned, axis)
        held += held_out_errors(points, thinned, axis)
        kept, total = kept + len(thinned), total + len(points)
    size = sum(p.stat().st_size for p in thin_dir.iterdir())
    return {"points": f"{total:,}", "kept": f"{kept / total:.0%}", "MB": f"{size / 1e6:.2f}",
            "before": summary(before["all"]),
            **{name: summary(before[name]) for name in FAMILIES.values()},
            "left out": f"{summary(held)} (max {max(held, default=0.0):.1%})",
            "after (LOO of the thinned grid)": summary(after_loo["all"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("full_root", type=Path)
    parser.add_argument("thinned_root", type=Path)
    args = parser.parse_args(argv)
    columns: list[str] = []
    for thin_dir in table_directories(args.thinned_root):
        relative = thin_dir.relative_to(args.thinned_root)
        full_dir = args.full_root / relative
        if not full_dir.is_dir():
            continue
        result = compare(full_dir, thin_dir)
        if not columns:
            columns = list(result)
            print("| device | engine | " + " | ".join(columns) + " |")
            print("|---" * (len(columns) + 2) + "|")
        print(f"| {relative.parent} | {relative.name} | " + " | ".join(result[c] for c in columns) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
