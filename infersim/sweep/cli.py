"""`infersim sweep` and `infersim pareto`."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from infersim.cli.main import number_arg
from infersim.cards.schema import check_number
from infersim.base.errors import ConfigError, InferSimError, NotPossible, echo, shorten
from infersim.base.outputs import check_output_path as check_output_file, inputs_of
from infersim.run.energy import unavailable_reason
from infersim.run.flags import RunFlags
from infersim.sweep.analysis import (
    Targets,
    best_per_variant,
    cheapest_overall,
    cheapest_per_variant,
    energy_point,
    feasible,
    frontiers,
    point_of,
    variant_axes,
)
from infersim.sweep.evaluate import Row, Search, SweepSpec
from infersim.sweep.notes import refuse_fields_given_twice, sweep_notes
from infersim.sweep.grid import expand_values, parse_grid
from infersim.sweep.output import (
    answer_line,
    best_record,
    choices_text,
    cost_legend,
    deployment_words,
    best_table,
    check_output_path,
    check_plot_path,
    frontier_table,
    plot_frontier,
    row_key,
    row_record,
    rows_table,
    write_output,
)
from infersim.sweep.cluster import dask_executor
from infersim.sweep.runner import SweepResult, run_sweep
from infersim.sweep.variants import load_base

GRID_HELP = """\
grid syntax (--grid FIELD=VALUES, repeatable; the sweep runs the cross product):
  FIELD     any run config field (deployment.ffn.ep, deployment.precision.kv_cache,
            workload.decode_batch_per_gpu), any model card field (model.num_key_value_heads),
            any hardware card field (hardware.peak.hbm_bandwidth, hardware.peak.flops.fp8), or a
            whole card by name or path (model=qwen3-8b,llama-3.1-8b; hardware=h20,h800)
  v1,v2,v3  a list (each item read as YAML: 16, 2.5e12, max, fp8)
  a..b      doubling from a up to b: 16..256 = 16,32,64,128,256; 1..512 = powers of two
  a..b:s    step s, b included when reached: 16..64:16 = 16,32,48,64
