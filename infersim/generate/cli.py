"""`infersim generate`: simulate one whole static-batch generation and report the benchmark metrics."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from infersim.base.errors import InferSimError, shorten

if TYPE_CHECKING:
    from infersim.generate.spec import GenerateSpec

WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")


def _generate(args: argparse.Namespace) -> int:
    from infersim.generate.report import to_json_data, to_log, to_text
    from infersim.generate.simulate import simulate_generation
    from infersim.generate.spec import load_generate_config

    for flag in ("usd_per_kwh", "pue"):
        if getattr(args, flag, None) is not None:
            raise InferSimError(f"--{flag.replace('_', '-')} {getattr(args, flag):g}: generate reports no energy or "
                                "cost, so the price would be ignored; drop it (the main command, sweep and pareto "
                                "price energy)")
    overrides = list(args.overrides)
    if args.weights:
        _check_weights_once(args.weights, overrides)
        overrides.append(f"deployment.precision.weights={args.weights}")
    flags = {"batch": args.batch, "prompt_len": args.prompt_len, "gen_len": args.gen_len, "offload": args.offload,
             "offload_device": args.offload_device, "prefetch": args.prefetch}
    from infersim.cli.main import print_notes
    from infersim.cli.main import flags_from_args

    config, gen = load_generate_config(args.config, overrides, args.mfu_tables,
                                       {k: v for k, v in flags.items() if v is not None}, flags_from_args(args))
    _check_offload_device(args.offload_device, gen)
    print_notes(config)
    result = simulate_generation(config, gen)
    if args.format == "json":
        print(json.dumps(to_json_data(result), indent=2))
    elif args.format == "log":
        print(to_log(result))
    else:
        print(to_text(result))
    return 0


def _check_weights_once(weights: str, overrides: list[str]) -> None:
    """--weights is --set deployment.precision.weights: both at once is one field given twice."""
    for text in overrides:
        if text.split("=", 1)[0].strip() == "deployment.precision.weights":
            raise InferSimError(f"--weights {weights} and --set {shorten(text)}: both set deployment.precision.weights; "
                                "give one")


def _check_offload_device(device: str | None, gen: GenerateSpec) -> None:
    """--offload-device says where offloaded weights live: with no weights offloaded it would be
    ignored without a word."""
    if device is not None and not gen.weights_offloaded:
        offloaded = "only the KV cache (which always goes to CPU memory)" if gen.kv_offloaded else "nothing"
        raise InferSimError(f"--offload-device {device}: says where offloaded weights live, but the run offloads "
                            f"{offloaded}: add weights to --offload (--offload weights or weights,kv), or drop "
                            "--offload-device")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="simulate a whole static-batch generation (prefill + decode steps), optionally with weights "
             "and/or KV cache offloaded to host memory; ZeRO-Inference benchmark metrics",
        description="Prefill of batch x prompt_len tokens, then gen_len - 1 decode steps timed one by one at "
                    "their own KV length. Values not given here come from the config's `generate:` section, "
                    "then from its workload (isl, osl, decode_batch_per_gpu).")
    p.add_argument("--config", default=None, help="run config: a path, or the name of a bundled example; or name the "
                                                  "run with --model, --hardware and the flags below")
    p.add_argument("--batch", type=int, default=None, help="sequences generated together (all GPUs)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per sequence")
    p.add_argument("--gen-len", type=int, default=None, help="generated tokens per sequence (the first from prefill)")
    p.add_argument("--offload", default=None, metavar="weights|kv|weights,kv|none",
                   help="what lives in host memory and streams over PCIe every forward pass")
    p.add_argument("--offload-device", choices=("cpu", "nvme"), default=None,
                   help="where offloaded weights live (the KV cache always goes to CPU memory)")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap the next layer's transfer with this layer's compute (default: on)")
    p.add_argument("--weights", choices=WEIGHT_FORMATS, default=None,
                   help="weight storage format (same as --set deployment.precision.weights=...)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any config field, generate.* included (repeatable)")
    p.add_argument("--mfu-tables", default=None, metavar="DIR", help="directory of measured kernel tables")
    p.add_argument("--format", choices=("text", "log", "json"), default="text",
                   help="text; log = the benchmark's four-line log; json = the same fields as data")
    from infersim.cli.main import add_run_flags

    add_run_flags(p, lengths=False)  # generate has its own --batch, --prompt-len and --gen-len
    p.set_defaults(handler=_generate)
