"""`infersim compare`: a real run against the simulator.

    python -m infersim compare --trace run-TP-0.trace.json.gz                     # measured breakdown only
    python -m infersim compare --trace traces/ --config run.yaml [--stage decode]  # measured vs predicted
    python -m infersim compare --bench-result result.json --hardware h100 --tp 8  # vllm/sglang serving results
    python -m infersim compare --bench-result result.jsonl --config run.yaml      # TTFT / TPOT / throughput
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError, NotPossible, shorten

EPILOG = """\
--trace takes a Kineto trace (.json or .json.gz), a directory of per-rank files as SGLang writes
them (*-TP-<r>[-DP-..][-EP-..].trace.json.gz) or a glob. Rank 0 is analysed unless --rank says
otherwise. Without --config only the measured breakdown is printed. A kernel's module comes from
the CPU operator (and nn.Module frames, with_stack=True) that launched it, else from the shipped
name rules (infersim/trace/kernel_rules.yaml; --rules adds yours in front), else from its library's
naming; each stage says which way its time was classified and lists what stayed unclassified.
Steps come from step annotations (SGLang, your record_function regions: --step-regions), CUDA-graph
replays, model forward frames, ProfilerStep#N, or the repeating kernel pattern. See docs/traces.md.
Times: ms per step, µs per layer; JSON keeps seconds.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare", help="compare a profiler trace or a vLLM / SGLang benchmark result with the prediction",
        description="Measured vs predicted time per module, per layer and per step, from a PyTorch-profiler "
                    "trace; or TTFT / TPOT / ITL / throughput from vllm bench serve or sglang.bench_serving results "
                    "(against infersim serve at the same request rate or concurrency, lengths and number of "
                    "prompts, the file's backend as the engine) and sglang.bench_one_batch results.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="PATH", help="trace file, directory of rank files, or glob")
    source.add_argument("--bench-result", metavar="FILE",
                        help="a result of vllm bench serve (--save-result), sglang.bench_serving (--output-file) or "
                             "sglang.bench_one_batch (--result-filename): serving results are held against infersim "
                             "serve at the same load, one-batch results against one step of each stage")
    parser.add_argument("--config", help="run config to predict with (or --model/--hardware and the flags below)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field, e.g. workload.decode_batch_per_gpu=64 (repeatable)")
    parser.add_argument("--mfu-tables", default=None, metavar="DIR", help="measured kernel tables for the prediction")
    parser.add_argument("--stage", choices=("prefill", "decode"),
                        help="only this stage; also the stage of steps the trace does not mark as prefill or decode")
    parser.add_argument("--rules", action="append", default=[], metavar="YAML",
                        help="extra kernel rules, tried before the shipped table (repeatable)")
    parser.add_argument("--rank", default=None, metavar="R",
                        help="TP rank to analyse (or GPU of a merged file), or 'all' (default: rank 0)")
    parser.add_argument("--step-regions", default=None, metavar="NAME,...",
                        help="names of your record_function regions that each hold one step (default: regions whose "
                             "name says prefill or decode)")
    parser.add_argument("--layers-per-step", type=int, default=None, metavar="N",
                        help="cut unannotated eager kernels into steps of N layers (several forward passes "
                             "without step markers)")
    parser.add_argument("--steps", action="store_true", help="text: also list every step found")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    from infersim.cli.main import add_run_flags

    add_run_flags(parser)
    parser.set_defaults(handler=run_compare)
    return parser


def _simulate(args: argparse.Namespace, extra_overrides: list[str] = ()) -> Any:
    from infersim.cli.main import load_config_from_args
    from infersim.run.simulate import simulate

    config = load_config_from_args(args, extra_overrides)
    return config, simulate(config)


def _compare_trace(args: argparse.Namespace) -> int:
    from infersim.trace import compare_lane, load_rules, measure_trace
    from infersim.trace.report import comparison_json, comparison_text, lane_json, lane_text

    if args.layers_per_step is not None and args.layers_per_step < 1:
        raise InferSimError(f"--layers-per-step {args.layers_per_step}: expected a positive number of layers")
    rules = load_rules(args.rules)
    regions = tuple(name.strip() for name in (args.step_regions or "").split(",") if name.strip())
    if args.step_regions is not None and not regions:
        raise InferSimError(f"--step-regions {args.step_regions!r}: expected region names, comma-separated")
    lanes = measure_trace(args.trace, rules=rules, rank=args.rank, stage=args.stage,
                          layers_per_step=args.layers_per_step, step_regions=regions)
    if not _has_run(args):
        if args.format == "json":
            print(json.dumps({"lanes": [lane_json(lane) for lane in lanes]}, indent=2))
        else:
            print("\n\n".join(lane_text(lane, args.steps) for lane in lanes))
        return _nothing_found(args.trace, lanes, "report")
    _, result = _simulate(args)
    for reason in getattr(result, "unfit", ()):
        print(f"infersim: warning: the predicted run does not fit, its times cannot happen: {reason}", file=sys.stderr)
    unknown_as = args.stage or "prefill"
    comparisons = [(lane, compare_lane(lane, result.prefill, result.decode, unknown_as)) for lane in lanes]
    if args.format == "json":
        print(json.dumps({"config": args.config, "lanes": [comparison_json(lane, comps) for lane, comps in comparisons]},
                         indent=2))
    else:
        print("\n\n".join(comparison_text(lane, comps, args.steps) for lane, comps in comparisons))
    return _nothing_found(args.trace, lanes, "compare")