Fields are checked against the card and config schemas before anything runs; variants that a
validator rejects (e.g. KV heads not dividing query heads, a layout not dividing the experts) are
reported as rejected rows, not simulated.
"""

SEARCH_HELP = """\
layout search (--gpus): for each GPU count N and each PP degree dividing N (up to --max-pp),
every attention TP and FFN TP dividing N/PP (up to --max-tp) and, for MoE models, every expert-
parallel size dividing what is left (DP sizes follow: DP attention = N/PP/TP); N above one node's
GPUs must fill whole nodes. Each layout runs every --batch that fits in memory, plus the largest
batch that fits when it is within the --batch range (even batches only under two-batch overlap).
Layouts the validator rejects are skipped and counted.
"""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="base run config: a path or a bundled example name; or name the "
                                                  "run with --model, --hardware and the flags below")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a base config field before sweeping (repeatable)")
    p.add_argument("--mfu-tables", default=None, metavar="DIR", help="measured kernel tables directory")
    p.add_argument("--grid", action="append", default=[], metavar="FIELD=VALUES",
                   help="sweep FIELD over VALUES (repeatable; see grid syntax below)")
    p.add_argument("--batch", default=None, metavar="LIST",
                   help="decode batches per GPU the layout search tries (default 1..1024)")
    p.add_argument("--max-pp", type=number_arg(whole=True, gt=0), default=8, help="largest pipeline degree searched (default 8)")
    p.add_argument("--max-tp", type=number_arg(whole=True, gt=0), default=8, help="largest attention/FFN TP degree searched (default 8)")
    p.add_argument("--target-tpot-ms", type=number_arg(gt=0), default=None, metavar="MS", help="TPOT target (at most)")
    p.add_argument("--target-ttft-ms", type=number_arg(gt=0), default=None, metavar="MS",
                   help="TTFT target (at most): the single-request TTFT, one prompt alone on an idle server "
                        "(the main report's); simulates prefill too")
    p.add_argument("--target-tgs", type=number_arg(ge=0), default=None, metavar="TGS",
                   help="decode throughput target, tokens per GPU per second (at least)")
    p.add_argument("--target-user-tps", type=number_arg(gt=0), default=None, metavar="TPS",
                   help="per-request output speed target, tokens/s per user (at least; TPOT <= 1000/TPS ms)")
    p.add_argument("--prefill", action="store_true",
                   help="also simulate prefill (TTFT column: the single-request TTFT; --out also writes the "
                        "workload's prefill step, prefill_step_ms)")
    p.add_argument("--price-per-gpu-hour", type=number_arg(gt=0), default=None, metavar="USD",
                   help="GPU price for cost per million tokens (default: the hardware card's usd_per_gpu_hour); "
                        "$/Mtok is the decode step's GPU-hours plus its energy at --usd-per-kwh x --pue where "
                        "the hardware card has power facts")
    p.add_argument("--out", default=None, metavar="FILE", help="write results to FILE: .csv, .json or .parquet")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes (default: CPUs available; small sweeps run in process; 1 = in process); "
                        "with --executor dask://, the cluster's worker count (sizes the chunks)")
    p.add_argument("--executor", default="processes", metavar="KIND",
                   help="processes (default), serial, or dask://HOST:PORT to run on a Dask cluster "
                        "(needs the dask extra; workers need infersim installed)")
    progress = p.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="always draw the progress bar (default: when stderr is a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="never draw it")
    from infersim.cli.main import add_emit_launch, add_run_flags

    add_emit_launch(p, "each chosen deployment (sweep: the best per variant; pareto: the frontier's points)")
    add_run_flags(p, batch=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    sweep = subparsers.add_parser(
        "sweep", help="simulate the cross product of config, model and hardware fields; mark targets",
        description="Simulate decode (and prefill with --prefill or a TTFT target) for every combination "
                    "of the --grid values; with targets, report each variant's best deployment and its "
                    "binding constraint (compute, memory bandwidth, KV capacity, communication, latency target).",
        epilog=GRID_HELP + "\n" + SEARCH_HELP + textwrap.dedent("""
            A variant is the combination of the grid values that are not deployment choices; rows
            differing only in GPUs, layout, overlap, MoE communication or batch are deployments of
            one variant, and the best is the feasible one with the most tokens per GPU per second.
            example:
              infersim sweep --config qwen3-30b.yaml --grid model.num_key_value_heads=2,4,8 \\
                --grid deployment.ffn.ep=1,2,4 --grid workload.decode_batch_per_gpu=16..256 \\
                --target-tpot-ms 50 --out results.csv"""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(sweep)
    sweep.add_argument("--gpus", default=None, metavar="LIST",
                       help="search parallel layouts over these GPU counts (e.g. 1..64) instead of using the "
                            "config's deployment")
    sweep.add_argument("--rows", default="40", metavar="N|all", help="rows of the table to print (default 40)")
    sweep.add_argument("--sort", choices=("grid", "tgs", "tpot", "cost"), default="grid",
                       help="order of the printed rows (default: grid order)")
    sweep.set_defaults(handler=sweep_command)

    pareto = subparsers.add_parser(
        "pareto", help="cost vs per-request speed Pareto frontier over GPU counts, layouts and batches",
        description="Search parallel layouts (TP, DP attention, EP, PP), GPU counts and decode batches and "
                    "print the Pareto frontier of per-request output speed (tokens/s per user = 1/TPOT) "
                    "against cost per million output tokens = price_per_gpu_hour * GPUs / (3600 * total "
                    "output tokens/s) * 1e6 + the decode step's energy per million output tokens at "
                    "--usd-per-kwh x --pue (the energy only where the hardware card has power facts).",
        epilog=SEARCH_HELP + "\n" + GRID_HELP + textwrap.dedent("""
            With --grid, each variant gets its own frontier (and its own curve in --plot).
            example:
              infersim pareto --config qwen3-30b.yaml --gpus 1..64 --plot frontier.png"""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(pareto)
    pareto.add_argument("--gpus", default="1..64", metavar="LIST",
                        help="GPU counts to search (default 1..64 = 1,2,4,...,64)")
    pareto.add_argument("--plot", default=None, metavar="PNG", help="draw the frontier (needs the plot extra)")
    pareto.add_argument("--all", action="store_true",
                        help="--out writes every feasible point with an on_frontier column, not only the frontier "
                             "(needs --out; the printed tables are the frontiers either way)")
    pareto.add_argument("--objective", choices=("cost", "energy"), default="cost",
                        help="what the frontier minimises against per-request speed: cost (USD per million output "
                             "tokens, default) or energy (the decode step's J per output token; docs/energy.md)")
    pareto.set_defaults(handler=pareto_command)


# ---------------------------------------------------------------------------------------------


#: largest GPU count the layout search takes (the largest clusters hold about 10^5 GPUs)
MAX_SEARCH_GPUS = 1_000_000


def int_list(text: str, option: str, le: float | None = None) -> tuple[int, ...]:
    """Whole numbers >= 1 (at most `le`) from a list or range, through the schema's number rule."""
    values = expand_values(text, f"{option} {text}")
    out = []
    for v in values:
        try:
            out.append(int(check_number(v, "", "", whole=True, ge=1, le=le)))
        except ConfigError as exc:
            raise InferSimError(f"{option} {shorten(text)}: {shorten(repr(v))}: {exc.problem}") from None
    return tuple(sorted(set(out)))


