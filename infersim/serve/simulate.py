"""Request-level serving simulation: workload -> instances (replicas, or prefill and decode pools) -> records.

Data-parallel replicas sit behind a router: round-robin (request i to replica i mod R) or
least-loaded (each arrival goes to the replica holding the fewest requests at its arrival time;
replicas are advanced to that time first). In closed loop each client is pinned to one replica.

PD disaggregation (xPyD): x prefill instances run prompts only (their first token is the prefill's
output) and y decode instances run the rest, each pool with its own deployment. A finished prompt's
KV cache (input tokens x KV bytes per token of the whole model) moves to the decode instance
(round-robin) over the node's link (NVLink, or PCIe on cards without it) when both instances fit in
one node, else over the network, at the hardware card's per-GPU bandwidth x efficiency x the GPUs
of the smaller instance (each GPU sends its shard in parallel); transfers into one decode instance queue on its link. The request's first
token reaches the client when its KV has arrived (TTFT includes the transfer); then it queues for
admission at the decode instance like any arrival. Queueing happens at both pools. Open-loop
workloads run the prefill pool to the end, then the decode pool; in closed loop, where a client's
next request waits for its previous one, the two pools are co-simulated step by step
(`_closed_loop_disaggregated`).

Memory: requests enter the instances as the simulation reaches them (an instance is given its next
arrival before each iteration, which is all its scheduling looks ahead to), finished requests leave
their latencies in typed arrays (`Outcomes`, 32 bytes a request) and are dropped unless per-request
records are asked for, and only instances that can ever hold a request are built (at most one per
request). An open-loop PD run keeps each prefilled request until the decode pool runs.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any

from infersim.run.config import RunConfig, with_variant
from infersim.cards.deployment import (
    complete_layout,
    named_deployment_fields,
    with_checkpoint_precision,
    with_engine_defaults,
)
from infersim.base.errors import InferSimError
from infersim.modules.comm import p2p_bandwidth
from infersim.serve.cost import StepCoster
from infersim.serve.scheduler import Instance, RequestState, SchedulerSettings, settings_from_engine
from infersim.serve.arrivals import Arrivals, build_requests, listed_arrivals
from infersim.serve.options import ServeOptions


@dataclass
class Pool:
    name: str  # "colocated", "prefill" or "decode"
    config: RunConfig
    settings: SchedulerSettings
    instances: list[Instance]  # the instances built: the first min(count, requests) of the pool
    coster: StepCoster
    count: int = 0  # instances of the pool (0: as many as built)

    def __post_init__(self) -> None:
        self.count = self.count or len(self.instances)

    @property
    def gpus(self) -> int:
        return self.config.deployment.num_gpus * self.count


class Outcomes:
    """What the summary needs of every finished request: its latencies in typed arrays (32 bytes a
    request; TPOT nan for one-token outputs), token totals and the time window; and, when asked, the
    requests' final states (records)."""

    def __init__(self, keep_records: bool = False) -> None:
        self.ttft = array("d")
        self.tpot = array("d")
        self.e2e = array("d")
        self.queue = array("d")
        self.input_tokens = 0
        self.output_tokens = 0
        self.first_arrival = math.inf
        self.last_finish = 0.0
        self.gap_sum = 0.0  # seconds between first and last token, over requests of 2+ output tokens
        self.gap_count = 0  # their output tokens after the first
        self.records: list[RequestState] | None = [] if keep_records else None

    def __len__(self) -> int:
        return len(self.ttft)

    def add(self, r: RequestState) -> None:
        arrival = r.req.arrival_s
        ttft = r.first_token_s - arrival
        e2e = r.finish_s - arrival
        out = r.req.output_tokens
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        self.queue.append(max(0.0, r.scheduled_s - arrival))
        if out > 1:
            self.tpot.append((e2e - ttft) / (out - 1))
            self.gap_sum += e2e - ttft
            self.gap_count += out - 1
        else:
            self.tpot.append(math.nan)
        self.input_tokens += r.req.input_tokens
        self.output_tokens += out
        self.first_arrival = min(self.first_arrival, arrival)
        self.last_finish = max(self.last_finish, r.finish_s)
        if self.records is not None:
            self.records.append(r)


@dataclass
class ServeResult:
    options: ServeOptions
    outcomes: Outcomes
    pools: list[Pool]
    transfer_integral_s: float = 0.0  # PD: seconds requests spent between the pools (in flight)
    mean_isl: float = 0.0
    mean_osl: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the run did that was not asked (a trace cut, ...)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def records(self) -> list[RequestState]:
        """One per request, in request order (the request's final state); empty unless kept."""
        return sorted(self.outcomes.records or (), key=lambda r: r.req.id)


def _pool_config(config: RunConfig, deployment: dict[str, Any] | None, where: str) -> RunConfig:
    if not deployment:
        return config
    from infersim.cards.schema import build
    from infersim.cards.deployment import Deployment

    named = named_deployment_fields(deployment)
    dep = with_engine_defaults(build(Deployment, deployment, where), named, config.model, config.engine)
    dep = with_checkpoint_precision(dep, named, config.model, config.hardware)
    dep = complete_layout(dep, config.model, config.hardware, where)
    return with_variant(config, config.model, config.hardware, dep, config.workload)


