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
                          --prefix-repetition-output-len
  --dataset-name generated-shared-prefix   sglang: --gsp-num-groups system prompts of
                          --gsp-system-prompt-len tokens, --gsp-prompts-per-group questions of
                          --gsp-question-len tokens after each, output --gsp-output-len, every prompt
                          sent once, shuffled
  --dataset-name sharegpt  a conversation file's lengths need its tokenizer: give them as a trace of
                          (input, output) token counts (--dataset-path FILE, read as --lengths-from)
Sends: --request-rate with --burstiness (vllm: gamma gaps rescaled to end at n / rate, or a
--ramp-up-strategy from --ramp-up-start-rps to --ramp-up-end-rps; sglang: exponential gaps),
--max-concurrency alone (a closed loop), or --offline (every request at once), --num-prompts requests.
Without --random-input-len/--random-output-len the random dataset takes the run config's workload
lengths (`workload_from_flags`' `lengths`), said in a note. Each tool's defaults, how it spreads the
random lengths, spaces its sends and which datasets it generates are data: engines/bench/*.yaml
(infersim.serve.bench_tools), each value beside the tool's source line.

`refuse_unread_flags` (end of this module) refuses every `serve` flag the chosen load would not read,
these and the others alike.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from infersim.base.errors import InferSimError, shorten
from infersim.base.texttable import counted
from infersim.serve.bench_tools import WORKLOAD_KEYS, BenchTool, GeneratedDataset, bench_tools, generated_dataset
from infersim.serve.workload_spec import MAX_PROMPTS, check_ramp_rises

#: --dataset-name's choices: random and sharegpt, and the generated datasets of engines/bench/*.yaml
DATASETS = ("random", "prefix_repetition", "generated-shared-prefix", "sharegpt")
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


def _random_data(args: argparse.Namespace, tool: BenchTool, lengths: tuple[int, int] | None,
                 notes: list[str]) -> dict[str, Any]:
    random = tool.random
    defaults = lengths or (random.input_len, random.output_len)
    length = _whole_length(args.isl, defaults[0], "--random-input-len")
    output = _whole_length(args.osl, defaults[1], "--random-output-len")
    unset = [kind for kind, given in (("input", args.isl), ("output", args.osl)) if given is None]
    if unset:
        notes.append(_lengths_note(unset, {"input": length, "output": output}, tool, lengths is not None))
    r = args.random_range_ratio if args.random_range_ratio is not None else random.range_ratio
    if random.spread == "around" and not 0 <= r < 1:
        raise InferSimError(f"--random-range-ratio {r:g}: {tool.program} takes 0 <= r < 1")
    if random.spread == "below":
        lo_in, hi_in = max(1, int(length * r)), length
        lo_out, hi_out = max(1, int(output * r)), output
    else:
        lo_in, hi_in = math.floor(length * (1 - r)), math.ceil(length * (1 + r))
        lo_out, hi_out = max(1, math.floor(output * (1 - r))), max(1, math.ceil(output * (1 + r)))

    def dist(lo: int, hi: int) -> Any:
        return lo if lo == hi else {"dist": "uniform", "min": max(1, lo), "max": hi}

    prefix = args.random_prefix_len if args.random_prefix_len is not None else random.prefix_len
    return {"type": "random", "input": dist(lo_in, hi_in), "output": dist(lo_out, hi_out),
            "prefix_tokens": int(prefix)}


def _lengths_note(unset: list[str], used: dict[str, int], tool: BenchTool, from_config: bool) -> str:
    """Which random-dataset lengths no flag gave, and where the ones used came from."""
    own = {"input": tool.random.input_len, "output": tool.random.output_len}
    plural = len(unset) > 1
    said = (" and ".join(f"--random-{kind}-len" for kind in unset) + " not given: "
            + " and ".join(f"{kind} length {used[kind]:,}" for kind in unset) + " tokens, ")
    if not from_config:
        return said + f"{tool.program}'s default{'s' if plural else ''}"
    keys = " and ".join(f"workload.{'isl' if kind == 'input' else 'osl'}" for kind in unset)
    defaults = " and ".join(f"{own[kind]:,}" for kind in unset)
    return said + f"the config's {keys} ({tool.program}'s own default{'s are' if plural else ' is'} {defaults})"


def _pick(args: argparse.Namespace, tool: BenchTool, dataset: GeneratedDataset, notes: list[str]) -> dict[str, int]:
    """The dataset's flags, each the tool's default where not given (said in a note, as the random
    dataset's lengths are)."""
    given = {key: getattr(args, dataset.attribute(key)) for key in dataset.defaults}
    unset = [key for key, value in given.items() if value is None]
    if unset:
        notes.append(f"not given, so {tool.program}'s default" + ("s" if len(unset) > 1 else "") + ": "
                     + ", ".join(f"{dataset.flag(key)} {dataset.defaults[key]}" for key in unset))
    return {key: int(value if value is not None else dataset.defaults[key]) for key, value in given.items()}


def _data(args: argparse.Namespace, tools: dict[str, BenchTool], lengths: tuple[int, int] | None,
          notes: list[str]) -> tuple[dict[str, Any], int | None]:
    """(data form, requests it fixes: generated-shared-prefix sends each prompt once, prefix_repetition
    a whole number of prompts per prefix)."""
    name = args.dataset_name or "random"
    if name == "random":
        return _random_data(args, tools[args.bench_tool], lengths, notes), None
    found = generated_dataset(name, tuple(tools.values()))
    if found is None:
        raise InferSimError("--dataset-name sharegpt: a conversation file's token counts need its tokenizer; give its "
                            "(input, output) lengths as a trace with --lengths-from (or --dataset-path TRACE)")
    tool, dataset = found
    picked = _pick(args, tool, dataset, notes)
    if dataset.workload == "prefix_repetition":
        return {"type": "prefix_repetition", **picked}, _repetition_count(args, tool, dataset, picked["num_prefixes"],
                                                                          notes)
    return _shared_prefix_data(dataset, picked)


def _shared_prefix_data(dataset: GeneratedDataset, gsp: dict[str, int]) -> tuple[dict[str, Any], int]:
    """Every prompt of every group, sent once (shuffled): the prompts fix the requests."""
    prompts = gsp["num_groups"] * gsp["prompts_per_group"]
    if prompts > MAX_PROMPTS:
        raise InferSimError(f"{dataset.flag('num_groups')} {gsp['num_groups']:,} x {dataset.flag('prompts_per_group')} "
                            f"{gsp['prompts_per_group']:,} = {prompts:,} prompts; at most {MAX_PROMPTS:,} (every "
                            "prompt is drawn and the list shuffled before the first request is sent)")
    return {"type": "shared_prefix", "num_groups": gsp["num_groups"], "prompts_per_group": gsp["prompts_per_group"],
            "system_prompt_len": gsp["system_prompt_len"], "question_len": gsp["question_len"],
            "output_len": gsp["output_len"], "order": "once"}, prompts


def _repetition_count(args: argparse.Namespace, tool: BenchTool, dataset: GeneratedDataset, prefixes: int,
                      notes: list[str]) -> int:
    """vllm bench serve's PrefixRepetitionRandomDataset makes num_prompts // num_prefixes prompts per
    prefix (refusing fewer prompts than prefixes) and sends those: a whole multiple of the prefixes."""
    asked = int(args.num_requests or tool.num_prompts)
    flag = dataset.flag("num_prefixes")
    given = "" if getattr(args, dataset.attribute("num_prefixes")) is not None else " (its default)"
    if prefixes < 1:
        raise InferSimError(f"{flag} {prefixes}: at least 1 prefix")
    if asked < prefixes:
        raise InferSimError(f"--num-prompts {asked:,} with {flag} {prefixes:,}{given}: "
                            f"{tool.program} makes num_prompts // num_prefixes prompts per prefix and refuses fewer "
                            f"prompts than prefixes; give --num-prompts >= {prefixes:,}")
    sent = asked // prefixes * prefixes
    if sent != asked:
        notes.append(f"--num-prompts {asked:,} with {flag} {prefixes:,}{given}: "
                     f"{sent:,} requests sent, {asked // prefixes:,} per prefix ({tool.program} makes num_prompts "
                     "// num_prefixes prompts per prefix)")
    return sent


def workload_from_flags(args: argparse.Namespace, lengths: tuple[int, int] | None = None) -> dict[str, Any]:
    """The workload form (infersim.serve.workload_spec) the benchmark flags describe; `lengths`: the
    random dataset's (input, output) lengths where its flags give none (the run config's workload;
    None: the bench tool's own defaults). Both are named in the form's notes."""
    notes: list[str] = []
    tools = {tool.tool: tool for tool in bench_tools()}
    tool = tools[args.bench_tool]
    data, fixed_count = _data(args, tools, lengths, notes)
    count = fixed_count or int(args.num_requests or tool.num_prompts)
    ramp = None
    if args.ramp_up_strategy is not None:
        if not tool.ramp_up or args.ramp_up_start_rps is None or args.ramp_up_end_rps is None:
            raise InferSimError("--ramp-up-strategy (vllm bench serve) needs --ramp-up-start-rps and --ramp-up-end-rps")
        start, end = args.ramp_up_start_rps, args.ramp_up_end_rps
        # checked here, under the flags' names: the form's keys (load.ramp_up) are not what the user wrote
        check_ramp_rises(start, end, f"--ramp-up-start-rps {_shown(start)} > --ramp-up-end-rps {_shown(end)}")
        ramp = {"strategy": args.ramp_up_strategy, "start_rps": start, "end_rps": end}
    if ramp is not None:
        stage = {"num_requests": count}  # the ramp sets the rate
    elif args.rate is not None and args.concurrency is None:
        stage = {"rate": args.rate, "num_requests": count}
    elif args.concurrency is not None and args.rate is None:
        stage = {"concurrency": args.concurrency, "num_requests": count}
    elif args.offline and args.rate is None and args.concurrency is None:
        stage = {"concurrency": count, "num_requests": count}
    else:
        raise InferSimError("with the benchmark dataset flags give one load: --request-rate, --max-concurrency, "
                            "--offline or a ramp-up (a rate with a concurrency cap is not modelled for them)")
    load: dict[str, Any] = {"timer": tool.arrivals, "stages": [stage], "burstiness": args.burstiness or tool.burstiness}
    if ramp is not None:
        load["ramp_up"] = ramp
    if data["type"] == "shared_prefix" and args.num_requests is not None and args.num_requests != fixed_count:
        notes.append(f"{args.dataset_name} sends each of its {counted(fixed_count, 'prompt')} once; --num-prompts "
                     f"{int(args.num_requests):,} not used")
    return {"load": load, "data": data, "notes": notes}


# -- flags the chosen load does not read
#
# A flag the chosen load would not read is refused in one line saying why, rather than dropped:
# `serve --workload FILE --isl 50` would otherwise report the file's own lengths under a command line
# that names others. A --workload file's stages give counts, rates and gaps and its data the lengths;
# the dataset flags give one stage, and each dataset reads its own flags only; a --trace's rows give
# arrival times and lengths, --lengths-from's (and --dataset-path's) the lengths; --burstiness
# shapes Poisson gaps and --max-waiting bounds an open loop's queue.

def dataset_own_flags(tools: tuple[BenchTool, ...]) -> dict[str, tuple[str, ...]]:
    """Each dataset's own flags (the argparse names): the random dataset's, each generated
    dataset's (engines/bench/*.yaml), sharegpt's file."""
    own: dict[str, tuple[str, ...]] = {"random": ("random_range_ratio", "random_prefix_len")}
    for tool in tools:
        for dataset in tool.datasets:
            own[dataset.name] = tuple(dataset.attribute(key) for key in dataset.defaults)
    own["sharegpt"] = ("dataset_path",)
    return own


def dataset_length_flags(tools: tuple[BenchTool, ...]) -> dict[str, tuple[str, str]]:
    """The flags a generated dataset builds its prompts and outputs from, in place of --isl/--osl."""
    found = {}
    for tool in tools:
        for dataset in tool.datasets:
            _keys, inputs, output = WORKLOAD_KEYS[dataset.workload]
            found[dataset.name] = (" and ".join(dataset.flag(key) for key in inputs), dataset.flag(output))
    return found


LENGTH_FLAGS = (("isl", "--isl (--random-input-len)"), ("osl", "--osl (--random-output-len)"))


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else shorten(str(value))


def _sweeping(args: argparse.Namespace) -> bool:
    return args.rate_sweep is not None or bool(args.max_rate_under_slo)


def refuse_unread_flags(args: argparse.Namespace) -> None:
    """Refuse, in one line naming the flag, its value and why, a flag the load does not read."""
    _dataset_flags(args)
    _length_flags(args)
    if args.workload is not None:
        _workload_flags(args)
    elif uses_dataset_flags(args) and args.dataset_name != "sharegpt":
        _bench_load_flags(args)
    else:
        _plain_load_flags(args)
    _output_flags(args)


def _dataset_flags(args: argparse.Namespace) -> None:
    if not uses_dataset_flags(args):
        if args.bench_tool != "vllm":
            raise InferSimError(f"--bench-tool {args.bench_tool}: says whose dataset flags are given, and none is; "
                                "give --dataset-name (e.g. random, whose lengths the tools draw differently)")
        return
    name = args.dataset_name or "random"
    chosen = f"--dataset-name {name}" if args.dataset_name else "the random dataset (no --dataset-name)"
    tools = bench_tools()
    for dataset, own in dataset_own_flags(tools).items():
        given = [attr for attr in own if getattr(args, attr, None) is not None] if dataset != name else []
        if given:
            raise InferSimError(f"{_flag(given[0])} {_shown(getattr(args, given[0]))}: a flag of --dataset-name "
                                f"{dataset}; the load is {chosen}")
    lengths = dataset_length_flags(tools)
    if name in lengths:
        for (attr, flag), instead in zip(LENGTH_FLAGS, lengths[name]):
            if getattr(args, attr) is not None:
                raise InferSimError(f"{flag} {_shown(getattr(args, attr))}: the random dataset's length; "
                                    f"--dataset-name {name} builds its requests from {instead}")
    _ramp_flags(args)
    if args.trace is not None:
        raise InferSimError(f"--trace {shorten(args.trace)} with {chosen}: choose one load (a trace's rows, or the "
                            "dataset's requests)")


def _ramp_flags(args: argparse.Namespace) -> None:
    if args.ramp_up_strategy is None:
        for attr in ("ramp_up_start_rps", "ramp_up_end_rps"):
            if getattr(args, attr) is not None:
                raise InferSimError(f"{_flag(attr)} {_shown(getattr(args, attr))}: a rate of the --ramp-up-strategy "
                                    "ramp, and no --ramp-up-strategy is given")
        return
    for flag, on, why in ((f"--request-rate {_shown(args.rate)}", args.rate is not None,
                           "vllm bench serve refuses both too"),
                          (f"--max-concurrency {_shown(args.concurrency)}", args.concurrency is not None,
                           "a ramp under a cap is not modelled"),
                          ("--offline", args.offline, "the ramp spaces the sends")):
        if on:
            raise InferSimError(f"{flag} with --ramp-up-strategy {args.ramp_up_strategy}: the ramp sets the rate, "
                                f"from --ramp-up-start-rps to --ramp-up-end-rps ({why}); drop {flag.split()[0]}")


def _length_source(args: argparse.Namespace) -> str | None:
    """What gives the requests' lengths where no --isl/--osl can (None: they can)."""
    if args.workload is not None:
        return f"--workload {shorten(args.workload)} gives each request's lengths (its data)"
    if args.trace is not None:
        return f"--trace {shorten(args.trace)} gives each request's lengths (its rows)"
    if args.dataset_name == "sharegpt" and args.dataset_path is not None:
        return f"--dataset-name sharegpt draws each request's lengths from --dataset-path {shorten(args.dataset_path)}"
    if args.lengths_from is not None:
        return f"--lengths-from {shorten(args.lengths_from)} draws each request's lengths from its rows"
    return None


def _length_flags(args: argparse.Namespace) -> None:
    name = args.dataset_name or "random"
    if args.lengths_from is not None and uses_dataset_flags(args) and args.workload is None:
        also = "; drop --lengths-from" if name == "sharegpt" else ""
        raise InferSimError(f"--lengths-from {shorten(args.lengths_from)}: --dataset-name {name} builds each "
                            f"request's lengths" + (" from --dataset-path" if name == "sharegpt" else "") + also)
    source = _length_source(args)
    if source is None:
        return
    for attr, flag in LENGTH_FLAGS:
        if getattr(args, attr) is not None:
            raise InferSimError(f"{flag} {_shown(getattr(args, attr))}: {source}; drop {flag.split()[0]}")
    if args.lengths_from is not None and not source.startswith("--lengths-from"):
        raise InferSimError(f"--lengths-from {shorten(args.lengths_from)}: {source}; drop --lengths-from")


def _workload_flags(args: argparse.Namespace) -> None:
    where = f"--workload {shorten(args.workload)}"
    for attr, why in (("num_requests", "its stages give their own request counts"),
                      ("burstiness", "its load.burstiness shapes its gaps"),
                      ("prefix_hit_rate", "its prompts share prefixes by their tokens, and the prefix cache "
                                          "finds them"),
                      ("disaggregate", "a staged workload runs on colocated instances; PD disaggregation of it is "
                                       "not modelled")):
        value = getattr(args, attr)
        if value is not None:
            raise InferSimError(f"{_flag(attr)} {_shown(value)} with {where}: {why}")


def _bench_load_flags(args: argparse.Namespace) -> None:
    name = args.dataset_name or "random"
    closed = args.ramp_up_strategy is None and args.rate is None  # --max-concurrency alone, or --offline
    sends = ("--offline sends every request at t = 0" if args.offline else
             f"--max-concurrency {_shown(args.concurrency)} alone is a closed loop: a client sends when its last "
             "request ends")
    for attr, on, why in (
            ("prefix_hit_rate", True, f"--dataset-name {name}'s prompts share prefixes by their tokens, and the "
                                      "prefix cache finds them"),
            ("disaggregate", True, "the dataset flags run as a staged workload, on colocated instances; PD "
                                   "disaggregation of one is not modelled"),
            ("burstiness", closed, f"shapes the gaps of --request-rate or a ramp; {sends}"),
            ("max_waiting", closed, f"bounds an open loop's queue; {sends}")):
        value = getattr(args, attr)
        if on and value is not None:
            raise InferSimError(f"{_flag(attr)} {_shown(value)}: {why}")


def _plain_load_flags(args: argparse.Namespace) -> None:
    """--rate, --concurrency, --offline, --trace and the rate searches."""
    closed = args.concurrency is not None and args.rate is None and not _sweeping(args)
    if args.burstiness is not None:
        for on, why in ((args.trace is not None, f"--trace {shorten(str(args.trace))}'s rows give the arrival times"),
                        (args.offline, "--offline sends every request at t = 0"),
                        (closed, f"--concurrency {_shown(args.concurrency)} alone is a closed loop: a client sends "
                                 "when its last request ends")):
            if on:
                raise InferSimError(f"--burstiness {_shown(args.burstiness)}: shapes Poisson gaps (--rate); {why}")
    if args.max_waiting is not None:
        for on, why in ((args.offline, "--offline hands the engine its requests as it takes them"),
                        (args.concurrency is not None, f"with --concurrency {_shown(args.concurrency)} the client "
                                                       "holds the requests beyond its slots")):
            if on:
                raise InferSimError(f"--max-waiting {_shown(args.max_waiting)}: bounds an open loop's queue; {why}")


#: what --requests-out writes, by the file's suffix
REQUEST_FORMATS = (".jsonl", ".csv")


def _output_flags(args: argparse.Namespace) -> None:
    if _sweeping(args):
        return  # records with a search are refused with the search's own reason
    if args.include_requests and args.format != "json":
        raise InferSimError("--include-requests puts per-request records in the JSON output: give --format json, "
                            "or --requests-out FILE (.jsonl or .csv) beside the text report")
    out = args.requests_out
    # a name that is no file (empty, a directory) is refused where the file is written, for that reason
    if out and not os.path.isdir(out) and not out.endswith(REQUEST_FORMATS):
        hint = "; --include-requests --format json puts them in the JSON output" if out.endswith(".json") else ""
        raise InferSimError(f"--requests-out {shorten(out)}: the suffix says the format: .jsonl (one JSON record a "
                            f"line) or .csv{hint}")


def refuse_unread_by_stages(args: argparse.Namespace, spec: Any) -> None:
    """Flags a parsed workload's stages leave unread: --max-waiting where every stage is a closed loop."""
    if args.max_waiting is not None and all(stage.concurrency is not None for stage in spec.stages):
        raise InferSimError(f"--max-waiting {_shown(args.max_waiting)}: bounds an open loop's queue; every stage of "
                            f"--workload {shorten(str(args.workload))} is a closed loop (concurrency), whose clients "
                            "hold their requests")