def _nothing_found(trace: str, lanes: Any, what: str) -> int:
    """Exit status 1 with one line on stderr when no lane of the trace has a forward step."""
    if any(lane.stages for lane in lanes):
        return 0
    print(f"infersim: nothing to {what}: no forward steps found in {trace} (no attention kernel, by operator, rule "
          "or name, and no step annotation; --step-regions NAME names your own regions, --layers-per-step N cuts "
          "unannotated kernels into steps)", file=sys.stderr)
    return 1


def _has_run(args: argparse.Namespace) -> bool:
    """Whether the command line names a run to predict with (a config file or --model/--hardware)."""
    return args.config is not None or getattr(args, "model", None) is not None or getattr(args, "hardware", None) is not None


def _compare_bench(args: argparse.Namespace) -> int:
    from infersim.serve.bench_result import is_serving_result
    from infersim.trace.bench import read_result_objects

    objects = read_result_objects(args.bench_result)
    serving = [(line, data) for line, data in objects if is_serving_result(data)]
    batch = [(line, data) for line, data in objects if not is_serving_result(data)]
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    if batch:
        _compare_one_batch(args, batch, results, texts)
    if serving:
        _compare_serving(args, serving, results, texts)
    results.sort(key=lambda r: r["line"])
    if not any(r["metrics"] for r in results):
        raise NotPossible(f"{args.bench_result}: nothing to compare: no line gives a latency or throughput "
                          "(prefill_latency, median_decode_latency, mean_ttft_ms, median_tpot_ms, ...)")
    if args.format == "json":
        print(json.dumps({"bench_result": args.bench_result, "config": args.config, "results": results}, indent=2))
    else:
        print("\n\n".join(texts))
    return 0


def _compare_one_batch(args: argparse.Namespace, objects: list[tuple[int, Any]], results: list[dict[str, Any]],
                       texts: list[str]) -> None:
    """sglang.bench_one_batch lines: one static batch, held against one simulated step of each stage."""
    from infersim.cards.schema import build
    from infersim.cli.main import load_config_from_args
    from infersim.cards.deployment import Workload
    from infersim.run.simulate import simulate
    from infersim.trace.bench import bench_workload, compare_bench_record, parse_bench_record
    from infersim.trace.report import bench_json, bench_text

    if not _has_run(args):
        raise InferSimError("--bench-result of sglang.bench_one_batch needs the run to predict the same batch with: "
                            "--config FILE, or --model and --hardware")
    records = [parse_bench_record(data, args.bench_result, line) for line, data in objects]
    base = load_config_from_args(args)
    gpus = base.deployment.num_gpus // base.deployment.pp
    comparisons = []
    for record in records:
        workload = bench_workload(record, gpus, base.deployment.attention.tp)
        # the per-GPU workload passes the same checks as a run config's (e.g. no count above 1e15)
        config = dataclasses.replace(base, workload=build(Workload, {
            "isl": workload.isl, "osl": workload.osl, "prefill_tokens_per_gpu": workload.prefill_tokens_per_gpu,
            "decode_batch_per_gpu": workload.decode_batch_per_gpu}, f"{args.bench_result}: line {record.line}",
            "workload per GPU"))
        result = simulate(config)
        comparisons.append(compare_bench_record(
            record, workload, result.prefill.step_time_s, result.prefill.tgs, result.decode.step_time_s,
            result.decode.tgs, gpus, tuple(f"the prediction does not fit: {reason}" for reason in getattr(result, "unfit", ()))
            + tuple(result.warnings)))
    results += bench_json(args.bench_result, args.config, comparisons)["results"]
    texts.append(bench_text(args.bench_result, args.config or "the command line's run", comparisons))


