"""`infersim serve`: request-level serving simulation of a run config."""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from typing import Any

from infersim.base.plaindata import loads_yaml, parse_flag_value
from infersim.base.errors import ConfigError, InferSimError
from infersim.base.texttable import counted

#: the percentile of TTFT and TPOT the SLO search holds to its limits unless told (MLPerf Server: p99)
DEFAULT_SLO_PERCENTILE = 99.0
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_slo(text: str) -> dict[str, float]:
    """'ttft=2s,tpot=50ms' -> {'ttft_s': 2.0, 'tpot_s': 0.05}. Every limit names its unit (s, ms or
    us): a bare number is refused rather than taken in a unit the writer may not have meant."""
    from infersim.cards.schema import check_number
    from infersim.base.errors import ConfigError, echo

    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(ttft|tpot)\s*=\s*([0-9.eE+-]+|inf|nan)\s*(s|ms|us)?", part, re.IGNORECASE)
        if not match:
            raise InferSimError(f"--slo {echo(text)}: expected ttft=VALUE{{s|ms|us}},tpot=VALUE{{s|ms|us}}, "
                                "e.g. ttft=2s,tpot=50ms")
        metric, number, unit = match.group(1).lower(), match.group(2), match.group(3)
        if unit is None:
            raise InferSimError(f"--slo {echo(text)}: {metric}={number} needs a unit (s, ms or us), e.g. "
                                f"{metric}={number}ms or {metric}={number}s")
        try:
            value = check_number(number, "--slo", metric, gt=0) * UNITS[unit.lower()]
        except ConfigError as exc:
            raise InferSimError(f"--slo {echo(text)}: {metric}={number}{unit}: {exc.problem}") from None
        if f"{metric}_s" in out:
            raise InferSimError(f"--slo {echo(text)}: {metric} is given twice; give each limit once")
        out[f"{metric}_s"] = value
    if not out:
        raise InferSimError(f"--slo {echo(text)}: give ttft=... and/or tpot=...")
    return out


def parse_slos(texts: list[str] | str) -> dict[str, float]:
    """Every --slo flag's limits together ('--slo ttft=2s --slo tpot=50ms' is both); a limit given by
    two flags is refused rather than one of them kept."""
    from infersim.base.errors import echo

    merged: dict[str, float] = {}
    first: dict[str, str] = {}
    for text in [texts] if isinstance(texts, str) else texts:
        for key, value in parse_slo(text).items():
            if key in merged:
                metric = key.removesuffix("_s")
                raise InferSimError(f"--slo {echo(text)}: {metric} is given twice (also in --slo "
                                    f"{echo(first[key])}); give each limit once")
            merged[key], first[key] = value, text
    return merged


def _length(text: str | None, name: str) -> Any:
    if text is None:
        return None
    # the length and nesting rule and a key given twice, each its own message; parse_flag_value takes
    # text YAML cannot read for text, which a length is not
    parse_flag_value(text, f"--{name}")
    try:
        return loads_yaml(text, f"--{name} {text!r}")
    except ConfigError:
        raise InferSimError(f"--{name} {text!r}: expected a number or a mapping like "
                            "'{dist: lognormal, mean: 2000, std: 800}'") from None


def read_workload_file(path: str) -> dict[str, Any]:
    """A workload file: an inference-perf profile, a trainval experiment's `workload:` stanza, or
    InferSim's own workload form (optionally under a top-level `workload:` key)."""
    from pathlib import Path

    from infersim.base.errors import ConfigError
    from infersim.cards.schema import load_yaml
    from infersim.serve.inference_perf import is_inference_perf, workload_from_inference_perf
    from infersim.serve.trainval import trainval_workload

    try:  # load_yaml: text that is not UTF-8, a key given twice, nesting too deep are one message each
        loaded = load_yaml(Path(path), "workload file")
    except ConfigError as exc:
        raise InferSimError(f"--workload {exc}") from None
    if not isinstance(loaded, dict):
        raise InferSimError(f"--workload {path}: expected a mapping")
    if is_inference_perf(loaded):
        return workload_from_inference_perf(loaded, f"inference-perf profile {path}")
    body = loaded.get("workload", loaded) if set(loaded) <= {"workload"} else loaded
    if isinstance(body, dict) and "num_unique_system_prompts" in body:
        return trainval_workload(body)
    return body


