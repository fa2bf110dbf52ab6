"""`infersim mfu ...`: measure kernel tables on this GPU, or import published ones.

    infersim mfu bench --kernels gemm,grouped_gemm,attn_prefill,attn_decode --out mfu_tables/h100-sxm/
    infersim mfu import-infersim ../shared/reference/infersim_bench_data --out mfu_tables/imported/
    infersim mfu compare aiconfigurator/b200/trtllm-1.3.0rc20 aiconfigurator/gb200/trtllm-1.3.0rc20

The core CLI (infersim.cli.main) calls `register`; `python -m infersim.tabletools.cli ...` runs these
subcommands on their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Sequence

from infersim.cli.main import number_arg
from infersim.base.errors import InferSimError

if TYPE_CHECKING:  # imported where used: the core CLI registers these subcommands on every run
    from infersim.tabletools.compare import TableComparison


def _csv_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _int_list(text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers >= 1, through the schema's number rule."""
    parse = number_arg(whole=True, gt=0)
    return tuple(int(parse(part)) for part in _csv_list(text))


# the schema's number rule: finite and positive (nan, inf and 0 are refused)
_positive_float = number_arg(gt=0)


def _budget_list(text: str) -> tuple[tuple[str, float], ...]:
    """FAMILY=SECONDS,... in order; seconds through the schema's number rule (finite, >= 0)."""
    parse = number_arg(ge=0)
    budgets = []
    for part in _csv_list(text):
        name, equals, seconds = part.partition("=")
        if not equals:
            raise argparse.ArgumentTypeError(f"{part!r}: expected FAMILY=SECONDS")
        budgets.append((name.strip(), float(parse(seconds.strip()))))
    return tuple(budgets)


def invoked_command(argv: Sequence[str] | None = None) -> str:
    """The command line as the user typed it (python -m infersim ... when run as a module)."""
    args = list(sys.argv if argv is None else argv)
    program = args[0] if args else "infersim"
    if program.endswith("__main__.py"):
        head = ["python", "-m", Path(program).parent.name]
    elif program.endswith("cli.py") and "mfu" in Path(program).parts:
        head = ["python", "-m", "infersim.tabletools.cli"]
    else:
        head = [Path(program).name]
    return shlex.join(head + args[1:])


