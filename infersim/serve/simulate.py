"""Request-level serving simulation: workload -> instances (replicas, or prefill and decode pools) -> records.

Data-parallel replicas sit behind a router: round-robin (request i to replica i mod R) or
least-loaded (each arrival goes to the replica holding the fewest requests at its arrival time;
replicas are advanced to that time first). In closed loop each client is pinned to one replica.

PD disaggregation (xPyD): x prefill instances run prompts only (their first token is the prefill's
output) and y decode instances run the rest, each pool with its own deployment. A finished prompt's
KV cache (input tokens x KV bytes per token of the whole model) moves to the decode instance
(round-robin) over NVLink when both instances fit in one node, else over the network, at the
hardware card's per-GPU bandwidth x efficiency x the GPUs of the smaller instance (each GPU sends
its shard in parallel); transfers into one decode instance queue on its link. The request's first
token reaches the client when its KV has arrived (TTFT includes the transfer); then it queues for
admission at the decode instance like any arrival. Queueing happens at both pools. Open-loop
workloads run the prefill pool to the end, then the decode pool; in closed loop, where a client's
next request waits for its previous one, the two pools are co-simulated step by step
(`_closed_loop_disaggregated`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from itertools import count
from typing import Any

from infersim.config import RunConfig, complete_layout, named_deployment_fields, with_engine_defaults, with_variant
from infersim.errors import InferSimError
from infersim.serve.cost import DEFAULT_WIDTH, StepCoster
from infersim.serve.scheduler import Instance, RequestState, SchedulerSettings, settings_from_engine
from infersim.serve.workload import (
    LengthDist,
    Request,
    check_rate,
    length_dist,
    lengths_from_trace,
    load_trace,
    offline_requests,
    poisson_requests,
)

MODES = ("offline", "poisson", "concurrency", "trace")
ROUTERS = ("round-robin", "least-loaded")


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
    num_requests: int = 1000
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


def parse_disaggregation(text: str) -> Disaggregation:
    """'3P1D' -> 3 prefill, 1 decode instance."""
    import re

    match = re.fullmatch(r"\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*", text)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise InferSimError(f"disaggregate: expected xPyD with x, y >= 1, e.g. 3P1D (got {text!r})")
    return Disaggregation(int(match.group(1)), int(match.group(2)))


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InferSimError(f"{name} must be a whole number >= 1 (got {value!r})")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InferSimError(f"{name} must be a positive number (got {value!r})")
    return float(value)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InferSimError(f"{name} must be a positive number of seconds (got {value!r})")
    return float(value)


def parse_options(options: dict[str, Any]) -> ServeOptions:
    """The options dict of the Python API (see infersim.serve.api.simulate_serving)."""
    known = {"mode", "num_requests", "rate", "concurrency", "isl", "osl", "seed", "replicas", "router", "burstiness",
             "trace", "trace_time_scale", "prefix_hit_rate", "prefix_cache", "slo", "disaggregate", "bucket_width",
             "max_running_requests", "max_num_tokens", "lengths_trace", "percentiles"}
    unknown = set(options) - known
    if unknown:
        raise InferSimError(f"serve options: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
    mode = options.get("mode", "poisson")
    if mode not in MODES:
        raise InferSimError(f"serve mode {mode!r} is not one of {', '.join(MODES)}")
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
    percentiles = options.get("percentiles") or ()
    if not isinstance(percentiles, (list, tuple)) or any(
            isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 100 for q in percentiles):
        raise InferSimError(f"percentiles: expected numbers in (0, 100) (got {percentiles!r})")
    if mode == "trace" and not options.get("trace"):
        raise InferSimError("serve mode trace needs a trace file")
    slo = options.get("slo")
    if slo is not None and not isinstance(slo, Slo):
        if not isinstance(slo, dict) or set(slo) - {"ttft_s", "tpot_s", "ttft_ms", "tpot_ms"}:
            raise InferSimError(f"slo: expected {{ttft_s|ttft_ms, tpot_s|tpot_ms}} (got {slo!r})")
        ttft = slo.get("ttft_s", slo["ttft_ms"] / 1e3 if "ttft_ms" in slo else None)
        tpot = slo.get("tpot_s", slo["tpot_ms"] / 1e3 if "tpot_ms" in slo else None)
        slo = Slo(_seconds(ttft, "slo ttft") if ttft is not None else None,
                  _seconds(tpot, "slo tpot") if tpot is not None else None)
    disagg = options.get("disaggregate")
    if isinstance(disagg, str):
        disagg = parse_disaggregation(disagg)
    elif isinstance(disagg, dict):
        disagg = Disaggregation(_positive_int(disagg.get("prefill"), "disaggregate.prefill"),
                                _positive_int(disagg.get("decode"), "disaggregate.decode"),
                                disagg.get("prefill_deployment"), disagg.get("decode_deployment"))
    hit = options.get("prefix_hit_rate", 0.0)
    if isinstance(hit, bool) or not isinstance(hit, (int, float)) or not 0 <= hit < 1:
        raise InferSimError(f"prefix_hit_rate must be in [0, 1) (got {hit!r})")
    router = options.get("router", "round-robin")
    if router not in ROUTERS:
        raise InferSimError(f"router {router!r} is not one of {', '.join(ROUTERS)}")
    width = options.get("bucket_width", DEFAULT_WIDTH)
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not 1.0 <= width <= 2.0:
        raise InferSimError(f"bucket_width must be a ratio in [1, 2] (1 = price every step shape exactly; got {width!r})")
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InferSimError(f"seed must be a whole number (got {seed!r})")
    return ServeOptions(
        mode=mode, num_requests=_positive_int(options.get("num_requests", 1000), "num_requests"), rate=rate,
        concurrency=concurrency,
        isl=length_dist(options["isl"], "isl") if options.get("isl") is not None else None,
        osl=length_dist(options["osl"], "osl") if options.get("osl") is not None else None,
        seed=seed, replicas=_positive_int(options.get("replicas", 1), "replicas"), router=router,
        burstiness=_number(options.get("burstiness", 1.0), "burstiness"), trace=options.get("trace"),
        trace_time_scale=_number(options.get("trace_time_scale", 1.0), "trace_time_scale"), prefix_hit_rate=float(hit),
        prefix_cache=options.get("prefix_cache"), slo=slo, disaggregate=disagg,
        bucket_width=float(width),
        max_running_requests=(_positive_int(options["max_running_requests"], "max_running_requests")
                              if options.get("max_running_requests") is not None else None),
        lengths_trace=options.get("lengths_trace"), percentiles=tuple(float(q) for q in percentiles),
        max_num_tokens=(_positive_int(options["max_num_tokens"], "max_num_tokens")
                        if options.get("max_num_tokens") is not None else None))


@dataclass
class Pool:
    name: str  # "colocated", "prefill" or "decode"
    config: RunConfig
    settings: SchedulerSettings
    instances: list[Instance]
    coster: StepCoster

    @property
    def gpus(self) -> int:
        return self.config.deployment.num_gpus * len(self.instances)


@dataclass
class ServeResult:
    options: ServeOptions
    requests: list[Request]
    records: list[RequestState]  # one per request, in request order (the request's final state)
    pools: list[Pool]
    transfer_integral_s: float = 0.0  # PD: seconds requests spent between the pools (in flight)
    mean_isl: float = 0.0
    mean_osl: float = 0.0

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)


def build_requests(config: RunConfig, opts: ServeOptions) -> list[Request]:
    isl = opts.isl or length_dist(config.workload.isl, "workload.isl")
    osl = opts.osl or length_dist(config.workload.osl, "workload.osl")
    if opts.mode == "trace":
        return load_trace(opts.trace, opts.num_requests, opts.trace_time_scale)
    if opts.mode == "poisson":
        requests = poisson_requests(isl, osl, opts.num_requests, opts.rate, opts.seed, opts.burstiness)
    else:
        requests = offline_requests(isl, osl, opts.num_requests, opts.seed)  # offline; concurrency times set later
    if opts.lengths_trace:
        requests = lengths_from_trace(requests, opts.lengths_trace, opts.seed)
    return requests


def _pool_config(config: RunConfig, deployment: dict[str, Any] | None, where: str) -> RunConfig:
    if not deployment:
        return config
    from infersim.cards.schema import build
    from infersim.config import Deployment

    dep = with_engine_defaults(build(Deployment, deployment, where), named_deployment_fields(deployment), config.model,
                               config.engine)
    dep = complete_layout(dep, config.model, config.hardware, where)
    return with_variant(config, config.model, config.hardware, dep, config.workload)


def _pool(name: str, config: RunConfig, count: int, opts: ServeOptions, mean_isl: float, mean_osl: float,
          prefill_only: bool = False) -> Pool:
    settings = settings_from_engine(config, mean_isl, mean_osl, opts.mode == "offline", opts.prefix_cache,
                                    prefill_only)
    if opts.max_running_requests:
        settings = replace(settings, max_running=opts.max_running_requests,
                           origin=settings.origin + f"; running cap {opts.max_running_requests} given")
    if opts.max_num_tokens:
        settings = replace(settings, token_budget=opts.max_num_tokens,
                           origin=settings.origin + f"; token budget {opts.max_num_tokens} given")
    coster = StepCoster(config, opts.bucket_width)
    instances = [Instance(settings, coster, i, prefill_only) for i in range(count)]
    for inst in instances:
        inst.prefix_hit_rate = opts.prefix_hit_rate if settings.prefix_cache else 0.0
    return Pool(name, config, settings, instances, coster)


def simulate_serving_run(config: RunConfig, opts: ServeOptions) -> ServeResult:
    if config.speculative is not None:
        raise InferSimError("serve: speculative decoding is not modelled by the serving simulator yet; "
                            "remove the config's speculative section")
    requests = build_requests(config, opts)
    mean_isl = sum(r.input_tokens for r in requests) / len(requests)
    mean_osl = sum(r.output_tokens for r in requests) / len(requests)
    if opts.disaggregate is not None:
        if opts.mode == "poisson" and opts.concurrency:
            raise InferSimError("serve: a request rate with a concurrency cap is not modelled with PD disaggregation; "
                                "give one of them")
        return _run_disaggregated(config, opts, requests, mean_isl, mean_osl)
    pool = _pool("colocated", config, opts.replicas, opts, mean_isl, mean_osl)
    states = [RequestState(r) for r in requests]
    instances = pool.instances
    if opts.mode == "concurrency" or opts.concurrency:
        _run_closed_loop(instances, states, opts.concurrency, keep_arrivals=opts.mode == "poisson")
    elif opts.router == "least-loaded" and len(instances) > 1:
        for st in states:
            for inst in instances:
                inst.run(until=st.req.arrival_s)
            min(instances, key=lambda i: (i.load, i.index)).add(st)
        for inst in instances:
            inst.run()
    else:
        for i, st in enumerate(states):
            instances[i % len(instances)].add(st)
        for inst in instances:
            inst.run()
    return ServeResult(opts, requests, states, [pool], 0.0, mean_isl, mean_osl)


def _run_closed_loop(instances: list[Instance], states: list[RequestState], concurrency: int,
                     keep_arrivals: bool = False) -> None:
    """`concurrency` clients, client c pinned to replica c mod R; each sends its next request when
    the previous completes. Requests are handed out in order, so the run is deterministic.
    keep_arrivals: the requests keep their (Poisson) arrival times and at most `concurrency` are in
    flight, as a benchmark client with --request-rate and --max-concurrency sends them: a request
    whose slot is taken waits at the client and is sent (its TTFT starts) when one frees."""
    queue = iter(states)
    clients = min(concurrency, len(states))
    replace_arrival = _ArrivalSetter()
    for c in range(clients):
        st = next(queue)
        replace_arrival(st, st.req.arrival_s if keep_arrivals else 0.0)
        instances[c % len(instances)].add(st)

    def make_callback(inst: Instance):
        def on_finish(done: RequestState) -> None:
            nxt = next(queue, None)
            if nxt is not None:
                replace_arrival(nxt, max(nxt.req.arrival_s, done.finish_s) if keep_arrivals else done.finish_s)
                inst.add(nxt)
        return on_finish

    for inst in instances:
        inst.run(on_finish=make_callback(inst))


class _ArrivalSetter:
    """Closed loop: a request's arrival time is when its client's previous request finished."""

    def __call__(self, st: RequestState, t: float) -> None:
        st.req = replace(st.req, arrival_s=t)
        st.ready_s = t


def transfer_bandwidth(prefill: RunConfig, decode: RunConfig) -> tuple[float, str]:
    """Bytes/s one request's KV moves at from a prefill to a decode instance, and over what."""
    hw = prefill.hardware
    gp, gd = prefill.deployment.num_gpus, decode.deployment.num_gpus
    lanes = min(gp, gd)
    if gp + gd <= hw.peak.gpus_per_node:
        return hw.peak.nvlink_bandwidth * hw.derates.nvlink_efficiency * lanes, "NVLink"
    return hw.peak.network_bandwidth * hw.derates.network_efficiency * lanes, "network"


