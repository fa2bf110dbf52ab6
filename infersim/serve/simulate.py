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
arrival before each iteration, which is all its scheduling looks ahead to; an offline instance runs
ahead while more requests wait than one admission pass can take), finished requests leave their
latencies in bounded samples (`Outcomes`, infersim.serve.outcomes) and are dropped unless
per-request records are asked for, an open-loop instance's queue holds at most `max_waiting`
requests (further arrivals are left waiting: the overload guard, infersim.serve.overload), and only
instances that can ever hold a request are built (at most one per request). An open-loop PD run
keeps each prefilled request until the decode pool runs.

Workloads with stages, shared prefixes or sessions (`options.workload`) run on the co-simulating
driver (infersim.serve.driver); colocated instances only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any

from infersim.run.config import RunConfig, with_variant
from infersim.run.request_limits import runs_past_context
from infersim.run.memory import encoder_note
from infersim.cards.deployment import (
    complete_layout,
    named_deployment_fields,
    with_checkpoint_precision,
    with_engine_defaults,
)
from infersim.base.errors import InferSimError
from infersim.base.texttable import counted
from infersim.modules.comm import p2p_bandwidth
from infersim.serve.admission import (Admission, kept_free_clause, pool_admission, pool_note, prompt_clause,
                                     server_admission, shortened_note, with_kv_pool)
from infersim.serve.outcomes import Outcomes
from infersim.serve.overload import StageLoad, assess_stage
from infersim.serve.cost import StepCoster, StepPriceBook
from infersim.serve.scheduler import Instance, RequestState
from infersim.serve.settings import GivenLimits, SchedulerSettings, settings_from_engine, with_host_tier
from infersim.serve.arrivals import Arrivals, build_requests, listed_arrivals
from infersim.serve.driver import Driver, StageRun
from infersim.serve.options import ServeOptions
from infersim.serve.workload import Request
from infersim.serve.workload_spec import WorkloadSpec


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


@dataclass
class ServeResult:
    options: ServeOptions
    outcomes: Outcomes
    pools: list[Pool]
    transfer_integral_s: float = 0.0  # PD: seconds requests spent between the pools (in flight)
    mean_isl: float = 0.0
    mean_osl: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the run did that was not asked (a trace cut, ...)
    stages: list[StageRun] = field(default_factory=list)  # a staged workload's stages as they ran
    loads: list[StageLoad] = field(default_factory=list)  # offered load against what was served, per stage

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
          requests: int, prefill_only: bool = False, prices: StepPriceBook | None = None) -> Pool:
    """A pool of `count` instances, of which the first min(count, requests) are built: a request
    occupies one instance at a time, so no router ever reaches an instance past the requests'
    number (round-robin by construction; least-loaded always finds an empty one among them)."""
    limit = (opts.workload.max_model_len if opts.workload is not None else None) or opts.max_model_len
    context = config.engine.context_limit.server_context(limit) if limit else None  # as server_admission
    given = GivenLimits(opts.max_running_requests, opts.max_num_tokens, opts.kv_capacity_tokens, context)
    settings = settings_from_engine(config, mean_isl, mean_osl, opts.mode == "offline", opts.prefix_cache,
                                    prefill_only, given)
    if opts.host_kv_bytes or opts.host_kv_tokens:
        settings = with_host_tier(settings, config, opts.host_kv_bytes, opts.host_kv_tokens)
    coster = StepCoster(config, opts.bucket_width, prices)
    instances = [Instance(settings, coster, i, prefill_only) for i in range(min(count, max(1, requests)))]
    for inst in instances:
        inst.prefix_hit_rate = opts.prefix_hit_rate if settings.prefix_cache else 0.0
    return Pool(name, config, settings, instances, coster, count)


def _open_loop_guards(instances: list[Instance], opts: ServeOptions, outcomes: Outcomes) -> None:
    """Every instance's inter-token gaps go to the run's samples; an open-loop instance's queue is
    bounded (the overload guard); an offline one is given its requests as it takes them."""
    for inst in instances:
        inst.stats.itl_sink = outcomes.itl_sink(0)
        inst.drop_sink = outcomes.drop
        if opts.mode in ("poisson", "trace") and not opts.concurrency:
            inst.max_waiting = opts.max_waiting
        if opts.mode == "offline":
            s = inst.s
            budget = s.token_budget + s.dp_ranks if s.token_budget < (1 << 30) else math.inf
            inst.low_water = min(budget, s.max_running or math.inf, s.kv_capacity_tokens + 1) + 64


