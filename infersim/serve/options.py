"""What a serving run is asked to do (`ServeOptions`), parsed and checked from the options mapping the
command line, the API and the validation cases build: the load (offline, Poisson rate, concurrency or
a trace), request lengths and count, replicas and router, PD disaggregation (xPyD), the prefix-cache
hit rate and the SLO. A bad value is one line naming it (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infersim.base.errors import InferSimError, echo
from infersim.serve.cost import DEFAULT_WIDTH
from infersim.serve.workload_spec import WorkloadSpec, parse_workload
from infersim.serve.workload import (
    DEFAULT_REQUESTS,
    LengthDist,
    check_burstiness,
    check_rate,
    length_dist,
    request_count,
)

MODES = ("offline", "poisson", "concurrency", "trace", "workload")
ROUTERS = ("round-robin", "least-loaded", "cache-aware")
#: requests an open-loop instance's queue holds before further arrivals are left waiting (the
#: overload guard: a queue that reaches it grows without bound; see infersim.serve.overload)
DEFAULT_MAX_WAITING = 10_000
#: most engine instances one pool (replicas, prefill or decode) may have: every instance is stepped
#: on its own and a least-loaded router visits each of them per request; a fleet larger than this
#: has the per-GPU numbers of a slice of it (model a slice, with the rate scaled)
MAX_INSTANCES = 1000


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True)
class Disaggregation:
    prefill_instances: int
    decode_instances: int
    prefill_deployment: dict[str, Any] | None = None  # deployment fields replacing the config's for the prefill pool
    decode_deployment: dict[str, Any] | None = None


@dataclass(frozen=True)
class ServeOptions:
    mode: str = "poisson"
    num_requests: int | None = DEFAULT_REQUESTS  # None: a trace's every row (other modes: DEFAULT_REQUESTS)
    rate: float | None = None
    concurrency: int | None = None
    isl: LengthDist | None = None  # None: the config's workload.isl
    osl: LengthDist | None = None
    seed: int = 0
    replicas: int = 1
    router: str = "round-robin"
    burstiness: float = 1.0
    trace: str | None = None
    trace_time_scale: float = 1.0
    prefix_hit_rate: float = 0.0
    prefix_cache: bool | None = None  # None: the engine card's default
    slo: Slo | None = None
    disaggregate: Disaggregation | None = None
    bucket_width: float = DEFAULT_WIDTH
    max_running_requests: int | None = None  # overrides the engine card's / trtllm-bench's running cap per instance
    max_num_tokens: int | None = None  # overrides the per-step token budget per instance
    lengths_trace: str | None = None  # draw (input, output) lengths from this trace's rows
    percentiles: tuple[float, ...] = ()  # TTFT and TPOT percentiles the summary adds to p50/p90/p99
    workload: WorkloadSpec | None = None  # staged workload (mode workload; infersim.serve.workload_spec)
    max_waiting: int = DEFAULT_MAX_WAITING  # open loop: queue bound per instance (0: none)
    max_model_len: int | None = None  # longer requests (prompt + output) are rejected on arrival, or cut to fit
    host_kv_bytes: float = 0.0  # host (CPU) tier of the prefix cache per instance, bytes
    host_kv_tokens: int = 0  # ... or its capacity in tokens (a measured pool)
    kv_capacity_tokens: int | None = None  # overrides the KV pool per instance (a measured pool), tokens


def _instances(value: Any, name: str) -> int:
    count = _positive_int(value, name)
    if count > MAX_INSTANCES:
        raise InferSimError(f"{name} {count:,}: at most {MAX_INSTANCES:,} engine instances per pool are simulated "
                            "(each is stepped on its own, and a least-loaded router visits every one per request); "
                            "a larger fleet has the per-GPU numbers of a slice of it: simulate a slice with the rate "
                            "scaled to it")
    return count


def parse_disaggregation(text: str) -> Disaggregation:
    """'3P1D' -> 3 prefill, 1 decode instance."""
    import re

    match = re.fullmatch(r"\s*(\d{1,18})\s*[pP]\s*(\d{1,18})\s*[dD]\s*", text) if isinstance(text, str) else None
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise InferSimError(f"disaggregate: expected xPyD with x, y >= 1, e.g. 3P1D (got {echo(text)})")
    return Disaggregation(_instances(int(match.group(1)), "disaggregate prefill instances"),
                          _instances(int(match.group(2)), "disaggregate decode instances"))


def _positive_int(value: Any, name: str) -> int:
    from infersim.cards.schema import check_number
    from infersim.base.errors import ConfigError

    if isinstance(value, bool) or value is None:
        raise InferSimError(f"{name} must be a whole number >= 1 (got {value!r})")
    try:
        return int(check_number(value, "serve", name, whole=True, gt=0))
    except ConfigError as exc:
        raise InferSimError(f"{name} must be a whole number >= 1 (value: {echo(value)}: {exc.problem})") from None


def _number(value: Any, name: str, **bounds: Any) -> float:
    from infersim.cards.schema import check_number
    from infersim.base.errors import ConfigError

    if isinstance(value, bool) or value is None:
        raise InferSimError(f"{name} must be a positive number (got {value!r})")
    try:
        return float(check_number(value, "serve", name, **(bounds or {"gt": 0})))
    except ConfigError as exc:
        raise InferSimError(f"{name} (value: {echo(value)}): {exc.problem}") from None


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InferSimError(f"{name} must be a positive number of seconds (got {echo(value)})")
    return _number(value, name)


KNOWN_OPTIONS = {"mode", "num_requests", "rate", "concurrency", "isl", "osl", "seed", "replicas", "router",
                 "burstiness", "trace", "trace_time_scale", "prefix_hit_rate", "prefix_cache", "slo", "disaggregate",
                 "bucket_width", "max_running_requests", "max_num_tokens", "lengths_trace", "percentiles",
                 "workload", "max_waiting", "max_model_len", "host_kv_bytes", "host_kv_tokens", "kv_capacity_tokens"}


def _load(options: dict[str, Any], mode: str) -> tuple[float | None, int | None]:
    """The rate and concurrency the mode takes."""
    rate = options.get("rate")
    if mode == "poisson":
        if rate is None:
            raise InferSimError("serve mode poisson needs a rate (requests per second)")
        rate = check_rate(rate)
    concurrency = options.get("concurrency")
    if mode == "concurrency":
        if concurrency is None:
            raise InferSimError("serve mode concurrency needs a concurrency (clients in closed loop)")
        concurrency = _positive_int(concurrency, "concurrency")
    elif mode == "poisson" and concurrency is not None:
        # vllm bench serve / sglang.bench_serving --request-rate R --max-concurrency N: Poisson
        # arrivals, at most N requests in flight (a request waits at the client for a free slot)
        concurrency = _positive_int(concurrency, "concurrency")
    else:
        concurrency = None
    return rate, concurrency


def _slo(slo: Any) -> Slo | None:
    if slo is None or isinstance(slo, Slo):
        return slo
    if not isinstance(slo, dict) or set(slo) - {"ttft_s", "tpot_s", "ttft_ms", "tpot_ms"}:
        raise InferSimError(f"slo: expected {{ttft_s|ttft_ms, tpot_s|tpot_ms}} (got {echo(slo)})")
    ttft = slo.get("ttft_s", _number(slo["ttft_ms"], "slo ttft_ms") / 1e3 if "ttft_ms" in slo else None)
    tpot = slo.get("tpot_s", _number(slo["tpot_ms"], "slo tpot_ms") / 1e3 if "tpot_ms" in slo else None)
    return Slo(_seconds(ttft, "slo ttft") if ttft is not None else None,
               _seconds(tpot, "slo tpot") if tpot is not None else None)


def _disaggregation(disagg: Any) -> Disaggregation | None:
    if isinstance(disagg, dict):
        unknown_keys = set(disagg) - {"prefill", "decode", "prefill_deployment", "decode_deployment"}
        if unknown_keys:
            raise InferSimError(f"disaggregate: unknown key(s) {sorted(map(str, unknown_keys))}; expected prefill, "
                                "decode, prefill_deployment, decode_deployment")
        return Disaggregation(_instances(disagg.get("prefill"), "disaggregate.prefill"),
                              _instances(disagg.get("decode"), "disaggregate.decode"),
                              disagg.get("prefill_deployment"), disagg.get("decode_deployment"))
    if disagg is not None and not isinstance(disagg, Disaggregation):
        return parse_disaggregation(disagg)
    return disagg


def _checked_misc(options: dict[str, Any]) -> dict[str, Any]:
    """The options that are one value each, checked."""
    percentiles = options.get("percentiles") or ()
    if not isinstance(percentiles, (list, tuple)) or any(
            isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 100 for q in percentiles):
        raise InferSimError(f"percentiles: expected numbers in (0, 100) (got {percentiles!r})")
    hit = options.get("prefix_hit_rate", 0.0)
    if isinstance(hit, bool) or not isinstance(hit, (int, float)) or not 0 <= hit < 1:
        raise InferSimError(f"prefix_hit_rate must be in [0, 1) (got {echo(hit)})")
    router = options.get("router", "round-robin")
    if router not in ROUTERS:
        raise InferSimError(f"router {echo(router)} is not one of {', '.join(ROUTERS)}")
    width = options.get("bucket_width", DEFAULT_WIDTH)
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not 1.0 <= width <= 2.0:
        raise InferSimError(f"bucket_width must be a ratio in [1, 2] (1 = price every step shape exactly; got {echo(width)})")
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InferSimError(f"seed must be a whole number (got {echo(seed)})")
    prefix_cache = options.get("prefix_cache")
    if prefix_cache is not None and not isinstance(prefix_cache, bool):
        raise InferSimError(f"prefix_cache must be true or false (got {echo(prefix_cache)})")
    waiting = options.get("max_waiting", DEFAULT_MAX_WAITING)
    return {"percentiles": tuple(float(q) for q in percentiles), "prefix_hit_rate": _number(hit, "prefix_hit_rate", ge=0),
            "router": router, "bucket_width": float(width), "seed": seed, "prefix_cache": prefix_cache,
            "max_waiting": int(_number(waiting, "max_waiting", whole=True, ge=0)),
            "host_kv_bytes": _number(options.get("host_kv_bytes", 0.0), "host_kv_bytes", ge=0),
            "host_kv_tokens": int(_number(options.get("host_kv_tokens", 0), "host_kv_tokens", whole=True, ge=0))}


def _context_length(options: dict[str, Any]) -> int | None:
    """max_model_len: at least 2 tokens, a one-token prompt and its one output token (as --max-model-len)."""
    length = _optional_int(options, "max_model_len")
    if length is not None and length < 2:
        raise InferSimError(f"max_model_len must be a whole number >= 2: a request holds a prompt token and an "
                            f"output token (got {length})")
    return length


def _optional_int(options: dict[str, Any], name: str) -> int | None:
    return _positive_int(options[name], name) if options.get(name) is not None else None


def parse_options(options: dict[str, Any]) -> ServeOptions:
    """The options dict of the Python API (see infersim.serve.api.simulate_serving)."""
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise InferSimError(f"serve options: unknown key(s) {sorted(map(str, unknown))}; known: "
                            f"{', '.join(sorted(KNOWN_OPTIONS))}")
    workload = parse_workload(options["workload"]) if options.get("workload") is not None else None
    mode = options.get("mode", "workload" if workload is not None else "poisson")
    if mode not in MODES:
        raise InferSimError(f"serve mode {echo(mode)} is not one of {', '.join(MODES)}")
    if (mode == "workload") != (workload is not None):
        raise InferSimError("serve: a workload (options.workload) is its own load; give it without mode, rate, "
                            "concurrency or trace" if workload is not None else "serve mode workload needs a workload")
    rate, concurrency = _load(options, mode)
    if options.get("router") == "cache-aware" and workload is None:
        raise InferSimError(f"router cache-aware sends a request where most of its prompt's tokens are cached: a "
                            f"staged workload's prompts (workload, --workload or the dataset flags) name their tokens, "
                            f"a {mode} load's do not; give round-robin or least-loaded")
    if mode == "trace" and not options.get("trace"):
        raise InferSimError("serve mode trace needs a trace file")
    disagg = _disaggregation(options.get("disaggregate"))
    replicas = _instances(options.get("replicas", 1), "replicas")
    if disagg is not None and replicas != 1:
        raise InferSimError(f"replicas {replicas} with disaggregate: a PD run's instances are its prefill and decode "
                            f"pools ({disagg.prefill_instances}P{disagg.decode_instances}D); give the counts there")
    num = options.get("num_requests", None if mode in ("trace", "workload") else DEFAULT_REQUESTS)
    return ServeOptions(
        mode=mode, num_requests=request_count(num) if num is not None else None, rate=rate,
        concurrency=concurrency,
        isl=length_dist(options["isl"], "isl") if options.get("isl") is not None else None,
        osl=length_dist(options["osl"], "osl") if options.get("osl") is not None else None,
        replicas=replicas, burstiness=check_burstiness(options.get("burstiness", 1.0)), trace=options.get("trace"),
        trace_time_scale=_number(options.get("trace_time_scale", 1.0), "trace_time_scale"),
        slo=_slo(options.get("slo")), disaggregate=disagg,
        max_running_requests=_optional_int(options, "max_running_requests"),
        lengths_trace=options.get("lengths_trace"), max_num_tokens=_optional_int(options, "max_num_tokens"),
        workload=workload, max_model_len=_context_length(options),
        kv_capacity_tokens=_optional_int(options, "kv_capacity_tokens"), **_checked_misc(options))