def _targets(args: argparse.Namespace) -> Targets:
    return Targets(args.target_tpot_ms, args.target_ttft_ms, args.target_tgs, args.target_user_tps)


def _spec(args: argparse.Namespace, gpus: str | None, targets: Targets) -> SweepSpec:
    search = None
    if gpus is not None:
        search = Search(int_list(gpus, "--gpus", MAX_SEARCH_GPUS), int_list(args.batch or "1..1024", "--batch"),
                        args.max_pp, args.max_tp)
    elif args.batch is not None:
        raise InferSimError("--batch is for the layout search (--gpus); in a sweep vary "
                            "workload.decode_batch_per_gpu with --grid")
    from infersim.cli.main import command_overrides, flags_from_args, print_notes

    given = flags_from_args(args)
    flags, grid = card_lists_as_grid(given, list(args.grid))
    axes = parse_grid(grid, searched=search is not None)
    # a --model/--hardware list is the axis itself (card_lists_as_grid), not a card beside it
    single = dataclasses.replace(given, **{name: None for name in ("model", "hardware")
                                           if "," in str(getattr(given, name) or "")})
    refuse_fields_given_twice(axes, single, command_overrides(args))
    if args.config is None:
        flags = base_cards_from_grid(flags, axes)
    if args.price_per_gpu_hour is not None and not args.price_per_gpu_hour > 0:
        raise InferSimError(f"--price-per-gpu-hour must be positive (got {args.price_per_gpu_hour})")

    base = load_base(args.config, command_overrides(args), args.mfu_tables, flags)
    _refuse_unknown_cards(axes, base.base_dir)
    print_notes(base.config)
    spec = SweepSpec(base, tuple(axes), search, prefill=args.prefill or targets.needs_prefill,
                     price_per_gpu_hour=args.price_per_gpu_hour)
    return spec


def _refuse_unknown_cards(axes: Sequence[Any], base_dir: str | None) -> None:
    """A card the grid names that cannot be loaded (a misspelt name, a missing file) is the command
    line's error, refused before the run as the main command refuses it, not a rejected row."""
    from pathlib import Path

    from infersim.run.config import load_hardware_card, load_model_card

    for axis in axes:
        loader = {"model": load_model_card, "hardware": load_hardware_card}.get(axis.path)
        for value in axis.values if loader is not None else ():
            try:
                loader(value, Path(base_dir) if base_dir else None)
            except InferSimError as exc:
                raise InferSimError(f"--grid {axis.path}={shorten(str(value))}: {exc}") from None


def card_lists_as_grid(flags: RunFlags, grid: list[str]) -> tuple[RunFlags, list[str]]:
    """`--hardware h100,h200` (or `--model a,b`) is `--grid hardware=h100,h200`: the list becomes an
    axis, and its first name the base run's card."""
    for name in ("model", "hardware"):
        value = getattr(flags, name)
        if value is None or "," not in value:
            continue
        if any(text.split("=", 1)[0].strip() == name for text in grid):
            raise InferSimError(f"--{name} {shorten(value)} and --grid {name}=...: give the {name} list once")
        grid.append(f"{name}={value}")
        flags = dataclasses.replace(flags, **{name: value.split(",")[0].strip()})
    return flags, grid