def _compare_serving(args: argparse.Namespace, objects: list[tuple[int, Any]], results: list[dict[str, Any]],
                     texts: list[str]) -> None:
    """vllm bench serve / sglang.bench_serving results: `infersim serve` at the same load."""
    from dataclasses import replace

    from infersim.cli.main import print_notes
    from infersim.run.config import load_run_config, read_run_mapping
    from infersim.cli.main import flags_from_args
    from infersim.serve.bench_result import compare_serving, parse_serving_result, serve_options, with_engine
    from infersim.serve.cli import serve_title
    from infersim.serve.report import serving_comparison_json, serving_comparison_text

    for line, data in objects:
        result = parse_serving_result(data, args.bench_result, line)
        flags = flags_from_args(args)
        file_engine = None
        if args.config is not None:
            raw = read_run_mapping(args.config)[0]
            file_engine = raw.get("engine") if isinstance(raw.get("engine"), str) else None
        flags, notes = with_engine(flags, result, file_engine)
        if flags.model is None and args.config is None:
            if not result.model_id:
                raise InferSimError(f"{args.bench_result}: line {line}: the file does not name its model "
                                    f"({result.tool} saves none): give --model or --config")
            from infersim.cards.registry import served_model_name

            model, note = served_model_name(result.model_id)
            flags = replace(flags, model=model)
            notes.append(note)
        if args.config is None and flags.hardware is None:
            raise InferSimError("--bench-result: a benchmark file does not say which GPUs served it: give --hardware "
                                "(and --tp, --num-gpus as the server ran), or --config")
        options, load_notes = serve_options(result)
        config = load_run_config(args.config, args.overrides, args.mfu_tables,
                                 replace(flags, isl=round(result.mean_input_len), osl=round(result.mean_output_len)))
        print_notes(config)
        _refuse_other_model(result.model_id, config.model, f"{args.bench_result}: line {line}")
        comparison = compare_serving(result, config, options, notes + load_notes, serve_title(config, options))
        results.append(serving_comparison_json(args.bench_result, comparison))
        texts.append(serving_comparison_text(args.bench_result, comparison))


def _refuse_other_model(model_id: str, card: Any, where: str) -> None:
    """A comparison of a result of one model with a simulation of another measures nothing."""
    from infersim.cards.registry import other_bundled_model

    found = other_bundled_model(model_id, card)
    if found is not None:
        raise InferSimError(f"{where}: the result's model_id '{model_id}' names the bundled model {found.card} "
                            f"({found.how}), but the simulated run is of {card.name}: give --model {found.card} "
                            "(or a --config of it) to compare like with like")


def run_compare(args: argparse.Namespace) -> int:
    if args.bench_result is not None:
        return _compare_bench(args)
    return _compare_trace(args)


# ---------------------------------------------------------------------------------------------
# infersim mfu from-trace (registered by infersim.tabletools.cli)


#: the workload fields `mfu from-trace` takes from the trace's steps (TracedWorkload.overrides)
TRACED_FIELDS = ("isl", "osl", "prefill_tokens_per_gpu", "decode_batch_per_gpu")


def _refuse_traced_fields(overrides: list[str]) -> None:
    """A --set of a workload field the trace gives: the tables are learned at the traced steps' sizes."""
    for text in overrides:
        field = text.split("=", 1)[0].strip()
        if field == "workload" or (field.startswith("workload.") and field[len("workload."):] in TRACED_FIELDS):
            raise InferSimError(f"--set {shorten(text)}: the workload's lengths and batch are the trace's (its steps' "
                                f"prompt and output lengths and batch: {', '.join(TRACED_FIELDS)}); drop it")


def run_from_trace(args: argparse.Namespace, command: str) -> int:
    """Learn a kernel-table directory from a trace, write it, and check it against the trace."""
    from infersim.run.config import load_run_config
    from infersim.run.simulate import simulate
    from infersim.trace.learn import (
        check_stages,
        elementwise_efficiency,
        learn,
        learn_host,
        table_directory,
        write_learned_tables,
    )
    from infersim.trace.traced_run import read_traced_run, traced_workload
    from infersim.trace.report import learned_text

    from infersim.tables.output import check_output_dir

    regions = tuple(name.strip() for name in (args.step_regions or "").split(",") if name.strip())
    _refuse_traced_fields(args.overrides)
    load_run_config(args.config, args.overrides, "none")  # a bad config fails before a large trace is read
    check_output_dir(Path(args.out), getattr(args, "force", False))  # and a refused --out before it
    run = read_traced_run(args.trace, args.rank, regions, args.rules)
    if not run.calls:
        raise NotPossible(f"{args.trace}: no GEMM, attention or grouped-GEMM operator with recorded shapes in its "
                          f"steps: nothing to learn" + (f" ({'; '.join(run.notes)})" if run.notes else ""))
    workload = traced_workload(run)
    overrides = [*args.overrides, *workload.overrides()]
    config = load_run_config(args.config, overrides, "none")
    learned = learn(run, config)
    if learned.elementwise:  # measured per kernel: no bandwidth share to fit
        efficiency: tuple[float | None, str] = (None, "timed per kernel (elementwise.csv); kernels no operator keys "
                                                      "(fused, the rotary tables) keep the hardware card's share")
    else:
        efficiency = elementwise_efficiency(run, config)
        efficiency = (efficiency[0], f"no elementwise kernel keyed by its operator's recorded inputs, so the "
                                     f"fallback: the share of HBM bandwidth fitted on the traced elementwise time: "
                                     f"{efficiency[1]}")
    table_dir = table_directory(run, learned, config, command, efficiency, learn_host(run, config))
    write_learned_tables(args.out, table_dir, getattr(args, "force", False))
    checked = load_run_config(args.config, overrides, str(args.out))
    result = simulate(checked)
    checks = check_stages(run.lane, result.prefill, result.decode)
    print(learned_text(args.out, table_dir, workload, checks))
    return 0
