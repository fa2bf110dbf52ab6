"""`infersim validate`: predicted vs measured on a reference file of public measurements."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from infersim.errors import InferSimError

REFERENCE_RELATIVE = Path("..") / "shared" / "reference" / "validation.yaml"


def default_reference() -> Path | None:
    """../shared/reference/validation.yaml beside the repository root, else beside the current directory."""
    repo = Path(__file__).resolve().parents[2]
    for base in (repo, Path.cwd()):
        candidate = (base / REFERENCE_RELATIVE).resolve()
        if candidate.is_file():
            return candidate
    return None


def _validate(args: argparse.Namespace) -> int:
    from infersim.validate import POINTS_FILE
    from infersim.validate.evaluate import evaluate, load_reference
    from infersim.validate.mapping import load_mapping
    from infersim.validate.report import to_json_data, to_text

    from infersim.validate.measured import bundled_files, load_measured

    measured_paths = [Path(p) for p in args.measured] if args.measured else bundled_files()
    for path in measured_paths:
        if not path.is_file():
            raise InferSimError(f"--measured {path}: no such file")
    measured = load_measured(measured_paths)
    if args.reference:
        reference_path: Path | None = Path(args.reference)
        if not reference_path.is_file():
            raise InferSimError(f"--reference {args.reference}: no such file")
    else:
        reference_path = default_reference()
        if reference_path is None and not measured.reference:
            raise InferSimError(f"no reference file at {REFERENCE_RELATIVE} (beside the repository or the current "
                                "directory): pass --reference PATH to a file in the format of validation.yaml, or "
                                "--measured PATH to a GPU validation file (benchmarks/gpu/measure_e2e.py)")
    points_path = Path(args.points) if args.points else POINTS_FILE
    reference = load_reference(reference_path) if reference_path is not None else {}
    mapping = load_mapping(points_path)
    clash = sorted(set(reference) & set(measured.reference))
    if clash:
        raise InferSimError(f"point id {clash[0]} is both in the reference file and in a measured file")
    reference.update(measured.reference)
    mapping.update(measured.mapping)
    shown = " + ".join([str(reference_path)] * (reference_path is not None) + measured.files)
    if not measured_paths:
        shown += " (no GPU validation file: infersim/validate/measured/ holds none yet; benchmarks/gpu/measure_e2e.py " \
                 "writes them, docs/measuring-on-gpus.md)"
    result = evaluate(reference, mapping, reference_path=shown, points_file=points_path.name,
                      mfu_tables=args.mfu_tables, only=args.point)
    result.not_expressed += measured.not_expressed
    if args.format == "json":
        print(json.dumps(to_json_data(result), indent=2))
    else:
        print(to_text(result))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="compare predictions with public measurements (kernels, stages, serving) from a reference file",
        description="Maps every point of a reference file (format of ../shared/reference/validation.yaml) that "
                    "the simulator can express to a run (mapping: infersim/validate/points.yaml), prints measured, "
                    "predicted, signed error and the dominant module per point, then median/mean |error|, "
                    "signed mean and the share within 15%, overall, by source and by kind, then every point it "
                    "cannot express and why.")
    p.add_argument("--reference", default=None, metavar="PATH",
                   help=f"reference file (default: {REFERENCE_RELATIVE} beside the repository or current directory)")
    p.add_argument("--measured", action="append", default=[], metavar="PATH",
                   help="a GPU validation file written by benchmarks/gpu/measure_e2e.py, compared beside the reference "
                        "(repeatable; default: the bundled infersim/validate/measured/*.yaml)")
    p.add_argument("--points", default=None, metavar="PATH",
                   help="mapping of points to runs (default: the bundled infersim/validate/points.yaml)")
    p.add_argument("--point", action="append", default=[], metavar="ID",
                   help="compare only this point id or '<id>/<sub-metric>' (repeatable)")
    p.add_argument("--mfu-tables", default=None, metavar="DIR",
                   help="measured kernel tables: DIR/<hardware card> per card, or one device's directory "
                        "(e.g. mfu_tables/imported); none = roofline everywhere; default: each run's bundled "
                        "tables for its device and engine (kernel points: roofline)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(handler=_validate)
