"""The dataset flags of `vllm bench serve` and `sglang.bench_serving` as a serving workload.

Read from each tool's source (`--bench-tool` says whose flags they are; vllm by default):
  --dataset-name random   vllm (benchmarks/datasets/random.py): input lengths uniform on the whole
                          numbers [floor(L (1 - r)), ceil(L (1 + r))] for --random-input-len L and
                          --random-range-ratio r (0 <= r < 1), outputs likewise on [max(1, floor(O (1 -
                          r))), ceil(O (1 + r))], after a --random-prefix-len prefix every request shares.
                          vLLM first takes the tokenizer's special tokens off L (one BOS for Llama) and
                          the server adds them back; lengths here are the flags' own.
                          sglang (bench_serving.py sample_random_requests): inputs uniform on [max(1,
                          int(L r)), L], outputs on [int(O r), O] (at least 1 here); its default r is 0,
                          so lengths are uniform from 1 to L unless r is given
  --dataset-name prefix_repetition   vllm: --prefix-repetition-num-prefixes prefixes of
                          --prefix-repetition-prefix-len tokens, each followed by
                          --prefix-repetition-suffix-len tokens of its own, output
                          --prefix-repetition-output-len (defaults 10, 256, 256, 128)
  --dataset-name generated-shared-prefix   sglang: --gsp-num-groups system prompts of
                          --gsp-system-prompt-len tokens, --gsp-prompts-per-group questions of
                          --gsp-question-len tokens after each, output --gsp-output-len, every prompt
                          sent once, shuffled (defaults 64, 16, 2048, 128, 256)
  --dataset-name sharegpt  a conversation file's lengths need its tokenizer: give them as a trace of
                          (input, output) token counts (--dataset-path FILE, read as --lengths-from)
Sends: --request-rate with --burstiness (vllm: gamma gaps rescaled to end at n / rate, or a
--ramp-up-strategy from --ramp-up-start-rps to --ramp-up-end-rps; sglang: exponential gaps),
--max-concurrency alone (a closed loop), or --offline (every request at once), --num-prompts requests.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from infersim.base.errors import InferSimError

DATASETS = ("random", "prefix_repetition", "generated-shared-prefix", "sharegpt")
VLLM_RANDOM = (1024, 128)  # vllm bench serve --random-input-len / --random-output-len defaults
SGLANG_RANDOM = (1024, 1024)
PREFIX_REPETITION = {"num_prefixes": 10, "prefix_len": 256, "suffix_len": 256, "output_len": 128}
GSP = {"num_groups": 64, "prompts_per_group": 16, "system_prompt_len": 2048, "question_len": 128, "output_len": 256}
DATASET_FLAGS = ("dataset_name", "random_range_ratio", "random_prefix_len", "prefix_repetition_prefix_len",
                 "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
                 "gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len", "gsp_question_len",
                 "gsp_output_len", "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps", "dataset_path")


def add_flags(parser: argparse.ArgumentParser, number: Any) -> None:
    g = parser.add_argument_group("benchmark dataset flags (vllm bench serve, sglang.bench_serving)")
    g.add_argument("--bench-tool", choices=("vllm", "sglang"), default="vllm",
                   help="whose dataset flags these are (their range ratios differ; default vllm)")
    g.add_argument("--dataset-name", choices=DATASETS, default=None)
    g.add_argument("--dataset-path", default=None, help="sharegpt: a trace of (input, output) token counts")
    g.add_argument("--random-range-ratio", type=number(ge=0), default=None)
    g.add_argument("--random-prefix-len", type=number(whole=True, ge=0), default=None)
    for name in ("prefix-len", "suffix-len", "num-prefixes", "output-len"):
        g.add_argument(f"--prefix-repetition-{name}", type=number(whole=True, ge=0), default=None)
    for name in ("num-groups", "prompts-per-group", "system-prompt-len", "question-len", "output-len"):
        g.add_argument(f"--gsp-{name}", type=number(whole=True, ge=0), default=None)
    g.add_argument("--ramp-up-strategy", choices=("linear", "exponential"), default=None)
    g.add_argument("--ramp-up-start-rps", type=number(gt=0), default=None)
    g.add_argument("--ramp-up-end-rps", type=number(gt=0), default=None)


def uses_dataset_flags(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) is not None for name in DATASET_FLAGS)


def _whole_length(text: str | None, default: int, flag: str) -> int:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InferSimError(f"{flag} {text!r}: with the benchmark dataset flags a length is a whole number") from None
    if value != int(value) or value < 1:
        raise InferSimError(f"{flag} {text!r}: a whole number of tokens >= 1")
    return int(value)


def _random_data(args: argparse.Namespace) -> dict[str, Any]:
    sglang = args.bench_tool == "sglang"
    defaults = SGLANG_RANDOM if sglang else VLLM_RANDOM
    length = _whole_length(args.isl, defaults[0], "--random-input-len")
    output = _whole_length(args.osl, defaults[1], "--random-output-len")
    r = args.random_range_ratio or 0.0
    if not sglang and not 0 <= r < 1:
        raise InferSimError(f"--random-range-ratio {r:g}: vllm bench serve takes 0 <= r < 1")
    if sglang:
        lo_in, hi_in = max(1, int(length * r)), length
        lo_out, hi_out = max(1, int(output * r)), output
    else:
        lo_in, hi_in = math.floor(length * (1 - r)), math.ceil(length * (1 + r))
        lo_out, hi_out = max(1, math.floor(output * (1 - r))), max(1, math.ceil(output * (1 + r)))

    def dist(lo: int, hi: int) -> Any:
        return lo if lo == hi else {"dist": "uniform", "min": max(1, lo), "max": hi}

    return {"type": "random", "input": dist(lo_in, hi_in), "output": dist(lo_out, hi_out),
            "prefix_tokens": int(args.random_prefix_len or 0)}


def _pick(args: argparse.Namespace, prefix: str, defaults: dict[str, int]) -> dict[str, int]:
    return {key: int(getattr(args, f"{prefix}_{key}") if getattr(args, f"{prefix}_{key}") is not None else value)
            for key, value in defaults.items()}


def _data(args: argparse.Namespace) -> tuple[dict[str, Any], int | None]:
    """(data form, requests it fixes: generated-shared-prefix sends each prompt once)."""
    name = args.dataset_name or "random"
    if name == "random":
        return _random_data(args), None
    if name == "prefix_repetition":
        return {"type": "prefix_repetition", **_pick(args, "prefix_repetition", PREFIX_REPETITION)}, None
    if name == "generated-shared-prefix":
        gsp = _pick(args, "gsp", GSP)
        return {"type": "shared_prefix", "num_groups": gsp["num_groups"], "prompts_per_group": gsp["prompts_per_group"],
                "system_prompt_len": gsp["system_prompt_len"], "question_len": gsp["question_len"],
                "output_len": gsp["output_len"], "order": "once"}, gsp["num_groups"] * gsp["prompts_per_group"]
    raise InferSimError("--dataset-name sharegpt: a conversation file's token counts need its tokenizer; give its "
                        "(input, output) lengths as a trace with --lengths-from (or --dataset-path TRACE)")


def workload_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The workload form (infersim.serve.workload_spec) the benchmark flags describe."""
    data, fixed_count = _data(args)
    count = fixed_count or int(args.num_requests or 1000)
    sglang = args.bench_tool == "sglang"
    ramp = None
    if args.ramp_up_strategy is not None:
        if sglang or args.ramp_up_start_rps is None or args.ramp_up_end_rps is None:
            raise InferSimError("--ramp-up-strategy (vllm bench serve) needs --ramp-up-start-rps and --ramp-up-end-rps")
        ramp = {"strategy": args.ramp_up_strategy, "start_rps": args.ramp_up_start_rps, "end_rps": args.ramp_up_end_rps}
    if ramp is not None:
        stage = {"rate": args.ramp_up_start_rps, "num_requests": count}
    elif args.rate is not None and args.concurrency is None:
        stage = {"rate": args.rate, "num_requests": count}
    elif args.concurrency is not None and args.rate is None:
        stage = {"concurrency": args.concurrency, "num_requests": count}
    elif args.offline and args.rate is None and args.concurrency is None:
        stage = {"concurrency": count, "num_requests": count}
    else:
        raise InferSimError("with the benchmark dataset flags give one load: --request-rate, --max-concurrency, "
                            "--offline or a ramp-up (a rate with a concurrency cap is not modelled for them)")
    load: dict[str, Any] = {"timer": "poisson" if sglang else "vllm", "stages": [stage],
                            "burstiness": args.burstiness or 1.0}
    if ramp is not None:
        load["ramp_up"] = ramp
    notes = []
    if fixed_count is not None and args.num_requests is not None and args.num_requests != fixed_count:
        notes.append(f"generated-shared-prefix sends each of its {fixed_count:,} prompts once; --num-prompts "
                     f"{int(args.num_requests):,} not used")
    return {"load": load, "data": data, "notes": notes}
