"""Predicted vs measured throughput on the six cases published with the InferSim report.

    python benchmarks/validate_published.py [--format json] [--mfu-tables DIR] [--published PATH]

Measured values come from infersim/validate/public/published.yaml (shipped with the package, copied
unchanged from ../shared/reference/published.yaml; --published reads another file). Each case's run config is benchmarks/published/<case id>.yaml. With --mfu-tables DIR,
a subdirectory of DIR named after the case's hardware card (e.g. DIR/h20) is used when present,
else DIR itself. Targets (roofline only): mean absolute error <= 15%, no case beyond 25%;
(with tables): mean <= 8%, none beyond 15%.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.run.config import load_run_config  # noqa: E402
from infersim.base.errors import InferSimError  # noqa: E402
from infersim.run.simulate import simulate  # noqa: E402

from infersim.validate import public_file  # noqa: E402

DEFAULT_PUBLISHED = public_file("published.yaml")  # shipped with the package (infersim/validate/public)
CONFIG_DIR = Path(__file__).resolve().parent / "published"


def tables_for(mfu_tables: str | None, hardware: str) -> str | None:
    """None: each case's default (the bundled tables of its device and engine); 'none': roofline."""
    if not mfu_tables or mfu_tables in ("none", "auto"):
        return mfu_tables or None
    per_device = Path(mfu_tables) / hardware
    return str(per_device) if per_device.is_dir() else mfu_tables


def validate(published: Path, mfu_tables: str | None = None) -> dict:
    data = yaml.safe_load(published.read_text())
    rows = []
    for case in data["cases"]:
        config_path = CONFIG_DIR / f"{case['id']}.yaml"
        hardware = yaml.safe_load(config_path.read_text())["hardware"]
        config = load_run_config(str(config_path), mfu_tables=tables_for(mfu_tables, hardware))
        result = simulate(config)
        stage = result.prefill if case["stage"] == "prefill" else result.decode
        predicted = stage.tgs
        actual = float(case["actual_tgs"])
        rows.append({
            "id": case["id"],
            "stage": case["stage"],
            "actual_tgs": actual,
            "predicted_tgs": predicted,
            "error": (predicted - actual) / actual,
            "original_infersim_tgs": case.get("infersim_sim_tgs"),
            "source": stage.source.value,
        })
    errors = [abs(r["error"]) for r in rows]
    return {"cases": rows, "mean_abs_error": sum(errors) / len(errors), "max_abs_error": max(errors),
            "mfu_tables": {None: "default (bundled tables of each case's device and engine)",
                           "none": "none (roofline)"}.get(mfu_tables, mfu_tables)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--mfu-tables", default=None, help="table directory (per-device subdirectories allowed)")
    parser.add_argument("--published", default=str(DEFAULT_PUBLISHED), help="published.yaml path")
    args = parser.parse_args(argv)
    published = Path(args.published)
    if not published.is_file():
        print(f"validate_published: {published} not found (pass --published PATH to a published.yaml)",
              file=sys.stderr)
        return 2
    try:
        report = validate(published, args.mfu_tables)
    except InferSimError as exc:
        print(f"validate_published: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    from tabulate import tabulate

    rows = [[r["id"], f"{r['actual_tgs']:,.0f}", f"{r['predicted_tgs']:,.0f}", f"{100 * r['error']:+.1f}%",
             f"{r['original_infersim_tgs']:,}" if r["original_infersim_tgs"] else "-", r["source"]]
            for r in report["cases"]]
    print(f"kernel tables: {report['mfu_tables']}")
    print(tabulate(rows, headers=["case", "measured TGS", "predicted TGS", "error", "original InferSim", "source"],
                   disable_numparse=True))
    print(f"mean absolute error {100 * report['mean_abs_error']:.1f}%, largest {100 * report['max_abs_error']:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