def base_cards_from_grid(flags: RunFlags, axes: Sequence[Any]) -> RunFlags:
    """Without --config, a model or hardware the grid varies needs no --model/--hardware: the base
    run takes the axis's first card (every variant replaces it)."""
    for name in ("model", "hardware"):
        axis = next((a for a in axes if a.path == name), None)
        if getattr(flags, name) is None and axis is not None and isinstance(axis.values[0], str):
            flags = dataclasses.replace(flags, **{name: axis.values[0]})
    return flags


def _run(args: argparse.Namespace, spec: SweepSpec) -> SweepResult:
    """The sweep run on the chosen executor; then what it did that its command line does not say."""
    result = _run_on(args, spec)
    for note in sweep_notes(spec, result.unlaunchable, result.rows, result.shortened):
        print(f"infersim: note: {note}", file=sys.stderr)
    return result


def _run_on(args: argparse.Namespace, spec: SweepSpec) -> SweepResult:
    kind = args.executor
    if kind == "processes":
        return run_sweep(spec, workers=args.workers, progress=args.progress)
    if kind == "serial":
        return run_sweep(spec, workers=1, progress=args.progress)
    if "://" in kind:  # dask:// and tcp:// only: parse_address refuses every other scheme
        executor, client = dask_executor(kind)
        try:
            return run_sweep(spec, executor=executor, workers=args.workers, progress=args.progress)
        except OSError as exc:  # the scheduler went away mid-sweep (distributed's CommClosedError is an OSError)
            raise InferSimError(f"--executor {kind}: the Dask cluster failed during the sweep "
                                f"({type(exc).__name__}: {exc})") from None
        finally:
            client.close()
    raise InferSimError(f"--executor {echo(kind)}: expected processes, serial or dask://HOST:PORT")


def _on_the_cards(args: argparse.Namespace, spec: SweepSpec, result: SweepResult) -> dict[tuple[int, ...], Row] | None:
    """The sweep's configurations simulated on the cards as they were before the run's calibration
    profile (by row_key), to stand beside the calibrated ones; None without a profile (or when the
    sweep was interrupted)."""
    from infersim.run.config import without_calibration

    if spec.base.config.calibration is None or result.interrupted:
        return None
    plain = dataclasses.replace(spec, base=dataclasses.replace(spec.base, config=without_calibration(spec.base.config)))
    return {row_key(r): r for r in _run(args, plain).rows}


def _summary(result: SweepResult) -> str:
    rejected = f", {result.rejected:,} rejected by the validator" if result.rejected else ""
    unfit = f", {result.unfit:,} searched batches skipped (KV cache does not fit)" if result.unfit else ""
    where = "on the given executor" if result.workers == 0 else \
        f"{result.workers} worker{'s' if result.workers != 1 else ''}" if result.workers > 1 else "in process"
    return (f"{result.simulated:,} configurations simulated{rejected}{unfit} in {result.elapsed_s:.2f} s "
            f"({result.rate:,.0f}/s, {where})")


def _problems(result: SweepResult, limit: int = 4) -> str:
    top = sorted(result.problems.items(), key=lambda kv: -kv[1])[:limit]
    return "; ".join(f"{n:,} x {p}" for p, n in top)


def _nothing_simulated(result: SweepResult) -> InferSimError:
    """Why a sweep simulated nothing: the validator rejected every row (bad input), or no searched
    layout the engine can launch or batch fits in memory (exit status 1)."""
    parts = []
    left_out = sum(result.unlaunchable.values())
    if left_out:
        engine = result.spec.base.config.engine
        parts.append(f"{left_out:,} searched layouts left out that engine {engine.name} {engine.version} cannot launch "
                     "(the note above says why)")
    if result.rejected:
        parts.append(f"{result.rejected:,} rejected by the validator ({_problems(result)})")
    if result.unfit:
        parts.append(f"{result.unfit:,} searched batches skipped because their KV cache does not fit")
    if not parts:
        parts.append("the grid and the layout search produced no configuration")
    message = "no configuration could be simulated: " + "; ".join(parts)
    bad_input = result.rejected and not result.unfit and not left_out
    return InferSimError(message) if bad_input else NotPossible(message)


def _interrupted(result: SweepResult, out: str | None) -> int:
    wrote = f"; partial results written to {out}" if out else ""
    by = " by SIGTERM" if result.interrupted_by == "SIGTERM" else ""
    print(f"infersim: interrupted{by}: {result.finished_units:,} of {result.total_units:,} units finished "
          f"({result.simulated:,} configurations simulated){wrote}", file=sys.stderr)
    return 143 if by else 130