def _command_of(args: argparse.Namespace) -> str:
    return getattr(args, "command_line", None) or invoked_command()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `mfu` command group (`bench`, `import-infersim`) to the core CLI."""
    mfu = subparsers.add_parser("mfu", help="kernel efficiency tables: measure on this GPU, or import published ones",
                                description="Kernel efficiency (MFU) tables: see mfu_tables/FORMAT.md.")
    commands = mfu.add_subparsers(dest="mfu_command", metavar="SUBCOMMAND", required=True)

    bench = commands.add_parser(
        "bench", help="time GEMM, grouped GEMM, attention and elementwise kernels and host costs on this GPU",
        description="Time the kernels HF transformers launches for the model cards on this GPU (and a comparison "
                    "grid), plus the host cost of an eager launch, and write a table directory with its "
                    "provenance, row by row: a run that stops keeps what it measured.")
    bench.add_argument("--kernels", type=_csv_list, default=None,
                       help="comma-separated families: host, elementwise, gemm, grouped_gemm, attn_prefill, "
                            "attn_decode (default: all)")
    bench.add_argument("--out", type=Path, required=True,
                       help="output table directory, e.g. mfu_tables/measured/h100-sxm/torch-2.11.0/")
    bench.add_argument("--models", type=Path, default=None,
                       help="directory of model cards to derive shapes from (default: the bundled models/)")
    bench.add_argument("--model", dest="model_names", type=_csv_list, default=None,
                       help="only these cards (comma-separated names; default: the GPU validation set's models, "
                            "llama-3.1-70b, llama-2-7b, mixtral-8x7b, qwen3-235b-a22b, deepseek-v3)")
    bench.add_argument("--dtypes", type=_csv_list, default=("bf16", "fp8"),
                       help="GEMM dtypes of the comparison grid (default bf16,fp8; model shapes are bf16)")
    bench.add_argument("--tp", type=_int_list, default=None, help="TP sizes of the model shapes (default 1)")
    bench.add_argument("--m", dest="m_values", type=_int_list, default=None, help="GEMM M values (tokens)")
    bench.add_argument("--ep", type=_int_list, default=None, help="EP sizes for grouped GEMM (default 1)")
    bench.add_argument("--quick", action="store_true", help="a reduced grid (a few minutes)")
    bench.add_argument("--device", default="cuda",
                       help="cuda (default) or cpu: a smoke run of the real harness on the CPU with tiny shapes, "
                            "which measures nothing about any GPU")
    bench.add_argument("--warmup", type=number_arg(whole=True, ge=0), default=5, help="warm-up runs per kernel (default 5)")
    bench.add_argument("--repeats", type=number_arg(whole=True, gt=0), default=20,
                       help="timed runs per kernel, median kept (default 20; fewer for long kernels)")
    bench.add_argument("--time-budget", "--max-seconds", dest="time_budget", type=_positive_float, default=None,
                       metavar="SECONDS", help="end the run cleanly within this many seconds (the plan is ordered "
                                               "so that a cut run still covers every family)")
    bench.add_argument("--family-budgets", type=_budget_list, default=None, metavar="FAMILY=SECONDS,...",
                       help="measure these families one after the other, in the order given, each until its own "
                            "deadline (the rest of a family that would run past it is not measured, and the next "
                            "starts): gemm_bf16, gemm_fp8, attn_prefill, attn_decode, grouped_gemm, elementwise, "
                            "host; only the families named are measured")
    bench.add_argument("--summary", type=Path, default=None, metavar="JSON",
                       help="write what each family planned, measured and left out, with timings, to this file "
                            "(rewritten as the run goes)")
    bench.add_argument("--hardware", default=None,
                       help="hardware card for the peak FLOP/s (default: matched from the device name)")
    bench.add_argument("--peak-bf16", type=_positive_float, default=None, help="dense bf16 FLOP/s (overrides the card)")
    bench.add_argument("--peak-fp8", type=_positive_float, default=None, help="dense fp8 FLOP/s (overrides the card)")
    bench.add_argument("--force", action="store_true",
                       help="write into a directory that already holds something: replaces only the tables InferSim "
                            "wrote there (as its provenance lists them), never any other file")
    bench.set_defaults(handler=bench_command)

    imp = commands.add_parser("import-infersim", help="convert the original InferSim's published kernel tables",
                              description="Convert kernel tables in the original InferSim's bench_data format "
                                          "(gemm/, grouped_gemm/, mha/, mla/ per device) into one table directory "
                                          "per device under --out, provenance included.")
    imp.add_argument("src_dir", type=Path, metavar="SRC_DIR", help="e.g. ../shared/reference/infersim_bench_data")
    imp.add_argument("--out", type=Path, required=True, help="output root: one directory per device is written")
    imp.add_argument("--devices", type=_csv_list, default=(), help="only these devices (default: all found)")
    imp.add_argument("--force", action="store_true",
                   help="write into a directory that already holds something: replaces only the tables InferSim "
                        "wrote there (as its provenance lists them), never any other file")
    imp.set_defaults(handler=import_command)

    aic = commands.add_parser(
        "import-aiconfigurator", help="convert NVIDIA aiconfigurator's kernel database (needs the extra 'aic')",
        description="Convert the kernel tables of the installed aiconfigurator-core (GEMM, context/generation "
                    "attention, MoE) into one table directory per device and engine version under --out "
                    "(<device>/<framework>-<version>/), provenance and Apache-2.0 notice included. "
                    "Needs: pip install aiconfigurator-core pyarrow (in the clone: pip install '.[aic]').")
    aic.add_argument("--out", type=Path, default=None,
                     help="output root (default: the bundled mfu_tables/aiconfigurator/)")
    aic.add_argument("--devices", type=_csv_list, default=(),
                     help="hardware card names (default: all with an aiconfigurator system: "
                          "h100-sxm, h200, b200, gb200, b300, gb300, a100-sxm-80g, l40s, rtx-pro-6000)")
    aic.add_argument("--frameworks", type=_csv_list, default=(), help="trtllm, sglang, vllm (default: all)")
    aic.add_argument("--version", default=None,
                     help="engine version (default: each engine's current version in aiconfigurator)")
    aic.add_argument("--compact", action="store_true",
                     help="thinned grids, as bundled: a point is left out only where interpolating the points kept "
                          "reproduces it within --tolerance")
    aic.add_argument("--tolerance", type=float, default=None,
                     help="with --compact: the largest relative error of a point left out (default 0.03)")
    aic.add_argument("--force", action="store_true",
                     help="write into a directory that already holds something: replaces only the tables InferSim "
                          "wrote there (as its provenance lists them), never any other file")
    aic.set_defaults(handler=import_aic_command)

    cmp = commands.add_parser(
        "compare", help="compare two table directories shape by shape; flag slices that disagree",
        description="Match the rows of identical shape in the CSV files two table directories share, take "
                    "ratio = latency in B / latency in A, and list per file the median, p10 and p90 ratio and "
                    "every slice (one measured sweep: a layout at fixed outer axes, over tokens, m, KV length "
                    "or message size) whose median ratio differs from its file's by more than --threshold. "
                    "Two devices of one die, or two runs on one device, differ by one device-wide factor; a "
                    "flagged slice is an outlier in one of them. The tables are not changed.")
    cmp.add_argument("dir_a", metavar="DIR_A", help="table directory, or a bundled one relative to mfu_tables/ "
                                                    "(e.g. aiconfigurator/b200/trtllm-1.3.0rc20)")
    cmp.add_argument("dir_b", metavar="DIR_B", help="the table directory compared with DIR_A (ratios are B / A)")
    cmp.add_argument("--threshold", type=number_arg(gt=1), default=1.25,
                     help="flag a slice whose median ratio is more than this factor above or below its file's "
                          "(default 1.25)")
    cmp.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    cmp.set_defaults(handler=compare_command)
    _register_from_trace(commands)


def _register_from_trace(commands: argparse._SubParsersAction) -> None:
    learn = commands.add_parser(
        "from-trace", help="learn kernel tables from a PyTorch-profiler trace (record_shapes=True)",
        description="Write a table directory (mfu_tables/FORMAT.md) from the GEMM, attention and grouped-GEMM "
                    "operators of a Kineto trace, at the shapes the run config's model asks for, with the trace as "
                    "provenance; then predict the traced steps with it. Use it with --mfu-tables DIR. See "
                    "docs/traces.md.")
    learn.add_argument("trace", metavar="TRACE", help="trace file (.json or .json.gz) of one rank")
    learn.add_argument("--config", required=True, help="run config of the traced run (model, hardware, deployment)")
    learn.add_argument("--out", type=Path, required=True, help="output table directory")
    learn.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                       help="override a config field (repeatable); the workload comes from the trace")
    learn.add_argument("--rank", default=None, metavar="R", help="TP rank (or GPU of a merged file) to learn from")
    learn.add_argument("--step-regions", default=None, metavar="NAME,...", help="your record_function step regions")
    learn.add_argument("--rules", action="append", default=[], metavar="YAML", help="extra kernel rules (repeatable)")
    learn.add_argument("--force", action="store_true",
                       help="write into a directory that already holds something: replaces only the tables InferSim "
                            "wrote there (as its provenance lists them), never any other file")
    learn.set_defaults(handler=from_trace_command)


def from_trace_command(args: argparse.Namespace) -> int:
    from infersim.trace.cli import run_from_trace

    command = _command_of(args)
    if "from-trace" not in command:  # called from Python: the command its arguments stand for
        argv = ["python", "-m", "infersim", "mfu", "from-trace", args.trace, "--config", args.config, "--out",
                str(args.out)]
        argv += [f"--set={value}" for value in args.overrides]
        argv += [f"--{name.replace('_', '-')}={value}" for name, value in (("rank", args.rank),
                                                                         ("step_regions", args.step_regions))
                 if value is not None]
        argv += [f"--rules={value}" for value in args.rules]
        argv += ["--force"] if getattr(args, "force", False) else []
        command = shlex.join(argv)
    return run_from_trace(args, command)


def _table_dir_arg(text: str, argument: str) -> Path:
    """A table directory as given, else the bundled set of that name under mfu_tables/ (the rule of
    --mfu-tables in config.load_run_config)."""
    from infersim.cards.registry import resolve_table_dir

    found = resolve_table_dir(text)
    if found is not None:
        return found
    bundled = "" if Path(text).is_absolute() else f" (nor a bundled table set mfu_tables/{text})"
    raise InferSimError(f"{argument} {text!r}: no such directory{bundled}")


def compare_command(args: argparse.Namespace) -> int:
    import json

    from infersim.tabletools.compare import compare_tables, comparison_dict

    comparison = compare_tables(_table_dir_arg(args.dir_a, "DIR_A"), _table_dir_arg(args.dir_b, "DIR_B"),
                                args.threshold)
    if args.format == "json":
        print(json.dumps(comparison_dict(comparison), indent=2))
    else:
        print(compare_text(comparison))
    return 0


def compare_text(comparison: TableComparison) -> str:
    from infersim.cards.registry import display_path
    from infersim.base.texttable import simple_table

    def ratio(value: float) -> str:
        return f"{value:.3f}"

    lines = [f"A: {comparison.device_a}, tables {display_path(comparison.dir_a)}",
             f"B: {comparison.device_b}, tables {display_path(comparison.dir_b)}",
             "ratio = latency in B / latency in A for identical shapes (dimensionless; 1.000 = the same time)",
             ""]
    rows = [[f.name, f.family, f.rows_a, f.rows_b, f.matched_rows,
             *([ratio(f.ratios.median), ratio(f.ratios.p10), ratio(f.ratios.p90)] if f.ratios else ["-"] * 3),
             f.slices, len(f.flagged)] for f in comparison.files]
    if comparison.ratios:
        total = comparison.ratios
        rows.append(["all shared files", "", sum(f.rows_a for f in comparison.files),
                     sum(f.rows_b for f in comparison.files), total.rows, ratio(total.median), ratio(total.p10),
                     ratio(total.p90), sum(f.slices for f in comparison.files), len(comparison.flagged)])
    lines.append(simple_table(rows, ["file", "family", "rows A", "rows B", "matched", "median", "p10", "p90",
                                     "slices", "flagged"]))
    for f in comparison.files:
        if f.note:
            lines.append(f"{f.name}: {f.note}")
    for label, names in (("only in A", comparison.only_in_a), ("only in B", comparison.only_in_b)):
        if names:
            lines.append(f"{label}: {', '.join(names)}")
    lines.append("")
    if not comparison.flagged:
        lines.append(f"no slice's median ratio differs from its file's by more than a factor {comparison.threshold:g}")
        return "\n".join(lines)
    lines.append(f"{len(comparison.flagged)} slices whose median ratio differs from their file's median by more "
                 f"than a factor {comparison.threshold:g} (vs file = slice median / file median; furthest first "
                 "within each file):")
    lines.append(simple_table(
        [[name, s.description, f"{s.sweep_axis} {s.sweep_low:g}-{s.sweep_high:g}", s.ratios.rows,
          ratio(s.ratios.median), ratio(s.ratios.minimum), ratio(s.ratios.maximum), ratio(s.deviation)]
         for name, s in comparison.flagged],
        ["file", "slice", "over", "rows", "median", "min", "max", "vs file"]))
    return "\n".join(lines)


def import_aic_command(args: argparse.Namespace) -> int:
    from infersim.cards.registry import bundled_dir
    from infersim.tabletools.aiconfigurator import import_aiconfigurator

    out = args.out or bundled_dir("mfu_tables") / "aiconfigurator"
    from infersim.tabletools.thinning import DEFAULT_TOLERANCE

    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    if not 0 < tolerance < 1:
        raise InferSimError(f"--tolerance {tolerance}: must be between 0 and 1 (a relative error)")
    written = import_aiconfigurator(out, _command_of(args), args.devices or None, args.frameworks or None,
                                    args.version, args.compact, tolerance=tolerance, force=args.force)
    for directory in written:
        print(f"wrote {directory}")
    return 0


def import_command(args: argparse.Namespace) -> int:
    from infersim.tabletools.importer import import_infersim

    written = import_infersim(args.src_dir, args.out, _command_of(args), args.devices or None, force=args.force)
    for directory in written:
        print(f"wrote {directory}")
    return 0


#: the --kernels family of each --family-budgets name (the others are the same word)
_FAMILY_OF_GROUP = {"gemm_bf16": "gemm", "gemm_fp8": "gemm"}

#: nominal peaks of a CPU smoke run: the efficiency column needs one; it says nothing about a CPU
SMOKE_PEAKS = {"bf16": 1e12, "fp8": 2e12}


def bench_command(args: argparse.Namespace, backend: object = None, timer: object = None) -> int:
    """Run the harness. Tests pass a fake `backend` and `timer`; otherwise PyTorch on CUDA (or the CPU)."""
    from infersim.cards.registry import bundled_dir
    from infersim.tabletools import bench as harness

    if args.warmup < 0 or args.repeats < 1:
        raise InferSimError("--warmup must be >= 0 and --repeats >= 1")
    if args.device not in ("cuda", "cpu") and not str(args.device).startswith("cuda:"):
        raise InferSimError(f"--device {args.device!r}: expected cuda, cuda:N or cpu")
    smoke = args.device == "cpu"
    from infersim.tables.output import check_output_dir

    check_output_dir(Path(args.out), getattr(args, "force", False))  # before a GPU is touched
    options = harness.BenchOptions(dtypes=tuple(args.dtypes))
    if args.kernels:
        options = dataclasses.replace(options, kernels=tuple(args.kernels))
    if args.quick:
        options = options.quick()
    if smoke:
        options = options.smoke()
    for name, value in (("tp_sizes", args.tp), ("m_values", args.m_values), ("ep_sizes", args.ep)):
        if value:
            options = dataclasses.replace(options, **{name: value})
    names = args.model_names if args.model_names is not None else (
        () if args.models else harness.BENCH_MODELS)
    cards = harness.load_cards(args.models or bundled_dir("models"), names)
    budgets = tuple(args.family_budgets or ())
    if budgets:  # the families named are measured (within --kernels, where given)
        named = {_FAMILY_OF_GROUP.get(group, group) for group, _seconds in budgets}
        options = dataclasses.replace(options, kernels=tuple(k for k in options.kernels if k in named))
    cases = harness.plan_cases(cards, options, group_order=[group for group, _seconds in budgets])
    if not cases:
        raise InferSimError("nothing to measure: no kernel of the chosen families in these model cards")
    if backend is None:
        backend = harness.TorchBackend.create(args.device)  # raises NoGpuError without torch or a GPU
    env = backend.environment()  # type: ignore[attr-defined]
    overrides = {k: v for k, v in (("bf16", args.peak_bf16), ("fp8", args.peak_fp8)) if v}
    if smoke and not overrides and not args.hardware:
        peaks, peak_source = dict(SMOKE_PEAKS), "nominal (CPU smoke run)"
    else:
        peaks, peak_source = harness.peaks_for(env.device.name, args.hardware, overrides)
    if timer is None:
        if smoke:
            timer = harness.WallClockTimer()
        else:
            timer = harness.CudaEventTimer(backend.torch, backend.l2_bytes(), args.warmup, args.repeats)  # type: ignore[attr-defined]
    print(f"infersim mfu bench: {env.device.name}, {len(cases)} cases ({harness.cases_summary(cases)}) from "
          f"{len(cards)} model cards; peaks from {peak_source}; writing {args.out}", file=sys.stderr)
    result = harness.run_bench(cases, backend, timer, args.out, peaks, _command_of(args),  # type: ignore[arg-type]
                               budget_seconds=args.time_budget or float("inf"), group_budgets=budgets,
                               summary_path=args.summary, force=getattr(args, "force", False))
    skipped = sum(result.skipped.values())
    print(f"wrote {result.directory}: {result.measured} kernels measured"
          + (f", {len(result.failed)} failed" if result.failed else "")
          + (f", {skipped} not measured (see provenance.yaml notes)" if skipped else "")
          + (f"; {result.stopped}" if result.stopped else ""), file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `mfu` subcommands on their own: python -m infersim.tabletools.cli bench|import-infersim ..."""
    parser = argparse.ArgumentParser(prog="python -m infersim.tabletools.cli")
    register(parser.add_subparsers(dest="command", required=True))
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["mfu", *given])
    args.command_line = shlex.join(["python", "-m", "infersim.tabletools.cli", *given])
    try:
        return int(args.handler(args))
    except InferSimError as exc:
        print(f"infersim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
