"""`infersim plot RESULT.json` and `infersim roofline --config X.yaml` (`--plot FILE` of the main run: infersim.cli.main).

The figures come from `infersim.plot`; this layer reads files, checks where pictures go (before
any simulation runs), writes them and says where.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.base.outputs import inputs_of, replacing
from infersim.plot import FIGURE_KINDS, choose_figure, draw, load_result
from infersim.plot.backend import check_picture_path, save_figure

#: roofline's picture where no --out names one
DEFAULT_ROOFLINE = "roofline.png"

STAGE_CHOICES = {"both": ("prefill", "decode"), "prefill": ("prefill",), "decode": ("decode",)}

PLOT_EPILOG = textwrap.dedent("""\
    figures (chosen from the file's keys; --kind forces one):
      breakdown  main run: prefill and decode step time by module, coloured by bound;
                 sweep: the metric per configuration, coloured by its decode bound
      roofline   main run: the card's compute and memory ceilings, each module at its
                 arithmetic intensity and achieved FLOP/s
      compare    compare --format json: measured vs predicted per module (trace) or per metric (bench)
      validate   validation cases: log-log measured vs predicted, +-15% band, outliers labelled
      sweep      sweep --out FILE.json/.csv: --metric against --x, one line per --series value
      serve      serve --format json: throughput vs p50/p99 TTFT and TPOT over a rate sweep, SLO,
                 TTFT/TPOT histograms when per-request records are present
    The picture format follows the --out extension: .png, .svg or .pdf.
    examples:
      infersim --config qwen3-30b.yaml --format json > run.json
      infersim plot run.json --out breakdown.png
      infersim plot run.json --kind roofline --stage decode --out roofline.png
      infersim sweep --config qwen3-30b.yaml --grid deployment.ffn.ep=1,2,4 \\
          --grid workload.decode_batch_per_gpu=16..256 --out sweep.json
      infersim plot sweep.json --metric tgs --x decode_batch_per_gpu --series ep --out sweep.png""")


def default_picture_path(result_path: str, figure_kind: str) -> str:
    """RESULT.json -> RESULT-<figure>.png beside it (stdin: <figure>.png here)."""
    if result_path == "-":
        return f"{figure_kind}.png"
    path = Path(result_path)
    return str(path.with_name(f"{path.stem}-{figure_kind}.png"))


def plot_command(args: argparse.Namespace) -> int:
    inputs = {"RESULT": None if args.result == "-" else args.result}
    if args.out:
        check_picture_path(args.out, inputs=inputs)
    data = load_result(args.result)
    figure_kind = choose_figure(data, args.kind, args.result)
    _check_figure_options(args, figure_kind)
    out = args.out or default_picture_path(args.result, figure_kind)
    check_picture_path(out, inputs=inputs)
    # a picture the user named may be replaced; one InferSim named says when it replaces a file
    note = f" ({figure_kind})" if args.out else replacing(out, figure_kind)
    try:
        drawing = draw(data, figure_kind, STAGE_CHOICES[args.stage or "both"], args.metric or "tpot_ms", args.x,
                       args.series, args.where)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        # the file is arbitrary JSON: a value of the wrong shape where the figure reads it is bad input
        raise InferSimError(f"{args.result}: cannot draw a {figure_kind} figure from it: a value is not what the "
                            f"command writes ({type(exc).__name__}: {exc})") from None
    save_figure(drawing.figure, out)
    print(f"wrote {out}{note}")
    return 0


def _check_figure_options(args: argparse.Namespace, figure_kind: str) -> None:
    """An option only another figure reads is refused, not ignored: a breakdown drawn with
    --metric tgs still shows TPOT."""
    given = [("--metric", args.metric), ("--x", args.x), ("--series", args.series),
             ("--where", " ".join(args.where) or None)] if figure_kind != "sweep" else []
    given += [("--stage", args.stage)] if figure_kind != "roofline" else []
    for flag, value in given:
        if value is not None:
            reader = "roofline" if flag == "--stage" else "sweep"
            raise InferSimError(f"{flag} {value}: only the {reader} figure reads it, and {args.result} is drawn as "
                                f"{figure_kind}: drop {flag}, or give --kind {reader} where the file draws as one")


def roofline_command(args: argparse.Namespace) -> int:
    from infersim.cli.main import load_config_from_args, print_notes
    from infersim.cli.report import to_json_data
    from infersim.run.simulate import simulate

    out = args.out or DEFAULT_ROOFLINE
    check_picture_path(out, inputs=inputs_of(args))
    note = " (roofline)" if args.out else replacing(out, "roofline")
    config = load_config_from_args(args)
    print_notes(config)
    data = to_json_data(simulate(config))
    drawing = draw(data, "roofline", STAGE_CHOICES[args.stage])
    save_figure(drawing.figure, out)
    print(f"wrote {out}{note}")
    return 0


def register(subparsers: Any) -> None:
    plot = subparsers.add_parser(
        "plot", help="draw a saved result (JSON of the run, sweep, compare, validate or serve commands)",
        description="Turn the JSON a command emitted into a picture: module breakdown, roofline, "
                    "predicted vs measured, sweep curves or serving curves. Needs matplotlib (pip install '.[plot]' in the clone).",
        epilog=PLOT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    plot.add_argument("result", metavar="RESULT", help="result file: .json (or - for stdin), or a sweep's .csv")
    plot.add_argument("--out", default=None, metavar="FILE",
                      help="picture to write: .png, .svg or .pdf (default: RESULT-<figure>.png beside RESULT)")
    plot.add_argument("--kind", choices=FIGURE_KINDS, default=None, help="figure to draw (default: from the data)")
    plot.add_argument("--stage", choices=tuple(STAGE_CHOICES), default=None,
                      help="roofline: stages to draw (default both)")
    plot.add_argument("--metric", default=None, help="sweep: the metric on the y axis (default tpot_ms)")
    plot.add_argument("--x", default=None, metavar="FIELD",
                      help="sweep: the field on the x axis (default: the first swept field with several values)")
    plot.add_argument("--series", default=None, metavar="FIELD",
                      help="sweep: one line per value of this field (default: the next swept field)")
    plot.add_argument("--where", action="append", default=[], metavar="FIELD=VALUE",
                      help="sweep: keep only rows with this value (repeatable)")
    plot.set_defaults(handler=plot_command)

    roofline = subparsers.add_parser(
        "roofline", help="simulate a run config and draw its roofline (ceilings and every module)",
        description="The hardware card's datasheet and derated compute ceilings per format and its memory "
                    "ceiling, with each module of prefill and decode at its arithmetic intensity (FLOP/byte) "
                    "and achieved FLOP/s; the ridge point marked. Needs matplotlib (pip install '.[plot]' in the clone).")
    roofline.add_argument("--config", default=None,
                          help="run config: a path, or the name of a bundled example (e.g. qwen3-30b.yaml); or name "
                               "the run with --model, --hardware and the flags below")
    roofline.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                          help="override any config field (repeatable)")
    roofline.add_argument("--mfu-tables", default=None, metavar="DIR",
                          help="directory of measured kernel tables (overrides the config's mfu_tables)")
    roofline.add_argument("--out", default=None, metavar="FILE",
                          help=f"picture to write: .png, .svg or .pdf (default {DEFAULT_ROOFLINE})")
    roofline.add_argument("--stage", choices=tuple(STAGE_CHOICES), default="both", help="stages to draw")
    from infersim.cli.main import add_run_flags

    add_run_flags(roofline)
    roofline.set_defaults(handler=roofline_command)