def _pool(name: str, config: RunConfig, count: int, opts: ServeOptions, mean_isl: float, mean_osl: float,
          requests: int, prefill_only: bool = False) -> Pool:
    """A pool of `count` instances, of which the first min(count, requests) are built: a request
    occupies one instance at a time, so no router ever reaches an instance past the requests'
    number (round-robin by construction; least-loaded always finds an empty one among them)."""
    settings = settings_from_engine(config, mean_isl, mean_osl, opts.mode == "offline", opts.prefix_cache,
                                    prefill_only)
    if opts.max_running_requests:
        settings = replace(settings, max_running=opts.max_running_requests,
                           origin=settings.origin + f"; running cap {opts.max_running_requests} given")
    if opts.max_num_tokens:
        settings = replace(settings, token_budget=opts.max_num_tokens,
                           origin=settings.origin + f"; token budget {opts.max_num_tokens} given")
    coster = StepCoster(config, opts.bucket_width)
    instances = [Instance(settings, coster, i, prefill_only) for i in range(min(count, max(1, requests)))]
    for inst in instances:
        inst.prefix_hit_rate = opts.prefix_hit_rate if settings.prefix_cache else 0.0
    return Pool(name, config, settings, instances, coster, count)


def simulate_serving_run(config: RunConfig, opts: ServeOptions, keep_records: bool = True) -> ServeResult:
    if config.speculative is not None:
        raise InferSimError("serve: speculative decoding is not modelled by the serving simulator yet; "
                            "remove the config's speculative section")
    arrivals = build_requests(config, opts)
    if not isinstance(arrivals, Arrivals):
        arrivals = listed_arrivals(arrivals)
    outcomes = Outcomes(keep_records)
    mean_isl, mean_osl = arrivals.mean_isl, arrivals.mean_osl
    states = (RequestState(r) for r in arrivals.requests())
    if opts.disaggregate is not None:
        if opts.mode == "poisson" and opts.concurrency:
            raise InferSimError("serve: a request rate with a concurrency cap is not modelled with PD disaggregation; "
                                "give one of them")
        return _run_disaggregated(config, opts, arrivals, states, outcomes)
    pool = _pool("colocated", config, opts.replicas, opts, mean_isl, mean_osl, arrivals.count)
    instances = pool.instances
    for inst in instances:
        inst.sink = outcomes.add
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
        _feed(instances, ((i % len(instances), st) for i, st in enumerate(states)))
    return ServeResult(opts, outcomes, [pool], 0.0, mean_isl, mean_osl, list(arrivals.notes))


def serving_pools(config: RunConfig, opts: ServeOptions) -> list[Pool]:
    """The pools a serving run with these options builds (their deployments and scheduler settings:
    what a launch command realises), without running it."""
    arrivals = build_requests(config, opts)
    if not isinstance(arrivals, Arrivals):
        arrivals = listed_arrivals(arrivals)
    mean_isl, mean_osl = arrivals.mean_isl, arrivals.mean_osl
    d = opts.disaggregate
    if d is None:
        return [_pool("colocated", config, opts.replicas, opts, mean_isl, mean_osl, 1)]
    pconf = _pool_config(config, d.prefill_deployment, "disaggregate.prefill_deployment")
    dconf = _pool_config(config, d.decode_deployment, "disaggregate.decode_deployment")
    return [_pool("prefill", pconf, d.prefill_instances, opts, mean_isl, 1.0, 1, prefill_only=True),
            _pool("decode", dconf, d.decode_instances, opts, mean_isl, mean_osl, 1)]


def _feed(instances: list[Instance], routed: Iterable[tuple[int, RequestState]]) -> None:
    """Give each instance its requests (in arrival order) one at a time, advancing it as far as its
    next known arrival allows, then run every instance to the end: the same steps as giving every
    request up front, with only the next arrival held."""
    for target, st in routed:
        inst = instances[target]
        inst.add(st)
        inst.run(wait_for_arrivals=True)
    for inst in instances:
        inst.run()


def _run_closed_loop(instances: list[Instance], states: Iterator[RequestState], concurrency: int,
                     keep_arrivals: bool = False) -> None:
    """`concurrency` clients, client c pinned to replica c mod R; each sends its next request when
    the previous completes. Requests are handed out in order, so the run is deterministic.
    keep_arrivals: the requests keep their (Poisson) arrival times and at most `concurrency` are in
    flight, as a benchmark client with --request-rate and --max-concurrency sends them: a request
    whose slot is taken waits at the client and is sent (its TTFT starts) when one frees."""
    queue = iter(states)
    replace_arrival = _ArrivalSetter()
    for c in range(concurrency):
        st = next(queue, None)
        if st is None:
            break
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
    """Bytes/s one request's KV moves at from a prefill to a decode instance, and over what: pairs
    of their GPUs in parallel, over the node's link between them (NVLink, a mesh's one link per
    pair, or PCIe) when both fit one node, else over the NICs."""
    hw = prefill.hardware
    gp, gd = prefill.deployment.num_gpus, decode.deployment.num_gpus
    lanes = min(gp, gd)
    if gp + gd <= hw.peak.gpus_per_node:
        per_lane, link = p2p_bandwidth(hw, gp + gd)
        return per_lane * lanes, link
    return hw.peak.network_bandwidth * hw.derates.network_efficiency * lanes, "network"


