"""`infersim validate`: predicted vs measured on a reference file of public measurements."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from infersim.base.errors import InferSimError

if TYPE_CHECKING:
    from infersim.validate.measured import MeasuredSet

#: the groups of points `--source` selects: the shipped public measurements (with the bundled GPU
#: runs), and the public vLLM serving runs (opt-in: one serving simulation per run, ~30 s)
PUBLIC = "public"
TRAINVAL = "trainval-vllm"


def _validate(args: argparse.Namespace) -> int:
    from infersim.validate import DEFAULT_REFERENCES, POINTS_FILE
    from infersim.validate.evaluate import evaluate, load_references
    from infersim.validate.mapping import load_mapping
    from infersim.validate.measured import bundled_files, load_measured
    from infersim.validate.report import to_json_data, to_text

    chosen = set(args.source)
    given = [Path(p) for p in args.reference]
    for path, name in zip(given, args.reference):
        if not path.is_file():
            raise InferSimError(f"--reference {name}: {'is a directory, not a file' if path.is_dir() else 'no such file'}")
    serving_files = _serving_runs_files(given)
    point_files = [path for path in given if path not in serving_files]
    # the shipped public measurements: asked for, or nothing else named
    defaults = PUBLIC in chosen or not (chosen or given)
    public = defaults or bool(point_files or args.measured)
    measured_paths = [Path(p) for p in args.measured] if args.measured else bundled_files() if public else []
    for path in measured_paths:
        if not path.is_file():
            raise InferSimError(f"--measured {path}: {'is a directory, not a file' if path.is_dir() else 'no such file'}")
    measured = load_measured(measured_paths)
    runs = ([None] if TRAINVAL in chosen else []) + serving_files
    for runs_file in runs:
        _add_serving_runs(measured, runs_file)
    paths = point_files or (list(DEFAULT_REFERENCES) if defaults else [])
    for path in paths:
        if not path.is_file():
            raise InferSimError(f"{path}: the shipped public measurements are missing from this installation")
    points_path = Path(args.points) if args.points else POINTS_FILE
    reference = load_references(paths)
    mapping = load_mapping(points_path)
    clash = sorted(set(reference) & set(measured.reference))
    if clash:
        raise InferSimError(f"point id {clash[0]} is both in a reference file and in a measured file")
    reference.update(measured.reference)
    mapping.update(measured.mapping)
    shown = ", ".join([_shown(p) for p in paths] + measured.files)
    # the trainval points are mapped from their experiments' own stanzas (infersim/validate/trainval.py)
    mapped = [points_path.name] * bool(paths) + ["trainval.py (each experiment's stanzas)"] * bool(runs)
    result = evaluate(reference, mapping, reference_path=shown, points_file=" + ".join(mapped),
                      mfu_tables=args.mfu_tables, only=args.point, calibration=args.calibration)
    result.not_expressed += measured.not_expressed
    # under a profile, the same points on the cards as well: the statistics of both side by side
    on_cards = evaluate(reference, mapping, reference_path=shown, points_file=" + ".join(mapped),
                        mfu_tables=args.mfu_tables, only=args.point) if args.calibration else None
    if args.format == "json":
        print(json.dumps(to_json_data(result, on_cards), indent=2))
    else:
        print(to_text(result, summary_only=args.summary, on_cards=on_cards))
    return 0


def _serving_runs_files(paths: list[Path]) -> list[Path]:
    """The reference files in the format of the serving runs (vllm_serving_trainval.yaml): read as those runs."""
    if not paths:
        return []
    from infersim.validate.trainval import is_serving_runs_file

    return [path for path in paths if is_serving_runs_file(path)]


def _add_serving_runs(measured: MeasuredSet, path: Path | None) -> None:
    """The serving runs of `path` (None: the shipped vLLM runs), each stage's points beside the others."""
    from infersim.validate.trainval import load_trainval

    serving = load_trainval(path)
    clash = sorted(set(serving.reference) & set(measured.reference))
    if clash:
        raise InferSimError(f"point id {clash[0]} of {serving.files[0]} is also in another file compared: give "
                            "each file once (a copy of the shipped runs is not compared beside --source trainval-vllm)")
    measured.reference.update(serving.reference)
    measured.mapping.update(serving.mapping)
    measured.not_expressed += serving.not_expressed
    measured.files += [_shown(Path(f)) for f in serving.files]


def _shown(path: Path) -> str:
    """A reference file as the report names it: a shipped one by its place in the package."""
    from infersim.validate import PUBLIC_DIR

    try:
        return f"infersim/validate/public/{path.resolve().relative_to(PUBLIC_DIR)} (shipped)"
    except ValueError:
        return str(path)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="compare predictions with public measurements (kernels, stages, serving) from a reference file",
        description="Maps every point of the reference files (default: the public measurements shipped in "
                    "infersim/validate/public/validation.yaml, sources included) that "
                    "the simulator can express to a run (mapping: infersim/validate/points.yaml), prints measured, "
                    "predicted, signed error and the dominant module per point, then median/mean |error|, "
                    "signed mean and the share within 15%, overall, by source and by kind, then every point it "
                    "cannot express and why.")
    p.add_argument("--reference", action="append", default=[], metavar="PATH",
                   help="reference file in the format of validation.yaml, or serving runs in the format of "
                        "vllm_serving_trainval.yaml (repeatable: the points of every file are compared; ids must "
                        "differ); default: the shipped public measurements")
    p.add_argument("--measured", action="append", default=[], metavar="PATH",
                   help="a GPU validation file written by benchmarks/gpu/measure_e2e.py, compared beside the reference "
                        "(repeatable; default: the bundled infersim/validate/measured/*.yaml)")
    p.add_argument("--source", action="append", default=[], choices=(PUBLIC, TRAINVAL),
                   help=f"which points (repeatable): {PUBLIC} = the shipped public measurements and the bundled GPU "
                        f"runs (default); {TRAINVAL} = the 13 public vLLM 0.15 serving runs on H100 "
                        "(infersim/validate/public/vllm_serving_trainval.yaml: per load stage TTFT, ITL and E2E; "
                        "one serving simulation per run, so not in the default)")
    p.add_argument("--points", default=None, metavar="PATH",
                   help="mapping of points to runs (default: the bundled infersim/validate/points.yaml)")
    p.add_argument("--point", action="append", default=[], metavar="ID",
                   help="compare only this point id or '<id>/<sub-metric>' (repeatable)")
    p.add_argument("--mfu-tables", default=None, metavar="DIR",
                   help="measured kernel tables: DIR/<hardware card> per card, or one device's directory "
                        "(e.g. mfu_tables/imported); none = roofline everywhere; default: each run's bundled "
                        "tables for its device and engine (kernel points: roofline)")
    p.add_argument("--calibration", default=None, metavar="PROFILE",
                   help="a calibration profile (infersim calibrate --out): the points on its GPU and engine run "
                        "calibrated, said in each one's note; the others run on the cards as they are")
    p.add_argument("--summary", action="store_true",
                   help="text: the accuracy statistics only (overall, by source, by kind), not every point")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(handler=_validate)