def simulate_serving_run(config: RunConfig, opts: ServeOptions, keep_records: bool = True,
                         prices: StepPriceBook | None = None) -> ServeResult:
    """One serving run; `prices`: the caller's step prices, shared by its runs (infersim.serve.cost)."""
    slo = opts.slo
    outcomes = Outcomes(keep_records, slo.ttft_s if slo else None, slo.tpot_s if slo else None)
    if config.model.max_position_embeddings:
        outcomes.context_tokens = config.model.max_position_embeddings
    if opts.workload is not None:
        return _run_workload(config, opts, outcomes, prices)
    arrivals = build_requests(config, opts)
    if not isinstance(arrivals, Arrivals):
        arrivals = listed_arrivals(arrivals)
    mean_isl, mean_osl = arrivals.mean_isl, arrivals.mean_osl
    requests = arrivals.requests()
    admission = server_admission(config, opts.max_model_len)
    if opts.disaggregate is not None:
        if opts.mode == "poisson" and opts.concurrency:
            raise InferSimError("serve: a request rate with a concurrency cap is not modelled with PD disaggregation; "
                                "give one of them")
        prefill, decode = _disaggregated_pools(config, opts, arrivals, prices)
        admission = with_kv_pool(admission, config, [prefill.settings, decode.settings])
        states = _admitted(requests, admission, outcomes)
        result = _run_disaggregated(config, opts, arrivals, (prefill, decode), states, outcomes)
        result.notes.extend(_limit_notes(config, opts.max_model_len, admission, outcomes))
        return _with_loads(result)
    pool = _pool("colocated", config, opts.replicas, opts, mean_isl, mean_osl, arrivals.count, prices=prices)
    admission = with_kv_pool(admission, config, [pool.settings])
    states = _admitted(requests, admission, outcomes)
    instances = pool.instances
    for inst in instances:
        inst.sink = outcomes.add
    _open_loop_guards(instances, opts, outcomes)
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
    notes = list(arrivals.notes) + _limit_notes(config, opts.max_model_len, admission, outcomes)
    return _with_loads(ServeResult(opts, outcomes, [pool], 0.0, mean_isl, mean_osl, notes))


def _admitted(requests: Iterable[Request], admission: Admission | None, outcomes: Outcomes) -> Iterator[RequestState]:
    """The requests as the server takes them (_admissible), each a RequestState, the server's limit
    kept in `outcomes` for what it rejects."""
    if admission is not None:
        requests = _admissible(requests, admission, outcomes)
        outcomes.admits = admission.admits
    return (RequestState(r) for r in requests)


def _limit_notes(config: RunConfig, max_model_len: int | None, admission: Admission | None,
                 outcomes: Outcomes) -> list[str]:
    # a request stream's only refusals on arrival are the context limit's and the KV pool's (_admissible)
    refused = outcomes.whole().rejected - outcomes.pool_rejected
    notes = ([_beyond_context_note(config, refused)] if admission is not None and admission.context
             and not max_model_len and refused else [])
    if admission is not None:
        notes.extend(shortened_note(config, admission, outcomes))
    return (notes + pool_note(config, admission, outcomes) + context_notes(config, max_model_len, outcomes)
            + encoder_note(config.model, config.engine))


def _beyond_context_note(config: RunConfig, refused: int) -> str:
    rule, engine, context = config.engine.context_limit, config.engine.name, config.model.max_position_embeddings
    kept = kept_free_clause(rule, engine)
    prompt = prompt_clause(rule, context) + ("," if rule.prompt_margin else "")
    return (f"{counted(refused, 'request')} longer (prompt + output) than model {config.model.name}'s context of "
            f"{context:,} tokens{kept}{prompt} {'was' if refused == 1 else 'were'} rejected on arrival: "
            f"max_model_len not given, {engine} defaults it to the model's max_position_embeddings")


def context_notes(config: RunConfig, max_model_len: int | None, outcomes: Outcomes) -> list[str]:
    """What a run says of the model's context length: a max_model_len given above it (an engine that
    refuses beyond the context starts only with its override setting), and the requests served past it."""
    context = config.model.max_position_embeddings
    if not context:
        return []
    engine, model = config.engine.name, config.model.name
    beyond = outcomes.beyond_context
    served = (f"{counted(beyond, 'request')} longer (prompt + output) than model {model}'s context of "
              f"{context:,} tokens (max_position_embeddings) {'was' if beyond == 1 else 'were'} served")
    if config.engine.context_limit.beyond == "run":
        if not beyond:
            return []
        return [f"{served}: {runs_past_context(engine, beyond)}"]
    if max_model_len is None or max_model_len <= context:
        return []
    override = config.engine.context_limit.override
    start = (f"{engine} starts with it only when {override} is set" if override else
             f"{engine} may refuse to start with it (engine card {engine} names no setting that allows it)")
    past = (f"; {counted(beyond, 'request')} longer than that (prompt + output) {'was' if beyond == 1 else 'were'} "
            "served" if beyond else "")
    return [f"max_model_len {max_model_len:,} is above model {model}'s context of {context:,} tokens "
            f"(max_position_embeddings): {start}, and the model's output quality past its trained context is not "
            f"assured{past}"]


