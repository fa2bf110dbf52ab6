"""Multi-node NCCL collectives: collective_cost against the measurements of benchmarks/collectives_multinode.yaml.

For every measured point, the predicted time of the same collective (ranks, ranks per node, bytes)
on the series' hardware card (with the NIC the series names), converted the way nccl-tests reports
it (time in us, or busbw = bytes / time x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather), and
the signed error; the algorithm and protocol the model picked; and the summary over the checked
points (the rest are listed with the reason they are not checked).

    python benchmarks/validate_collectives.py
    python benchmarks/validate_collectives.py --format json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infersim.run.config import load_hardware_card  # noqa: E402
from infersim.shapes.comm_shapes import CollectiveShape  # noqa: E402
from infersim.modules.comm import collective_cost  # noqa: E402

DATA = ROOT / "benchmarks" / "collectives_multinode.yaml"


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw."""
    return 2.0 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks


def evaluate(path: Path = DATA) -> list[dict]:
    import yaml

    data = yaml.safe_load(path.read_text())
    rows = []
    for series in data["series"]:
        hw, _ = load_hardware_card(series["hardware"])
        if "network_bandwidth" in series:
            hw = replace(hw, peak=replace(hw.peak, network_bandwidth=float(series["network_bandwidth"])))
        for point in series["points"]:
            size = float(point["bytes"])
            shape = CollectiveShape(series["kind"], size, series["ranks"], series["ranks_per_node"])
            cost = collective_cost(shape, hw)
            if "time_us" in point:
                measured, predicted, unit = float(point["time_us"]), cost.seconds * 1e6, "us"
            else:
                measured = float(point["busbw_GBps"])
                predicted, unit = size / cost.seconds / 1e9 * bus_factor(series["kind"], series["ranks"]), "GB/s busbw"
            rows.append({"series": series["id"], "kind": series["kind"], "ranks": series["ranks"],
                         "ranks_per_node": series["ranks_per_node"], "bytes": size, "measured": measured,
                         "predicted": predicted, "unit": unit, "error": predicted / measured - 1,
                         "algorithm": cost.detail.split(", ")[-1].replace(" (NCCL tuning model)", ""),
                         "check": point.get("check", True), "why": point.get("why", "")})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    rows = evaluate()
    checked = [r for r in rows if r["check"]]
    errors = [abs(r["error"]) for r in checked]
    summary = {"n": len(checked), "median_abs_error_pct": 100 * statistics.median(errors),
               "max_abs_error_pct": 100 * max(errors),
               "within_15pct_share_pct": 100 * sum(e <= 0.15 for e in errors) / len(errors)}
    if args.format == "json":
        print(json.dumps({"points": rows, "summary": summary}, indent=2))
        return 0
    print(f"{'series':28s} {'bytes':>12s} {'measured':>10s} {'predicted':>10s} {'error':>8s}  {'unit':11s} model's choice")
    for r in rows:
        mark = "" if r["check"] else "   (not checked: " + r["why"] + ")"
        print(f"{r['series']:28s} {r['bytes']:12,.0f} {r['measured']:10,.2f} {r['predicted']:10,.2f} "
              f"{100 * r['error']:+7.1f}%  {r['unit']:11s} {r['algorithm']}{mark}")
    print(f"checked: {summary['n']} points, median |error| {summary['median_abs_error_pct']:.1f}%, "
          f"largest {summary['max_abs_error_pct']:.1f}%, within 15%: {summary['within_15pct_share_pct']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