def _meta(args: argparse.Namespace, spec: SweepSpec, result: SweepResult, targets: Targets) -> dict[str, Any]:
    return {
        "config": spec.base.source,
        "overrides": list(args.overrides),
        "grid": {a.path: list(a.values) for a in spec.axes},
        "search": None if spec.search is None else {
            "gpus": list(spec.search.gpus), "batches": list(spec.search.batches),
            "max_pp": spec.search.max_pp, "max_tp": spec.search.max_tp},
        "targets": {"tpot_ms": targets.tpot_ms, "ttft_ms": targets.ttft_ms, "tgs": targets.tgs},
        "total_units": result.total_units,
        "finished_units": result.finished_units,
        "interrupted": result.interrupted,
        "simulated": result.simulated,
        "rejected": result.rejected,
        "unfit_skipped": result.unfit,
        "rejection_reasons": result.problems,
        "unlaunchable": result.unlaunchable,
        "shortened_output": result.shortened,
    }


def _sorted_rows(rows: Sequence[Row], order: str) -> list[Row]:
    if order == "tgs":
        return sorted(rows, key=lambda r: -r.tgs if r.ok else float("inf"))
    if order == "tpot":
        return sorted(rows, key=lambda r: r.tpot_s if r.ok else float("inf"))
    if order == "cost":
        return sorted(rows, key=lambda r: r.total_cost_per_mtok if r.ok and not math.isnan(r.total_cost_per_mtok)
                      else float("inf"))
    return list(rows)


def _print_launches(spec: SweepSpec, rows: Sequence[Row]) -> None:
    """The launch command of each chosen row; a row the engine cannot express says why instead."""
    from infersim.launch.build import plan_for_config
    from infersim.launch.report import plan_text
    from infersim.sweep.evaluate import row_config
    from infersim.sweep.output import layout_text

    for row in rows:
        label = f"{row.num_gpus} GPU(s) {layout_text(row)} batch {row.batch}"
        try:
            print("\n" + plan_text(plan_for_config(row_config(spec, row), row.batch, label)))
        except InferSimError as exc:
            print(f"\nLAUNCH  {label}: none: {str(exc).removeprefix('--emit-launch: ')}")


def _check_outputs(args: argparse.Namespace, *flags: str) -> None:
    """Each output a flag names is writable and none of the run's inputs, before the search runs."""
    for flag in flags:
        path = getattr(args, flag.removeprefix("--"))
        if path:
            check_output_file(path, flag, inputs_of(args))


def sweep_command(args: argparse.Namespace) -> int:
    check_output_path(args.out)
    _check_outputs(args, "--out")
    targets = _targets(args)
    card_lists = any("," in (getattr(args, name) or "") for name in ("model", "hardware"))
    if not args.grid and args.gpus is None and not card_lists:
        raise InferSimError("nothing to sweep: give at least one --grid FIELD=VALUES (or --gpus to search layouts)")
    if args.rows != "all" and (not args.rows.isdigit()):
        raise InferSimError(f"--rows {args.rows}: expected a number or 'all'")
    spec = _spec(args, args.gpus, targets)
    result = _run(args, spec)
    rows = result.rows
    on_cards = _on_the_cards(args, spec, result)
    show_cost = any(r.ok and r.price > 0 for r in rows)
    v_axes = variant_axes(spec)
    bests = best_per_variant(spec, rows, targets)
    meta = _meta(args, spec, result, targets)
    meta["best"] = [best_record(spec, b, v_axes, targets) for b in bests]
    written = 0
    if args.out and (rows or result.interrupted):
        written = write_output(args.out, (row_record(spec, r, targets, on_cards) for r in rows), meta)
    if result.interrupted:
        print(_summary(result), file=sys.stderr)
        return _interrupted(result, args.out)
    if result.simulated == 0:
        raise _nothing_simulated(result)
    failed = targets.any and not any(feasible(r, targets) for r in rows)
    if not failed:  # a failing sweep's stderr is its one message, which carries the summary
        print(_summary(result), file=sys.stderr)
    limit = len(rows) if args.rows == "all" else int(args.rows)
    shown = _sorted_rows(rows, args.sort)[:limit]
    print(rows_table(spec, shown, targets, spec.prefill, show_cost, on_cards=on_cards))
    if len(rows) > limit:
        print(f"... {len(rows) - limit:,} more rows (--rows all to print them, --out FILE to save them)")
    if show_cost:
        print(cost_legend(spec, rows))
    if result.rejected:
        print(f"\nrejected by the validator: {_problems(result)}")
    deployments_vary = spec.search is not None or any(a.is_deployment for a in spec.axes)
    if targets.any or deployments_vary:
        title = f"best deployment per variant (targets: {targets.describe()})"
        print(f"\n{title}")
        print(best_table(spec, bests, v_axes, spec.prefill, show_cost))
    if args.emit_launch:
        _print_launches(spec, [b.row for b in bests if b.row is not None])
    if args.out:
        print(f"\nwrote {written:,} rows to {args.out}")
    if failed:
        print(f"infersim: no configuration meets the targets ({targets.describe()}); {_summary(result)}",
              file=sys.stderr)
        return 1
    return 0