def _run_disaggregated(config: RunConfig, opts: ServeOptions, requests: list[Request], mean_isl: float,
                       mean_osl: float) -> ServeResult:
    from infersim.memory import kv_bytes_per_token

    d = opts.disaggregate
    pconf = _pool_config(config, d.prefill_deployment, "disaggregate.prefill_deployment")
    dconf = _pool_config(config, d.decode_deployment, "disaggregate.decode_deployment")
    prefill = _pool("prefill", pconf, d.prefill_instances, opts, mean_isl, 1.0, prefill_only=True)
    decode = _pool("decode", dconf, d.decode_instances, opts, mean_isl, mean_osl)
    states = [RequestState(r) for r in requests]
    if opts.mode == "concurrency":
        finals, transfer_integral = _closed_loop_disaggregated(prefill, decode, states, opts.concurrency)
        return ServeResult(opts, requests, finals, [prefill, decode], transfer_integral, mean_isl, mean_osl)
    for i, st in enumerate(states):
        prefill.instances[i % len(prefill.instances)].add(st)
    for inst in prefill.instances:
        inst.run()
    bandwidth, _link = transfer_bandwidth(pconf, dconf)
    kv_per_token = kv_bytes_per_token(config.model, dconf.deployment.precision.kv_cache)
    link_free = [0.0] * len(decode.instances)
    finals: list[RequestState] = list(states)
    handoffs = []
    transfer_integral = 0.0
    order = sorted(range(len(states)), key=lambda i: (states[i].finish_s, i))
    for n, i in enumerate(order):
        st = states[i]
        if st.req.output_tokens <= 1:
            continue
        target = n % len(decode.instances)
        arrive = _transfer(st, target, link_free, kv_per_token / bandwidth)
        transfer_integral += arrive - st.finish_s
        handoffs.append((arrive, target, i, _decode_state(st, arrive), st))
    handoffs.sort(key=lambda h: (h[0], h[2]))
    for _arrive, target, _i, ds, _st in handoffs:
        decode.instances[target].add(ds)
    for inst in decode.instances:
        inst.run()
    for _arrive, _target, i, ds, _st in handoffs:
        finals[i] = ds
    return ServeResult(opts, requests, finals, [prefill, decode], transfer_integral, mean_isl, mean_osl)