def _admissible(requests: Iterable[Request], admission: Admission, outcomes: Outcomes) -> Iterator[Request]:
    """The requests a server with this context limit takes, as it runs them (an output cut to fit);
    the others are rejected on arrival."""
    for req in requests:
        taken = admission.take(req, outcomes)
        if taken is not None:
            yield taken


def _with_loads(result: ServeResult) -> ServeResult:
    """The overload test over an open-loop stream's arrivals (infersim.serve.overload)."""
    opts = result.options
    whole = result.outcomes.whole()
    if opts.mode not in ("poisson", "trace") or opts.concurrency or not whole.requests:
        return result
    start = 0.0 if opts.mode == "poisson" else whole.first_arrival
    result.loads = [assess_stage(result.outcomes.timeline, -1, start, whole.last_arrival, whole.requests,
                                 whole.dropped, opts.rate if opts.mode == "poisson" else None)]
    return result


def _run_workload(config: RunConfig, opts: ServeOptions, outcomes: Outcomes,
                  prices: StepPriceBook | None = None) -> ServeResult:
    """A staged workload (stages, shared prefixes, sessions) on the co-simulating driver."""
    from infersim.serve.datasets import Traffic

    spec = opts.workload
    assert spec is not None
    if opts.disaggregate is not None:
        raise InferSimError("serve: a staged workload (options.workload) runs on colocated instances; PD "
                            "disaggregation of it is not modelled")
    mean_isl, mean_osl = workload_means(spec)
    pool = _pool("colocated", config, opts.replicas, opts, mean_isl, mean_osl, spec.total_requests, prices=prices)
    notes = list(spec.notes)
    if spec.max_model_len and opts.max_model_len and spec.max_model_len != opts.max_model_len:
        raise InferSimError(f"max_model_len {opts.max_model_len:,} (--max-model-len or the options) and the workload's "
                            f"max_model_len {spec.max_model_len:,}: give one")
    given = spec.max_model_len or opts.max_model_len
    admission = server_admission(config, given)
    if admission is not None and not given:
        rule = config.engine.context_limit
        longer = ("admitted with their output cut to fit (a prompt that leaves no room is rejected on arrival)"
                  if rule.beyond == "shorten_output" else "rejected on arrival")
        notes.append(f"max_model_len not given: {config.engine.name} defaults it to model {config.model.name}'s "
                     f"context, {admission.context:,} tokens (max_position_embeddings); longer requests are {longer}")
    admission = with_kv_pool(admission, config, [pool.settings])
    if not given and (spec.data.multi_turn or spec.data.type == "sessions") and (admission is None or admission.pool is None):
        longest = pool.settings.longest_request_tokens()  # the rule the scheduler refuses a request by
        if admission is None or longest < admission.longest():
            admission = pool_admission(longest)
            notes.append(f"conversations grow, and a request longer than the KV pool of "
                         f"{pool.settings.kv_capacity_tokens:,} tokens holds alone ({longest:,} tokens: "
                         f"{pool.settings.admission} in pages of {pool.settings.page_size}) is rejected on arrival, "
                         "as a server whose context fits its pool would")
    if admission is not None:
        outcomes.admits = admission.admits
    traffic = Traffic(spec, opts.seed, admission, outcomes)
    for inst in pool.instances:
        inst.sink = outcomes.add
        inst.max_waiting = opts.max_waiting
    driver = Driver(pool.instances, traffic, outcomes, opts.router, opts.max_waiting)
    runs = driver.run(spec)
    result = ServeResult(opts, outcomes, [pool], 0.0, mean_isl, mean_osl, notes + traffic.notes + traffic.length_notes(),
                         runs)
    if admission is not None:
        result.notes.extend(shortened_note(config, admission, outcomes))
    result.notes.extend(pool_note(config, admission, outcomes))
    result.notes.extend(context_notes(config, given, outcomes))
    outside = outcomes.not_counted.requests
    if outside:
        result.notes.append(f"{counted(outside, 'request')} sent in the stages' lead-ins and tails (lead_s, tail_s) "
                            f"{'was' if outside == 1 else 'were'} simulated and kept out of every count and latency; "
                            f"the run's throughput, energy and engine lines include {'it' if outside == 1 else 'them'}")
    for run in runs:
        stage = outcomes.stages.get(run.index)
        if stage is None or not stage.requests or run.spec.concurrency is not None:
            continue
        end = run.start_s + run.spec.duration_s if run.spec.duration_s is not None else stage.last_arrival
        result.loads.append(assess_stage(outcomes.timeline, run.index, run.start_s, end, stage.requests,
                                         stage.dropped, run.spec.rate if run.spec.duration_s is not None else None))
    return result