def _run_disaggregated(config: RunConfig, opts: ServeOptions, arrivals: Arrivals, states: Iterator[RequestState],
                       outcomes: Outcomes) -> ServeResult:
    from infersim.run.memory import kv_bytes_per_token

    d = opts.disaggregate
    mean_isl, mean_osl = arrivals.mean_isl, arrivals.mean_osl
    pconf = _pool_config(config, d.prefill_deployment, "disaggregate.prefill_deployment")
    dconf = _pool_config(config, d.decode_deployment, "disaggregate.decode_deployment")
    prefill = _pool("prefill", pconf, d.prefill_instances, opts, mean_isl, 1.0, arrivals.count, prefill_only=True)
    decode = _pool("decode", dconf, d.decode_instances, opts, mean_isl, mean_osl, arrivals.count)
    for inst in decode.instances:
        inst.sink = outcomes.add
    notes = list(arrivals.notes)
    if opts.mode == "concurrency":
        transfer_integral = _closed_loop_disaggregated(prefill, decode, states, opts.concurrency, outcomes)
        return ServeResult(opts, outcomes, [prefill, decode], transfer_integral, mean_isl, mean_osl, notes)
    prefilled: list[RequestState] = []  # requests going on to decode, until the decode pool runs

    def prefill_done(st: RequestState) -> None:
        (outcomes.add if st.req.output_tokens <= 1 else prefilled.append)(st)

    for inst in prefill.instances:
        inst.sink = prefill_done
    _feed(prefill.instances, ((i % len(prefill.instances), st) for i, st in enumerate(states)))
    bandwidth, _link = transfer_bandwidth(pconf, dconf)
    kv_per_token = kv_bytes_per_token(config.model, dconf.deployment.precision.kv_cache)
    link_free = [0.0] * len(decode.instances)
    handoffs = []
    transfer_integral = 0.0
    prefilled.sort(key=lambda st: (st.finish_s, st.req.id))
    for n, st in enumerate(prefilled):
        target = n % len(decode.instances)
        arrive = _transfer(st, target, link_free, kv_per_token / bandwidth)
        transfer_integral += arrive - st.finish_s
        handoffs.append((arrive, st.req.id, target, _decode_state(st, arrive)))
    del prefilled
    handoffs.sort(key=lambda h: (h[0], h[1]))
    _feed(decode.instances, ((target, ds) for _arrive, _id, target, ds in handoffs))
    return ServeResult(opts, outcomes, [prefill, decode], transfer_integral, mean_isl, mean_osl, notes)


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
    ds.client = st.client
    return ds


def _closed_loop_disaggregated(prefill: Pool, decode: Pool, states: Iterator[RequestState], concurrency: int,
                               outcomes: Outcomes) -> float:
    """`concurrency` clients against a PD pair: client c's requests enter prefill instance c mod P;
    a prefilled request's KV moves to decode instance n mod D (n: handoff order); a client sends its
    next request when its previous one finishes (decode, or prefill for one-token outputs).

    The pools are co-simulated: the instance whose next step starts first runs, up to the next start
    of any other instance or the next undelivered event (a handoff or a new request), and events are
    delivered in time order. An event can only reach an instance during a step that started before
    it, where engines see it at the next step, so the interleaving is exact. Returns the seconds
    requests spent between the pools."""
    from infersim.run.memory import kv_bytes_per_token

    bandwidth, _link = transfer_bandwidth(prefill.config, decode.config)
    seconds_per_token = kv_bytes_per_token(prefill.config.model, decode.config.deployment.precision.kv_cache) / bandwidth
    queue = iter(states)
    events: list[tuple[float, int, int, RequestState]] = []  # (time, order, instance (-1 - i: prefill i), state)
    order = count()
    link_free = [0.0] * len(decode.instances)
    handoffs = count()
    transfer_integral = 0.0
    set_arrival = _ArrivalSetter()

    def send(client: int, t: float) -> bool:
        st = next(queue, None)
        if st is None:
            return False
        set_arrival(st, t)
        st.client = client
        heapq.heappush(events, (t, next(order), -1 - client % len(prefill.instances), st))
        return True

    def prefilled(st: RequestState) -> None:
        nonlocal transfer_integral
        if st.req.output_tokens <= 1:
            outcomes.add(st)
            send(st.client, st.finish_s)
            return
        target = next(handoffs) % len(decode.instances)
        arrive = _transfer(st, target, link_free, seconds_per_token)
        transfer_integral += arrive - st.finish_s
        heapq.heappush(events, (arrive, next(order), target, _decode_state(st, arrive)))

    def decoded(ds: RequestState) -> None:
        send(ds.client, ds.finish_s)

    for client in range(concurrency):
        if not send(client, 0.0):
            break  # more clients than requests
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
    return transfer_integral