def _workload_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The workload a --workload file or the benchmark dataset flags describe (None: neither)."""
    from infersim.serve.bench_flags import refuse_unread_by_stages, uses_dataset_flags, workload_from_flags

    flags = uses_dataset_flags(args) and args.dataset_name != "sharegpt"
    if args.workload is None and not flags:
        return None
    if args.workload is not None and (flags or args.rate is not None or args.concurrency is not None
                                      or args.offline or args.trace is not None):
        raise InferSimError("--workload is its own load: drop --rate, --concurrency, --offline, --trace and the "
                            "dataset flags")
    if args.rate_sweep is not None or args.max_rate_under_slo:
        raise InferSimError("--rate-sweep and --max-rate-under-slo vary a Poisson rate; a workload has its own stages")
    form = read_workload_file(args.workload) if args.workload is not None else workload_from_flags(args)
    spec = parsed_workload(form, f"--workload {args.workload}" if args.workload is not None else
                           f"--dataset-name {args.dataset_name or 'random'}")
    refuse_unread_by_stages(args, spec)
    options: dict[str, Any] = {"workload": spec, "seed": args.seed, "replicas": args.replicas,
                               "router": args.router or "round-robin"}
    return options


def parsed_workload(form: Any, source: str) -> Any:
    """The workload form checked where it was given: a bad value's message names `source` (the file,
    or the dataset flags) before the key and the value."""
    from infersim.serve.workload_spec import parse_workload

    try:
        return parse_workload(form)
    except InferSimError as exc:
        raise InferSimError(f"{source}: {exc}") from None


def _extras(args: argparse.Namespace) -> dict[str, Any]:
    given = {"max_waiting": args.max_waiting, "max_model_len": args.max_model_len, "host_kv_bytes": args.host_kv_bytes}
    return {name: value for name, value in given.items() if value is not None}


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from infersim.serve.bench_flags import refuse_unread_flags

    refuse_unread_flags(args)
    _check_search_flags(args, args.rate_sweep is not None or bool(args.max_rate_under_slo))
    workload = _workload_options(args)
    if workload is not None:
        if args.slo:
            workload["slo"] = parse_slos(args.slo)
        return {**workload, **_extras(args)}
    if args.dataset_name == "sharegpt" and not args.dataset_path:
        raise InferSimError("--dataset-name sharegpt: give its (input, output) token counts as a trace with "
                            "--dataset-path (a conversation file's lengths need its tokenizer)")
    return {**_legacy_options(args), **_extras(args)}


def with_config_lengths(args: argparse.Namespace, options: dict[str, Any], config: Any) -> dict[str, Any]:
    """The random dataset's lengths where --random-input-len/--random-output-len give none: the run
    config's workload (the lengths the user's config describes), named in a note; vllm bench serve's
    own defaults (engines/bench/vllm-bench-serve.yaml) describe no config."""
    from infersim.serve.bench_flags import uses_dataset_flags, workload_from_flags

    if args.workload is not None or not uses_dataset_flags(args) or (args.dataset_name or "random") != "random":
        return options
    if args.isl is not None and args.osl is not None:
        return options
    form = workload_from_flags(args, (config.workload.isl, config.workload.osl))
    return {**options, "workload": parsed_workload(form, "--dataset-name random")}


def _legacy_options(args: argparse.Namespace) -> dict[str, Any]:
    # a rate with a concurrency is a Poisson load capped at that many in flight (vllm bench serve's
    # and sglang.bench_serving's --request-rate with --max-concurrency); a rate search's rates likewise
    sweeping = args.rate_sweep is not None or args.max_rate_under_slo
    capped = (args.rate is not None or sweeping) and args.concurrency is not None
    modes = [m for m, on in (("offline", args.offline), ("concurrency", args.concurrency is not None and not capped),
                             ("trace", args.trace is not None), ("poisson", args.rate is not None)) if on]
    if len(modes) > 1:
        raise InferSimError("choose one load: --rate, --concurrency, --offline or --trace (got " + ", ".join(modes) + ")")
    if sweeping and modes and modes != ["poisson"]:
        raise InferSimError("--rate-sweep and --max-rate-under-slo vary a Poisson rate; drop " + modes[0])
    if not modes and not sweeping:
        raise InferSimError("give a load: --rate R (--request-rate), --concurrency N (--max-concurrency), --offline, "
                            "--trace FILE or --workload FILE")
    options: dict[str, Any] = {"mode": modes[0] if modes else "poisson", "seed": args.seed, "replicas": args.replicas,
                               "router": args.router or "round-robin"}
    if args.num_requests is not None:  # else: a trace replays every row, other loads 1000 requests
        options["num_requests"] = args.num_requests
    given = {"rate": args.rate, "concurrency": args.concurrency, "trace": args.trace,
             "trace_time_scale": args.trace_time_scale if args.trace is not None else None,
             "isl": _length(args.isl, "isl"), "osl": _length(args.osl, "osl"),
             "lengths_trace": args.dataset_path if args.dataset_name == "sharegpt" else args.lengths_from,
             "burstiness": args.burstiness, "prefix_hit_rate": args.prefix_hit_rate}
    options.update({name: value for name, value in given.items() if value is not None})
    if capped:
        options["concurrency"] = args.concurrency
    if args.slo:
        options["slo"] = parse_slos(args.slo)
    if args.slo_percentile is not None and args.slo_percentile not in (50, 90, 99):
        options["percentiles"] = [args.slo_percentile]  # the search reads its runs' summaries at it
    if args.disaggregate:
        options["disaggregate"] = args.disaggregate
    return options


def _check_search_flags(args: argparse.Namespace, sweeping: bool) -> None:
    """Flags that only a rate search or a trace reads are refused where nothing would read them,
    rather than ignored without a word."""
    search = "--rate-sweep" if args.rate_sweep is not None else "--max-rate-under-slo"
    if sweeping and args.rate is not None:
        raise InferSimError(f"--rate {args.rate:g} with {search}: the search chooses the rates; drop --rate (or the "
                            "search, to simulate one rate); --concurrency N caps every searched rate at N in flight")
    if args.slo_percentile is not None and not args.max_rate_under_slo:
        raise InferSimError(f"--slo-percentile {args.slo_percentile:g}: the percentile of TTFT and TPOT that "
                            "--max-rate-under-slo holds to the --slo limits, and there is no such search (a run's "
                            "goodput, and a sweep's SLO met, count the requests that meet --slo each; p50, p90 and "
                            "p99 are reported); drop it, or add --max-rate-under-slo")
    if not sweeping:
        for flag, value in (("--executor", args.executor), ("--workers", args.workers)):
            if value is not None:
                raise InferSimError(f"{flag} {value}: runs the points of --rate-sweep or --max-rate-under-slo; a "
                                    "single serving run uses neither")
    if args.router is not None and args.replicas == 1 and args.disaggregate is None:  # xPyD pools route too
        raise InferSimError(f"--router {args.router}: chooses which of the --replicas instances takes a request, and "
                            "there is one; give --replicas N")
    if args.trace is None and args.trace_time_scale is not None:
        raise InferSimError(f"--trace-time-scale {args.trace_time_scale:g} scales a --trace's arrival times; "
                            "there is no --trace")


def write_requests(path: str, records: list[dict[str, Any]], args: argparse.Namespace | None = None) -> None:
    """Per-request records (of the completed requests) to `path`, never over one of the files the run
    read (`args`: its flags)."""
    from infersim.base.outputs import RUN_INPUT_FLAGS, check_output_path, inputs_of
    from infersim.serve.metrics import REQUEST_FIELDS

    files = {"--trace": "trace", "--workload": "workload", "--lengths-from": "lengths_from",
             "--dataset-path": "dataset_path", **RUN_INPUT_FLAGS}
    check_output_path(path, "--requests-out", inputs_of(args, files) if args is not None else None)
    try:
        with open(path, "w", newline="") as fh:
            if path.endswith(".csv"):
                writer = csv.DictWriter(fh, fieldnames=list(records[0]) if records else REQUEST_FIELDS)
                writer.writeheader()
                writer.writerows(records)
            else:
                for rec in records:
                    fh.write(json.dumps(rec) + "\n")
    except OSError as exc:
        raise InferSimError(f"--requests-out {path}: cannot write ({exc.strerror})") from None


def _request_length(text: str | None, name: str) -> int | None:
    """The workload length (memory sizing, the report) a --isl/--osl value stands for: the number,
    or a distribution's mean."""
    value = _length(text, name)
    if isinstance(value, dict):
        value = value.get("mean")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value < math.inf:
        return None  # left to the options' own check, which names the problem
    return max(1, round(value))


