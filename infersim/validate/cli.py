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

    if args.reference:
        reference_path = Path(args.reference)
        if not reference_path.is_file():
            raise InferSimError(f"--reference {args.reference}: no such file")
    else:
        found = default_reference()
        if found is None:
            raise InferSimError(f"no reference file at {REFERENCE_RELATIVE} (beside the repository or the current "
                                "directory): pass --reference PATH to a file in the format of validation.yaml")
        reference_path = found
    points_path = Path(args.points) if args.points else POINTS_FILE
    reference = load_reference(reference_path)
    mapping = load_mapping(points_path)
    result = evaluate(reference, mapping, reference_path=str(reference_path), points_file=points_path.name,
                      mfu_tables=args.mfu_tables, only=args.point)
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