def _transfer(st: RequestState, target: int, link_free: list[float], seconds_per_token: float) -> float:
    """When a prefilled request's KV reaches decode instance `target`: its link carries one request
    at a time, starting when the prefill finishes and the link is free."""
    start = max(st.finish_s, link_free[target])
    link_free[target] = start + st.req.input_tokens * seconds_per_token
    return link_free[target]


def _decode_state(st: RequestState, arrive: float) -> RequestState:
    """The request as it enters the decode pool; its record keeps the prefill side's timings (its
    first token is out once its KV has arrived)."""
    ds = RequestState(st.req, ready_s=arrive, prefilled=True)
    ds.scheduled_s = st.scheduled_s
    ds.first_token_s = arrive
    ds.preemptions = st.preemptions
    ds.cached = st.cached
    return ds


def _closed_loop_disaggregated(prefill: Pool, decode: Pool, states: list[RequestState],
                               concurrency: int) -> tuple[list[RequestState], float]:
    """`concurrency` clients against a PD pair: client c's requests enter prefill instance c mod P;
    a prefilled request's KV moves to decode instance n mod D (n: handoff order); a client sends its
    next request when its previous one finishes (decode, or prefill for one-token outputs).

    The pools are co-simulated: the instance whose next step starts first runs, up to the next start
    of any other instance or the next undelivered event (a handoff or a new request), and events are
    delivered in time order. An event can only reach an instance during a step that started before
    it, where engines see it at the next step, so the interleaving is exact."""
    from infersim.memory import kv_bytes_per_token

    bandwidth, _link = transfer_bandwidth(prefill.config, decode.config)
    seconds_per_token = kv_bytes_per_token(prefill.config.model, decode.config.deployment.precision.kv_cache) / bandwidth
    finals: list[RequestState] = list(states)
    index = {id(st): i for i, st in enumerate(states)}
    client_of: dict[int, int] = {}
    queue = iter(states)
    events: list[tuple[float, int, int, RequestState]] = []  # (time, order, instance (-1 - i: prefill i), state)
    order = count()
    link_free = [0.0] * len(decode.instances)
    handoffs = count()
    transfer_integral = 0.0
    set_arrival = _ArrivalSetter()

    def send(client: int, t: float) -> None:
        st = next(queue, None)
        if st is None:
            return
        set_arrival(st, t)
        client_of[id(st)] = client
        heapq.heappush(events, (t, next(order), -1 - client % len(prefill.instances), st))

    def prefilled(st: RequestState) -> None:
        nonlocal transfer_integral
        if st.req.output_tokens <= 1:
            send(client_of[id(st)], st.finish_s)
            return
        target = next(handoffs) % len(decode.instances)
        arrive = _transfer(st, target, link_free, seconds_per_token)
        transfer_integral += arrive - st.finish_s
        ds = _decode_state(st, arrive)
        finals[index[id(st)]] = ds
        client_of[id(ds)] = client_of[id(st)]
        heapq.heappush(events, (arrive, next(order), target, ds))

    def decoded(ds: RequestState) -> None:
        send(client_of[id(ds)], ds.finish_s)

    for client in range(min(concurrency, len(states))):
        send(client, 0.0)
    instances = [(inst, prefilled) for inst in prefill.instances] + [(inst, decoded) for inst in decode.instances]

    def next_start(inst: Instance) -> float:
        if not inst.idle():
            return inst.now
        return max(inst.now, inst.pending[0].ready_s) if inst.pending else math.inf

    while True:
        starts = [next_start(inst) for inst, _cb in instances]
        first = min(range(len(instances)), key=lambda j: (starts[j], j))
        event_t = events[0][0] if events else math.inf
        if event_t == math.inf and starts[first] == math.inf:
            break
        if event_t <= starts[first]:
            _t, _o, where, st = heapq.heappop(events)
            (prefill.instances[-1 - where] if where < 0 else decode.instances[where]).add(st)
            continue
        others = min((starts[j] for j in range(len(instances)) if j != first), default=math.inf)
        inst, callback = instances[first]
        inst.run(until=max(min(others, event_t), starts[first] + 1e-12), on_finish=callback)
    return finals, transfer_integral