def run_block(config: Any, options: dict[str, Any]) -> dict[str, Any]:
    """What a serving result ran on, for its JSON (pictures are titled from it)."""
    dep = config.deployment
    return {"model": config.model.name, "hardware": config.hardware.name, "num_gpus": dep.num_gpus,
            "engine": f"{config.engine.name} {config.engine.version}", "title": serve_title(config, options)}


def serve_title(config: Any, options: dict[str, Any]) -> str:
    """Model, GPUs, engine and load of a serving run, for report and picture titles."""
    dep = config.deployment
    mode = options.get("mode", "workload" if options.get("workload") is not None else "poisson")
    if mode == "poisson":
        load = f"Poisson {options.get('rate', 0):g} req/s" + (
            f", at most {options['concurrency']} in flight" if options.get("concurrency") else "")
    elif mode == "concurrency":
        load = counted(options["concurrency"], "concurrent client")
    elif mode == "workload" or options.get("workload") is not None:
        from infersim.serve.workload_spec import parse_workload

        load = parse_workload(options["workload"]).describe()
    else:
        load = {"offline": "offline (all requests at once)", "trace": "trace replay"}.get(mode, mode)
    return (f"{config.model.name} on {dep.num_gpus} x {config.hardware.name}, {config.engine.name} "
            f"{config.engine.version}; {load}")


