"""`infersim calibrate`: fit a GPU and engine's constants to measured serving runs, write a profile."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.serve.trainval import STAGE_WINDOW_S

PROFILE_HEADER = """\
# InferSim calibration profile: constants of one GPU and engine fitted to measured serving runs
# (`infersim calibrate`). Apply it with the run config key `calibration: {name}`, --calibration {name}
# or --set calibration={name}. constants: value +- uncertainty (one sd) next to the card value they
# replace (prior); refused: constants the data did not determine (kept at their card values);
# prediction_interval: measured / predicted, 5th-95th percentile over leave-one-experiment-out
# predictions; points: every measured value used, predicted before, after and held out. SI units
# (seconds) for the constants; milliseconds for the latencies, as the reference file gives them.
"""


def _calibrate(args: argparse.Namespace) -> int:
    from infersim.calibrate.fit import FitSettings
    from infersim.calibrate.run import calibrate

    if args.out:  # before the fit: a profile written over a measured run would lose the measurements
        from infersim.base.outputs import check_output_path

        check_output_path(args.out, "--out", {"--reference": args.reference, "--bench-result": args.bench_result,
                                               "--trace": args.trace, "--config": args.config,
                                               "--hardware": args.hardware, "--engine": args.engine})
    names = [n.strip() for part in args.constants for n in part.split(",") if n.strip()] if args.constants else None
    settings = FitSettings(iterations=int(args.iterations))
    outcome = calibrate([Path(p) for p in args.reference], args.hardware, args.engine, names, settings,
                        None if args.max_stage_s == 0 else args.max_stage_s,
                        [Path(p) for p in args.bench_result], args.config, [Path(p) for p in args.trace])
    if args.out:
        write_profile(Path(args.out), outcome.profile)
    if args.format == "json":
        print(json.dumps(outcome.profile, indent=2))
    else:
        print(to_text(outcome, args.out))
    return 0


def write_profile(path: Path, profile: dict[str, Any]) -> None:
    import yaml

    try:
        path.write_text(PROFILE_HEADER.format(name=path.name) + yaml.safe_dump(profile, sort_keys=False, width=120))
    except OSError as exc:
        raise InferSimError(f"--out {path}: cannot write ({exc.strerror})") from None


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:.1f}%"


def _constant_rows(outcome: Any) -> list[list[str]]:
    from infersim.cards.calibration import format_value

    rows = []
    for f in outcome.result.fitted:
        c = f.constant
        edge = " (at the edge of its range)" if math.isclose(f.value, c.low) or math.isclose(f.value, c.high) else ""
        unc = f"{f.sd:.2g}" if c.log else format_value(c, f.sd)
        rows.append([c.name, format_value(c, f.prior), f"{format_value(c, f.value)} +- {unc}{edge}",
                     f"{f.shrink:.0%}", c.field])
    return rows


def to_text(outcome: Any, out: str | None) -> str:
    from infersim.base.texttable import simple_table

    profile = outcome.profile
    target = profile["applies_to"]
    points = sum(e["points"] for e in profile["errors"].values())
    lines = [f"calibration of {target['hardware']} + {target['engine']} {target['engine_version']} on "
             f"{len(outcome.experiments)} experiment(s), {points} measured points ({', '.join(outcome.reference.sources)})"]
    if outcome.max_stage_s and any(e.trace is None for e in outcome.experiments):
        lines.append(f"  at most {outcome.max_stage_s:g} s of each stage counted, in the middle of one twice as long; "
                     f"{outcome.result.evaluations} simulated runs")
    lines += [f"  not used: {s}" for s in outcome.skipped]
    lines.append("")
    if outcome.result.fitted:
        lines.append(simple_table(_constant_rows(outcome), ["constant", "card", "fitted", "sd/prior sd", "card field"]))
    else:
        lines.append("no constant fitted: none is both determined by the data and better held out (the cards stand)")
    for c, why in outcome.result.refused:
        lines.append(f"  refused {c.name}: {why}")
    lines.append("")
    rows = []
    for metric, e in profile["errors"].items():
        held = e["median_abs_held_out"]
        gain = f"{(e['median_abs_before'] - held) * 100:+.1f} pts" if held is not None else "-"
        interval = profile["prediction_interval"].get(metric)
        band = f"x{interval['low']:.2f} .. x{interval['high']:.2f}" if interval else "-"
        rows.append([metric, e["points"], _pct(e["median_abs_before"]), _pct(e["median_abs_after"]), _pct(held),
                     gain, band])
    lines.append(simple_table(rows, ["metric", "points", "before", "after (in sample)", "held out",
                                     "held-out gain", "90% interval"]))
    lines.append("median |predicted / measured - 1|; held out: each experiment predicted by constants fitted "
                 "without it; interval: measured / predicted")
    if out:
        lines.append(f"profile written to {out} (apply: --calibration {out})")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    from infersim.cards.calibration import CONSTANTS
    from infersim.cli.main import number_arg

    p = subparsers.add_parser(
        "calibrate",
        help="fit a GPU and engine's physical constants to your measured serving runs; write a calibration profile",
        description="Simulates every experiment of the reference files, fits the named card constants (kernel "
                    "time per family, host and API-server times, KV transfer efficiency) by a MAP fit toward the "
                    "card values (kernel families also from profiler traces), refuses those the data do not determine, and prints the median error before, "
                    "after and held out (leave one experiment out) per metric. docs/calibration.md")
    p.add_argument("--reference", action="append", default=[], metavar="PATH",
                   help="measured serving runs: a file of `experiments:` in the form of vllm_serving_trainval.yaml "
                        "(repeatable)")
    p.add_argument("--bench-result", action="append", default=[], metavar="FILE",
                   help="a vllm bench serve / sglang.bench_serving result file, each result one run (repeatable; "
                        "with --config)")
    p.add_argument("--trace", action="append", default=[], metavar="FILE",
                   help="a PyTorch-profiler trace (file, rank directory or glob, as compare --trace reads): its "
                        "kernel time per module fits the kernel-family time scales (repeatable; with --config)")
    p.add_argument("--config", default=None, metavar="RUN.yaml",
                   help="the run config (model, GPUs, layout, engine, batch) the --bench-result runs or the "
                        "--trace used")
    p.add_argument("--hardware", "--gpu", dest="hardware", default=None, metavar="NAME",
                   help="hardware card the runs used (where the file names none), e.g. h100-sxm")
    p.add_argument("--engine", default=None, metavar="NAME[@VERSION]",
                   help="engine card the runs used (where the file names none), e.g. vllm@0.15")
    p.add_argument("--constants", action="append", default=[], metavar="NAME[,NAME]",
                   help="the constants to consider (default all: " + ", ".join(c.name for c in CONSTANTS) + ")")
    p.add_argument("--max-stage-s", type=number_arg(ge=0), default=STAGE_WINDOW_S, metavar="S",
                   help=f"count at most S seconds of each load stage, in the middle of one twice as long (default "
                        f"{STAGE_WINDOW_S:g}, as validate; 0: as measured)")
    p.add_argument("--iterations", type=number_arg(whole=True, gt=0), default=2, metavar="N", help="Gauss-Newton steps (default 2)")
    p.add_argument("--out", default=None, metavar="PROFILE.yaml", help="write the calibration profile here")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(handler=_calibrate)