def _check_objective(spec: SweepSpec, energy: bool) -> None:
    """Before a search runs: the base card has what the frontier's y axis needs (a price, or power
    facts for --objective energy), unless the hardware is swept (each row says for itself)."""
    hw = spec.base.config.hardware
    if any(a.path == "hardware" for a in spec.axes):
        return
    if energy and hw.power is None:
        raise InferSimError(f"--objective energy: {unavailable_reason(hw.name)}")
    if not energy and spec.price_per_gpu_hour is None and not hw.usd_per_gpu_hour:
        raise InferSimError(f"hardware card {hw.name} has no usd_per_gpu_hour: pass --price-per-gpu-hour")


def _empty_frontier(result: SweepResult, targets: Targets, energy: bool) -> InferSimError:
    """Why a frontier is empty: no price, no power facts, nothing simulated, or nothing feasible."""
    if energy and any(r.ok for r in result.rows):
        return InferSimError("empty Pareto frontier: no simulated hardware card has power facts (docs/energy.md), "
                             "so no point has an energy")
    if not energy and any(r.ok and not r.price for r in result.rows):
        return InferSimError("empty Pareto frontier: the hardware has no price (pass --price-per-gpu-hour)")
    if not result.simulated:
        nothing = _nothing_simulated(result)
        return type(nothing)(f"empty Pareto frontier: {nothing}")
    # valid input whose answer is "nothing can run": exit status 1
    return NotPossible(f"empty Pareto frontier: no simulated configuration fits in memory and meets the targets "
                       f"({targets.describe()})")


def pareto_command(args: argparse.Namespace) -> int:
    if args.all and not args.out:
        # --all shapes the file only: printing every feasible point of a search is thousands of lines
        raise InferSimError("--all: chooses what --out writes (every feasible point, marked on_frontier), and no "
                            "--out is given: add --out FILE.csv, .json or .parquet (the printed tables are the "
                            "frontiers either way)")
    check_output_path(args.out)
    check_plot_path(args.plot, need_matplotlib=False)  # matplotlib is asked for after the frontier is printed
    _check_outputs(args, "--out", "--plot")
    targets = _targets(args)
    spec = _spec(args, args.gpus, targets)
    energy = args.objective == "energy"
    _check_objective(spec, energy)
    result = _run(args, spec)
    on_cards = _on_the_cards(args, spec, result)
    fronts = frontiers(spec, result.rows, targets, energy_point if energy else point_of)
    if any(fronts.values()) or result.interrupted:  # else stderr is the one message saying why
        print(_summary(result), file=sys.stderr)
    records = _pareto_records(args, spec, result, fronts, targets, on_cards)
    if args.out and (records or result.interrupted):
        write_output(args.out, records, _meta(args, spec, result, targets))
    if not any(fronts.values()):
        if result.interrupted:
            return _interrupted(result, args.out)
        raise _empty_frontier(result, targets, energy)
    if result.interrupted:
        print(f"PARTIAL RESULT: interrupted after {result.finished_units:,} of {result.total_units:,} units; the "
              "frontiers and the answer below are those of the configurations that finished\n")
    curves = _print_frontiers(spec, result, fronts, targets, args.objective, on_cards)
    best = None
    if energy:  # the frontier is the answer: the cheapest point per variant is the cost objective's
        print("\n(--objective energy: the frontier above is the answer; without it pareto lists the cheapest "
              "point per variant)")
    else:
        choices = cheapest_per_variant(spec, result.rows, targets, result.by_point, result.interrupted)
        best = cheapest_overall(choices)
        print("\n" + "\n".join(choices_text(spec, choices, targets)))
    if args.emit_launch:
        _print_launches(spec, [r for front in fronts.values() for r in front])
    if args.plot:
        _pareto_plot(args.plot, spec, curves, targets, best, args.objective)
    if args.out:
        print(f"\nwrote {len(records):,} rows to {args.out}")
    if best is not None:  # last: the line the search was run for
        print("\n" + answer_line(spec, best, targets))
    return _interrupted(result, args.out) if result.interrupted else 0