def _serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from infersim.cli.main import print_notes
    from infersim.run.config import load_run_config
    from infersim.cli.main import command_overrides, flags_from_args
    from infersim.serve import report
    from infersim.serve.api import simulate_serving

    options = options_from_args(args)
    if (args.rate_sweep is not None or args.max_rate_under_slo) and (args.include_requests or args.requests_out):
        given = "--include-requests" if args.include_requests else f"--requests-out {args.requests_out}"
        raise InferSimError(f"{given}: per-request records are those of one run, and --rate-sweep and "
                            "--max-rate-under-slo run many; run `infersim serve --rate R` at the rate whose requests "
                            "you want")
    flags = replace(flags_from_args(args), isl=_request_length(args.isl, "isl"), osl=_request_length(args.osl, "osl"))
    config = load_run_config(args.config, command_overrides(args), args.mfu_tables, flags)
    print_notes(config)
    options = with_config_lengths(args, options, config)
    launch = _launch_plan(config, options) if args.emit_launch else None
    want_records = bool(args.requests_out) or args.include_requests
    executor, client = None, None
    if args.executor:
        from infersim.sweep.cluster import dask_executor

        executor, client = dask_executor(args.executor)
    try:
        if args.rate_sweep is not None or args.max_rate_under_slo:
            return _search(args, config, options, executor, launch)
        count = options.get("num_requests")
        with progress_note("the serving run" + (f" of {counted(count, 'request')}" if count else "")):
            summary = simulate_serving(config, {**options, "requests": want_records})
    except OSError as exc:  # the Dask scheduler went away mid-search (CommClosedError is an OSError)
        if client is None:
            raise
        raise InferSimError(f"--executor {args.executor}: the Dask cluster failed during the search "
                            f"({type(exc).__name__}: {exc})") from None
    finally:
        if client is not None:
            client.close()
    for warning in summary.get("warnings", ()):
        print(f"infersim: warning: {warning}", file=sys.stderr)
    from infersim.calibrate.beside import beside_text, serving_beside

    calibration = serving_beside(config, options, summary)
    if calibration is not None:
        summary["calibration"] = calibration
    records = summary.pop("requests", None) if not args.include_requests else summary.get("requests")
    if args.requests_out:  # written whatever completed: a stale file of an earlier run is not left behind
        write_requests(args.requests_out, records or [], args)
    if args.format == "json":
        print(json.dumps({"run": run_block(config, options), **summary, **_launch_json(launch)}, indent=2))
    else:
        print(report.summary_text(summary, f"InferSim serve: {serve_title(config, options)}")
              + (f"\n\n{beside_text(calibration)}" if calibration else "") + _launch_text(launch))
    return 0