def workload_means(spec: WorkloadSpec) -> tuple[float, float]:
    """Mean prompt and output lengths of a workload's first requests (what the KV pool is sized with)."""
    data = spec.data
    out = data.output.mean if data.output is not None else 1.0
    if data.type == "random":
        assert data.input is not None
        return data.prefix_tokens + data.input.mean, out
    if data.type == "prefix_repetition":
        return float(data.prefix_len + data.suffix_len), out
    system = data.system_prompt_len.mean if data.system_prompt_len is not None else 0.0
    question = data.question_len.mean if data.question_len is not None else 0.0
    return max(1.0, system + question), out


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


def transfer_seconds(prefill: RunConfig, decode: RunConfig) -> Callable[[int], float]:
    """Seconds one prompt's cache of a number of tokens takes from a prefill to a decode instance:
    the KV of its full-attention layers per token, what its sliding-window and chunked layers keep of
    it (at most their window) and its recurrent states, as the decode engine's cache holds them
    (infersim.run.memory.cache_view), over the pair's link (transfer_bandwidth)."""
    from infersim.run.memory import bounded_bytes_per_request, cache_view, kv_bytes_per_token

    bandwidth, _link = transfer_bandwidth(prefill, decode)
    model = cache_view(decode.model, decode.engine)
    dtype = decode.deployment.precision.kv_cache
    per_token_s = kv_bytes_per_token(model, dtype) / bandwidth

    def seconds(tokens: int) -> float:
        return tokens * per_token_s + bounded_bytes_per_request(model, dtype, tokens) / bandwidth

    return seconds


def _disaggregated_pools(config: RunConfig, opts: ServeOptions, arrivals: Arrivals,
                         prices: StepPriceBook | None = None) -> tuple[Pool, Pool]:
    """The prefill and the decode pool of a disaggregated run."""
    d = opts.disaggregate
    assert d is not None
    mean_isl, mean_osl = arrivals.mean_isl, arrivals.mean_osl
    pconf = _pool_config(config, d.prefill_deployment, "disaggregate.prefill_deployment")
    dconf = _pool_config(config, d.decode_deployment, "disaggregate.decode_deployment")
    return (_pool("prefill", pconf, d.prefill_instances, opts, mean_isl, 1.0, arrivals.count, True, prices),
            _pool("decode", dconf, d.decode_instances, opts, mean_isl, mean_osl, arrivals.count, prices=prices))


def _run_disaggregated(config: RunConfig, opts: ServeOptions, arrivals: Arrivals, pools: tuple[Pool, Pool],
                       states: Iterator[RequestState], outcomes: Outcomes) -> ServeResult:
    mean_isl, mean_osl = arrivals.mean_isl, arrivals.mean_osl
    prefill, decode = pools
    pconf, dconf = prefill.config, decode.config
    for inst in decode.instances:
        inst.sink = outcomes.add
        inst.stats.itl_sink = outcomes.itl_sink(0)
    _open_loop_guards(prefill.instances, opts, outcomes)
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
    moved = transfer_seconds(pconf, dconf)
    link_free = [0.0] * len(decode.instances)
    handoffs = []
    transfer_integral = 0.0
    prefilled.sort(key=lambda st: (st.finish_s, st.req.id))
    for n, st in enumerate(prefilled):
        target = n % len(decode.instances)
        arrive = _transfer(st, target, link_free, moved)
        transfer_integral += arrive - st.finish_s
        handoffs.append((arrive, st.req.id, target, _decode_state(st, arrive)))
    prefilled.clear()  # the handoffs hold the decode-side states now
    handoffs.sort(key=lambda h: (h[0], h[1]))
    _feed(decode.instances, ((target, ds) for _arrive, _id, target, ds in handoffs))
    return ServeResult(opts, outcomes, [prefill, decode], transfer_integral, mean_isl, mean_osl, notes)


def _transfer(st: RequestState, target: int, link_free: list[float], moved: Callable[[int], float]) -> float:
    """When a prefilled request's KV reaches decode instance `target`: its link carries one request
    at a time, starting when the prefill finishes and the link is free (`moved`: transfer_seconds)."""
    start = max(st.finish_s, link_free[target])
    link_free[target] = start + moved(st.req.input_tokens)
    return link_free[target]


def _decode_state(st: RequestState, arrive: float) -> RequestState:
    """The request as it enters the decode pool; its record keeps the prefill side's timings (its
    first token is out once its KV has arrived)."""
    ds = RequestState(st.req, ready_s=arrive, prefilled=True)
    ds.scheduled_s = st.scheduled_s
    ds.first_token_s = arrive
    ds.preemptions = st.preemptions
    ds.cached = st.cached
    ds.host_cached = st.host_cached
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
    moved = transfer_seconds(prefill.config, decode.config)
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
        arrive = _transfer(st, target, link_free, moved)
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