def _pareto_records(args: argparse.Namespace, spec: SweepSpec, result: SweepResult,
                    fronts: dict[tuple[Any, ...], list[Row]], targets: Targets,
                    on_cards: dict[tuple[int, ...], Row] | None = None) -> list[dict[str, Any]]:
    """The rows --out writes: the frontiers' (or with --all every feasible row), marked on_frontier."""
    on_front = {id(r) for front in fronts.values() for r in front}
    source_rows = [r for r in result.rows if feasible(r, targets)] if args.all else \
        [r for front in fronts.values() for r in front]
    return [{**row_record(spec, r, targets, on_cards), "on_frontier": id(r) in on_front} for r in source_rows]


def _print_frontiers(spec: SweepSpec, result: SweepResult, fronts: dict[tuple[Any, ...], list[Row]],
                     targets: Targets, objective: str, on_cards: dict[tuple[int, ...], Row] | None = None
                     ) -> list[tuple[str, list[Row], list[Row]]]:
    """Each variant's frontier table; returns the curves to draw (label, feasible rows, frontier)."""
    energy = objective == "energy"
    v_axes = variant_axes(spec)
    curves = []
    if any(r.ok and r.price > 0 for r in result.rows):
        print(cost_legend(spec, result.rows))
    for variant, front in fronts.items():
        if not front:
            continue  # listed with its reason under CHEAPEST POINT PER ...
        label = ", ".join(f"{spec.axes[i].label}={v}" for i, v in zip(v_axes, variant))
        points = [r for r in result.rows if feasible(r, targets) and
                  tuple(spec.values(r.point)[i] for i in v_axes) == variant]
        curves.append((label, points, front))
        if label:
            print(f"\n{label}")
        y = "J per output token of the decode step" if energy else "USD per million output tokens"
        print(f"Pareto frontier: {len(front)} of {len(points):,} feasible points (x = tokens/s per user, y = {y})")
        print(frontier_table(spec, front, spec.prefill, objective, on_cards))
    if result.rejected:
        print(f"\nskipped {result.rejected:,} layouts the validator rejects: {_problems(result)}")
    return curves


def _pareto_plot(path: str, spec: SweepSpec, curves: list[tuple[str, list[Row], list[Row]]], targets: Targets,
                 best: Any, objective: str) -> None:
    cfg = spec.base.config
    paths = {a.path for a in spec.axes}
    model = "model variants" if "model" in paths else cfg.model.name
    hardware = "each card's price" if "hardware" in paths and spec.price_per_gpu_hour is None else \
        f"${spec.price_per_gpu_hour or cfg.hardware.usd_per_gpu_hour:.2f}/GPU-hour"
    if objective == "energy":
        hardware = "energy of the decode step"
    elif any(r.cost_includes_energy for _label, points, _front in curves for r in points):
        pue = f" x PUE {cfg.electricity.pue:g}" if cfg.electricity.pue != 1 else ""
        hardware += f" + energy at ${cfg.electricity.usd_per_kwh:g}/kWh{pue}"
    on = "" if "hardware" in paths else f" on {cfg.hardware.name}"
    title = (f"{model}{on}: ISL {cfg.workload.isl}, OSL {cfg.workload.osl}, {hardware}"
             + (f"; {targets.describe()}" if targets.any else ""))
    chosen = None
    if best is not None:
        goal = f"cheapest meeting {targets.describe()}" if targets.any else "cheapest"
        chosen = (best.row, f"{goal}: {deployment_words(spec, best)}, ${best.row.total_cost_per_mtok:.3f}/M tokens")
    plot_frontier(path, curves, title, chosen, objective)
    print(f"\nwrote {path}")