def _launch_plan(config: Any, options: dict[str, Any]) -> Any:
    """The commands that realise the serving run's pools (built, not run: the settings are the same),
    with the run's max_model_len (--max-model-len, or the workload's), which each server then admits."""
    from infersim.launch.build import plan_for_pools
    from infersim.serve.options import parse_options
    from infersim.serve.simulate import serving_pools

    opts = parse_options(dict(options))
    limit = opts.max_model_len or (opts.workload.max_model_len if opts.workload is not None else None)
    return plan_for_pools(serving_pools(config, opts), limit)


def _launch_json(launch: Any) -> dict[str, Any]:
    if launch is None:
        return {}
    from infersim.launch.report import plan_json

    return {"launch": plan_json(launch)}


def _launch_text(launch: Any) -> str:
    if launch is None:
        return ""
    from infersim.launch.report import plan_text

    return "\n\n" + plan_text(launch)


def _search(args: argparse.Namespace, config: Any, options: dict[str, Any], executor: Any, launch: Any) -> int:
    """--rate-sweep and --max-rate-under-slo; Ctrl-C or SIGTERM prints what finished, marked partial."""
    from infersim.serve.search import RateRunner
    from infersim.sweep.runner import sigterm_interrupts

    out: dict[str, Any] = {}
    text: list[str] = []
    stopped = ""
    with sigterm_interrupts(), RateRunner(config, options, executor, args.workers, None) as runner:
        if args.rate_sweep is not None:
            stopped = _rate_sweep(args.rate_sweep, runner, out, text)
        if args.max_rate_under_slo and not stopped:
            stopped = _slo_search(args, config, options, runner, out, text)
    if "slo" in options:
        out["slo"] = {"ttft_ms": options["slo"].get("ttft_s", 0) * 1e3 or None,
                      "tpot_ms": options["slo"].get("tpot_s", 0) * 1e3 or None}
    searched = " and ".join(w for w, on in ((f"Poisson rates {args.rate_sweep}", args.rate_sweep is not None),
                                             ("the highest rate under the SLO", args.max_rate_under_slo)) if on)
    if stopped:
        out["interrupted"] = stopped
    if args.format == "json":
        print(json.dumps({"run": run_block(config, {**options, "mode": searched}), **out, **_launch_json(launch)},
                         indent=2))
    else:
        print(f"InferSim serve: {serve_title(config, {**options, 'mode': searched})}\n" + "\n\n".join(text)
              + _launch_text(launch))
    if stopped:
        import sys

        print(f"infersim: interrupted{' by SIGTERM' if stopped == 'SIGTERM' else ''}: the runs that finished are "
              "printed above, marked partial", file=sys.stderr)
        return 143 if stopped == "SIGTERM" else 130
    return 0


def _rate_sweep(text_range: str, runner: Any, out: dict[str, Any], text: list[str]) -> str:
    """The rate sweep into `out` and `text`; returns how it was interrupted ("" when it finished)."""
    from infersim.serve import report
    from infersim.serve.search import RunInterrupted, parse_rate_range, rate_sweep

    rates = parse_rate_range(text_range)
    try:
        rows = rate_sweep(runner, rates)
    except RunInterrupted as exc:
        rows = [{"rate": rate, **row} for rate, row in exc.finished]
        out["rate_sweep"] = rows
        text.append(f"PARTIAL: interrupted after {len(rows)} of {counted(len(rates), 'rate')}\n"
                    + (report.sweep_text(rows) if rows else "no rate finished"))
        return exc.by
    out["rate_sweep"] = rows
    text.append(report.sweep_text(rows))
    return ""


def _slo_search(args: argparse.Namespace, config: Any, options: dict[str, Any], runner: Any, out: dict[str, Any],
                text: list[str]) -> str:
    """The highest rate under the SLO into `out` and `text`; returns how it was interrupted ("" when it finished)."""
    from infersim.serve import report
    from infersim.serve.api import simulate_serving
    from infersim.serve.search import max_rate_under_slo

    slo = options.get("slo")
    if not slo:
        raise InferSimError("--max-rate-under-slo needs --slo ttft=...,tpot=...")
    with progress_note("the offline run that bounds the search"):
        offline = simulate_serving(config, {**options, "mode": "offline", "rate": None})
    found = max_rate_under_slo(runner, offline, slo.get("ttft_s"), slo.get("tpot_s"),
                               args.slo_percentile if args.slo_percentile is not None else DEFAULT_SLO_PERCENTILE)
    out["max_rate_under_slo"] = found
    if not found.get("interrupted"):
        text.append(report.slo_search_text(found))
        return ""
    best, below = found["max_rate"], found.get("below")
    known = (f"at least {best:.3f} req/s meets it" if best is not None else "no probed rate met it yet") + \
        (f"; {below:.3f} req/s misses it" if below is not None else "")
    text.append(f"PARTIAL: the search for the highest rate under the SLO was interrupted after "
                f"{counted(len(found['probes']), 'probe')}: {known}\n  probes: "
                + (", ".join(f"{p['rate']:.3g}{'+' if p['met'] else 'x'}" for p in found["probes"]) or "none")
                + "   (+ met, x missed)")
    return str(found["interrupted"])


class progress_note:  # noqa: N801 - used as a context manager, named for what it says
    """Lines on stderr while one long serving run computes (after a few seconds, then every few
    more): how long it has run. A run's statistics need every request, so nothing partial exists
    to print when it is stopped; that is said instead of a bare 'interrupted'."""

    def __init__(self, what: str, first_s: float = 3.0, every_s: float = 10.0) -> None:
        import threading

        self.what, self.first_s, self.every_s = what, first_s, every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.start = 0.0

    def _beat(self) -> None:
        import sys
        import time

        wait = self.first_s
        while not self.done.wait(wait):
            print(f"infersim: serve progress: {self.what}: still running after {time.perf_counter() - self.start:,.0f} s "
                  "(Ctrl-C stops it)", file=sys.stderr, flush=True)
            wait = self.every_s

    def __enter__(self) -> progress_note:
        import time

        self.start = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            import sys
            import time

            print(f"infersim: serve: {self.what} stopped after {time.perf_counter() - self.start:,.0f} s: a serving "
                  "run's statistics need every request, so there is no partial result to print (--num-requests "
                  "runs a shorter one)", file=sys.stderr)


def _number(**rule: Any) -> Any:
    from infersim.cli.main import number_arg

    return number_arg(**rule)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="request-level serving simulation: arrivals, continuous batching, chunked prefill, paged KV, "
                      "PD disaggregation; TTFT/TPOT/ITL percentiles and throughput",
        description="Simulate serving a stream of requests on the config's deployment with its engine card's "
                    "scheduler. Steps are priced by the stage engine. Output names follow vllm bench serve.")
    p.add_argument("--config", default=None, help="run config: a path or a bundled example (serve-llama-8b-h100.yaml); "
                                                  "or name the deployment with --model, --hardware and the flags below")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any config field (repeatable)")
    p.add_argument("--mfu-tables", default=None, metavar="DIR", help="directory of measured kernel tables")
    load = p.add_argument_group("load (one of)")
    load.add_argument("--rate", type=_number(gt=0), default=None, help="open loop: Poisson arrivals at this many requests/s")
    load.add_argument("--concurrency", type=_number(whole=True, gt=0), default=None,
                      help="closed loop: this many clients; with --rate: at most this many requests in flight")
    load.add_argument("--offline", action="store_true", help="all requests at t = 0 (trtllm-bench / MLPerf Offline)")
    load.add_argument("--trace", default=None, metavar="FILE",
                      help="replay a JSONL/CSV trace (arrival, input, output tokens; Azure column names accepted)")
    load.add_argument("--workload", default=None, metavar="FILE",
                      help="a workload file: an inference-perf profile (load stages, shared-prefix or random data), "
                           "or InferSim's workload form (stages, shared prefixes, sessions; docs/serving.md)")
    p.add_argument("--trace-time-scale", type=_number(gt=0), default=None, help="multiply trace arrival times (0.5 = 2x rate)")
    p.add_argument("--num-requests", type=_number(whole=True, gt=0), default=None,
                   help="requests to simulate (default 1000; a trace replays all its rows unless given)")
    p.add_argument("--isl", default=None, help="input length: N, or '{dist: lognormal, mean: 2000, std: 800}' "
                                              "(default: the config's workload.isl)")
    p.add_argument("--osl", default=None, help="output length, as --isl (default: workload.osl)")
    p.add_argument("--lengths-from", default=None, metavar="TRACE",
                   help="draw (input, output) lengths from a trace's rows, with --rate/--concurrency/--offline")
    p.add_argument("--burstiness", type=_number(gt=0), default=None, help="gamma shape of Poisson gaps (1 = Poisson)")
    p.add_argument("--seed", type=_number(whole=True, ge=0), default=0, help="random seed (default 0)")
    p.add_argument("--replicas", type=_number(whole=True, gt=0), default=1, help="data-parallel copies of the deployment behind a router")
    p.add_argument("--router", choices=("round-robin", "least-loaded", "cache-aware"), default=None,
                   help="how requests reach --replicas (default round-robin; cache-aware: where most of the prompt is "
                        "cached, as SGLang's router; staged workloads only)")
    p.add_argument("--max-waiting", type=_number(whole=True, ge=0), default=None,
                   help="open loop: requests an instance's queue holds before further arrivals are left waiting "
                        "(the overload guard; default 10000, 0: no bound)")
    p.add_argument("--max-model-len", type=_number(whole=True, gt=1), default=None,
                   help="longest request (prompt + output tokens) the server runs whole; longer ones are rejected "
                        "or, where the engine cuts them (vLLM 0.33), admitted with their output cut to fit")
    p.add_argument("--host-kv-bytes", type=_number(gt=0), default=None,
                   help="host (CPU) memory per instance for a host tier of the prefix cache, bytes (e.g. 100e9), "
                        "where the engine card says how the engine enables one")
    p.add_argument("--prefix-hit-rate", type=_number(ge=0), default=None, help="share of every prompt found in the prefix cache")
    p.add_argument("--disaggregate", default=None, metavar="xPyD", help="PD disaggregation, e.g. 3P1D")
    p.add_argument("--slo", action="append", default=None, metavar="ttft=2s,tpot=50ms",
                   help="latency limits for goodput and searches; each names its unit (s, ms or us); repeatable, "
                        "each limit given once")
    p.add_argument("--rate-sweep", default=None, metavar="START:STOP:STEP",
                   help="Poisson rates to sweep (e.g. 1:16:1 or 2,4,8): the throughput-latency curve")
    p.add_argument("--max-rate-under-slo", action="store_true", help="find the highest Poisson rate meeting --slo")
    p.add_argument("--slo-percentile", type=_percentile, default=None, metavar="Q",
                   help="percentile of TTFT and TPOT that --max-rate-under-slo holds to its limits, any value in "
                        f"(0, 100) (default {DEFAULT_SLO_PERCENTILE:g}, as MLPerf); read by that search only")
    p.add_argument("--workers", type=_number(whole=True, gt=0), default=None, help="worker processes for searches (default: all CPUs)")
    p.add_argument("--executor", default=None, metavar="dask://HOST:PORT", help="run search points on a Dask cluster")
    p.add_argument("--requests-out", default=None, metavar="FILE", help="write per-request records (.jsonl or .csv)")
    p.add_argument("--include-requests", action="store_true", help="JSON: per-request records under 'requests'")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    from infersim.cli.main import add_emit_launch

    add_emit_launch(p, "the simulated deployment (both sides and the router of a PD-disaggregated one)")
    from infersim.cli.main import add_option_aliases
    from infersim.cli.main import add_run_flags
    from infersim.serve.bench_flags import add_flags

    add_flags(p, _number)
    add_run_flags(p, lengths=False)
    # the names vllm bench serve and sglang.bench_serving give the same options
    add_option_aliases(p, {"--request-rate": "--rate", "--max-concurrency": "--concurrency",
                           "--num-prompts": "--num-requests", "--random-input-len": "--isl",
                           "--random-output-len": "--osl"})
    p.set_defaults(handler=_serve)


def _percentile(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"{text!r}: a percentile is in (0, 100), e.g. 95 or 99.9")
    return value
