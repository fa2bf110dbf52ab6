"""Summary of a serving run, with the field names `vllm bench serve` writes (milliseconds, tokens/s).

Definitions (as vLLM's benchmark computes them): TTFT = first token - arrival; TPOT of a request =
(E2E - TTFT) / (output tokens - 1), over requests with more than one output token; ITL = the gaps
between consecutive tokens of a request (mean_itl_ms = all gaps of all requests / their count;
percentiles from the per-step gaps, weighted by the tokens that saw them; under speculative
decoding a step's tokens come at once, so its gap is one chunk's, as a streaming client sees it);
E2E latency = finish - arrival; duration = from t = 0 (the benchmark's start) to the last
completion. Queueing time = admission - arrival. Goodput = requests per second that meet every
given SLO. Percentiles are exact up to infersim.serve.quantiles.EXACT_LIMIT samples and within
0.5% past it. prefix_cache_hit_rate = prompt tokens found in the prefix cache / prompt tokens, over
completed requests (host_cache_hit_rate: of which from the host tier).
Little's law check: mean requests in the system (integrated over time inside the instances, in
flight between PD pools included) over [first arrival, last completion] against request
throughput x mean E2E latency over the same window.
A staged workload also has `stages`: per load stage, what inference-perf reports per stage (its
requests, their latencies and throughput over the stage's time) and the stage's offered load
against what was served. Open-loop loads have `load`: offered against served, and when the test of
infersim.serve.overload finds the queue growing without bound, `warnings` says so.
"""

from __future__ import annotations

from typing import Any

from infersim.serve.options import Slo
from infersim.serve.energy import serving_energy
from infersim.serve.outcomes import StageOutcomes
from infersim.serve.overload import StageLoad, warning_text
from infersim.serve.quantiles import Samples
from infersim.serve.simulate import ServeResult


def percentile_key(q: float) -> str:
    """The summary's name of percentile q (as vllm bench serve names them): median, p90, p99.9."""
    if q == 50:
        return "median"
    return f"p{int(q) if float(q).is_integer() else q}"


def _stats(name: str, samples: Samples, out: dict[str, Any], extra: tuple[float, ...] = ()) -> None:
    """mean/median/std/p90/p99 (and the `extra` percentiles) of `samples` (seconds) as <stat>_<name>_ms."""
    median, p90, p99, *more = samples.percentiles((50, 90, 99, *extra))
    out[f"mean_{name}_ms"] = samples.mean * 1e3
    out[f"median_{name}_ms"] = median * 1e3
    out[f"std_{name}_ms"] = samples.std * 1e3
    out[f"p90_{name}_ms"] = p90 * 1e3
    out[f"p99_{name}_ms"] = p99 * 1e3
    for q, value in zip(extra, more):
        out[f"{percentile_key(q)}_{name}_ms"] = value * 1e3


def _latencies(s: StageOutcomes, out: dict[str, Any], extra: tuple[float, ...] = ()) -> None:
    _stats("ttft", s.ttft, out, extra)
    _stats("tpot", s.tpot, out, extra)
    out["mean_itl_ms"] = s.gap_sum / s.gap_count * 1e3 if s.gap_count else 0.0
    median, p90, p99 = s.itl.percentiles((50, 90, 99))
    out["median_itl_ms"] = median * 1e3
    out["p90_itl_ms"] = p90 * 1e3
    out["p99_itl_ms"] = p99 * 1e3
    _stats("e2el", s.e2e, out)
    _stats("queue", s.queue, out)
    out["prefix_cache_hit_rate"] = s.cached_tokens / s.input_tokens if s.input_tokens else 0.0
    out["host_cache_hit_rate"] = s.host_cached_tokens / s.input_tokens if s.input_tokens else 0.0


def summarize(result: ServeResult, slo: Slo | None = None, include_requests: bool = False) -> dict[str, Any]:
    opts = result.options
    slo = slo if slo is not None else opts.slo
    whole = result.outcomes.whole()
    n = whole.completed
    good = whole.good if slo is not None else 0
    # requests of stages' lead-ins and tails: out of the counts and latencies, in the rates over the time
    served = result.outcomes.served()
    duration = served.last_finish
    input_tokens, output_tokens = served.input_tokens, served.output_tokens
    gpus = result.gpus
    per_second = 1.0 / duration if duration > 0 else 0.0
    out: dict[str, Any] = {
        "mode": opts.mode,
        "num_prompts": whole.requests,
        "completed": n,
        "failed": whole.rejected + whole.dropped,  # as vllm bench serve writes it: always, 0 included
        "duration": duration,
        "total_input_tokens": whole.input_tokens,
        "total_output_tokens": whole.output_tokens,
        "request_throughput": served.completed * per_second,
        "request_goodput": good * per_second if slo is not None else None,
        "output_throughput": output_tokens * per_second,
        "total_token_throughput": (input_tokens + output_tokens) * per_second,
        "num_gpus": gpus,
        "output_throughput_per_gpu": output_tokens * per_second / gpus,
        "total_token_throughput_per_gpu": (input_tokens + output_tokens) * per_second / gpus,
        "request_throughput_per_gpu": served.completed * per_second / gpus,
    }
    if result.outcomes.not_counted.requests:
        out["not_counted"] = result.outcomes.not_counted.requests
    if whole.rejected or whole.dropped:
        out["rejected"] = whole.rejected
        out["left_waiting"] = whole.dropped
    if whole.rejected and result.outcomes.admits:
        out["rejected_as_longer_than"] = result.outcomes.admits
    if result.outcomes.shortened:  # admitted with the output cut to fit the server's context (said under NOTES)
        out["shortened"] = result.outcomes.shortened
        out["shortened_output_tokens"] = result.outcomes.shortened_tokens
    if result.outcomes.pool_rejected:  # of the rejected, those refused for the engine's KV pool (said under NOTES)
        out["rejected_for_kv_pool"] = result.outcomes.pool_rejected
    if result.outcomes.pool_shortened:  # admitted with the output cut further for the engine's KV pool
        out["shortened_for_kv_pool"] = result.outcomes.pool_shortened
        out["shortened_for_kv_pool_output_tokens"] = result.outcomes.pool_shortened_tokens
    if opts.workload is not None:
        out["workload"] = opts.workload.describe()
    if opts.mode == "poisson":
        out["request_rate"] = opts.rate
    if opts.mode == "concurrency" or opts.concurrency:
        out["max_concurrency"] = opts.concurrency
    _latencies(whole, out, opts.percentiles)
    if slo is not None:
        out["slo"] = {"ttft_ms": slo.ttft_s * 1e3 if slo.ttft_s is not None else None,
                      "tpot_ms": slo.tpot_s * 1e3 if slo.tpot_s is not None else None}
        out["slo_attainment"] = good / n if n else 0.0
    out["little"] = _little(result, served)  # the time integral holds every simulated request
    out.update(_pools(result, duration))
    _load_and_warnings(result, out)
    if not whole.completed:
        out.setdefault("warnings", []).append(
            f"no request completed ({whole.rejected:,} rejected as too long, {whole.dropped:,} left waiting): the "
            "latencies and throughputs are 0 (as vllm bench serve writes a run without a completed request), not "
            "measurements")
    if result.stages:
        out["stages"] = [_stage(result, run, result.outcomes.stages.get(run.index)) for run in result.stages]
    out["energy"] = serving_energy(result, duration)
    if result.notes:
        out["notes"] = list(result.notes)
    if include_requests:
        out["requests"] = [request_record(r) for r in result.records]
    return out


def _little(result: ServeResult, whole: StageOutcomes) -> dict[str, float]:
    window = whole.last_finish - whole.first_arrival
    inflight = sum(inst.stats.inflight_integral for pool in result.pools for inst in pool.instances)
    inflight += result.transfer_integral_s
    return {"mean_in_flight": inflight / window if window > 0 else 0.0,
            "throughput_x_latency": whole.completed / window * whole.e2e.mean if window > 0 else 0.0}


def _pools(result: ServeResult, duration: float) -> dict[str, Any]:
    pools = []
    for pool in result.pools:
        insts = pool.instances
        busy = sum(i.stats.busy_s for i in insts)
        capacity = pool.settings.kv_capacity_tokens
        caches = [i.cache for i in insts if i.cache is not None]
        pools.append({
            "role": pool.name,
            "instances": pool.count,
            "gpus_per_instance": pool.config.deployment.num_gpus,
            "engine": f"{pool.config.engine.name} {pool.config.engine.version}",
            "scheduler": pool.settings.describe(),
            "token_budget": pool.settings.token_budget,
            "max_running_requests": pool.settings.max_running,
            "kv_capacity_tokens": capacity,
            "host_kv_capacity_tokens": pool.settings.host_kv_tokens,
            "kv_utilization_mean": sum(i.stats.kv_integral for i in insts) / busy / capacity if busy else 0.0,
            "kv_utilization_peak": max(i.stats.kv_peak for i in insts) / capacity,
            "steps": sum(i.stats.steps for i in insts),
            "iterations": sum(i.stats.iterations for i in insts),
            "busy_fraction": busy / (duration * pool.count) if duration else 0.0,
            "preemptions": sum(i.stats.preemptions for i in insts),
            "tokens_emitted": sum(i.stats.tokens_emitted for i in insts),
            "priced_step_shapes": pool.coster.priced,
            "prefix_cache_evicted_tokens": sum(c.evicted_blocks * c.block for c in caches),
        })
        if pool.coster.lookahead:
            pools[-1]["speculative"] = {"lookahead": pool.coster.lookahead,
                                        "expected_tokens_per_step": pool.coster.tokens_per_step,
                                        "lookahead_auto": pool.coster.lookahead_auto}
    last = pools[-1]
    return {"pools": pools, "preemptions": sum(p["preemptions"] for p in pools),
            "kv_utilization_mean": last["kv_utilization_mean"], "kv_utilization_peak": last["kv_utilization_peak"],
            "steps": sum(p["steps"] for p in pools), "tokens_emitted": sum(p["tokens_emitted"] for p in pools),
            "iterations": sum(p["iterations"] for p in pools)}


def _load_json(load: StageLoad) -> dict[str, Any]:
    return {"offered_rps": load.offered_rps, "overloaded": load.overloaded,
            "saturated_capacity_rps": load.saturated_capacity_rps, "backlog_growth": load.backlog_growth,
            "arrived_second_half": load.arrived_second_half, "left_waiting": load.dropped}


def _load_and_warnings(result: ServeResult, out: dict[str, Any]) -> None:
    if not result.loads:
        return
    whole = result.outcomes.whole()
    served_window = whole.last_finish - whole.first_arrival
    overloaded = [load for load in result.loads if load.overloaded]
    out["load"] = {
        "offered_rps": result.loads[0].offered_rps if len(result.loads) == 1 else None,
        "served_rps": whole.completed / served_window if served_window > 0 else 0.0,
        "overloaded": bool(overloaded),
        "saturated_capacity_rps": min((load.saturated_capacity_rps for load in overloaded
                                       if load.saturated_capacity_rps is not None), default=None),
        "admitted": whole.completed, "left_waiting": whole.dropped, "rejected": whole.rejected,
        "test": "overloaded when, over the second half of a stage's arrivals, arrivals exceed admissions by more "
                "than max(5% of the arrivals, 3 sqrt(arrivals)), or an arrival finds the queue full (max_waiting)",
    }
    if len(result.loads) == 1:
        out["load"].update({k: v for k, v in _load_json(result.loads[0]).items() if k not in out["load"]})
    unmeasured = [load.capacity_unmeasured for load in overloaded if load.capacity_unmeasured]
    if out["load"]["saturated_capacity_rps"] is None and unmeasured:
        out["load"]["saturated_capacity_unmeasured"] = unmeasured[0]
    if overloaded:
        out["warnings"] = [warning_text(load, result.options.max_waiting) for load in overloaded]


def _stage(result: ServeResult, run: Any, s: StageOutcomes | None) -> dict[str, Any]:
    spec = run.spec
    row: dict[str, Any] = {"stage": run.index, "rate": spec.rate, "duration_s": spec.duration_s,
                           "concurrency": spec.concurrency, "start_s": run.start_s, "end_s": run.end_s}
    ramp = result.options.workload.ramp if result.options.workload is not None else None
    if ramp is not None:  # the stage's rate is the ramp's
        row["ramp"] = {"strategy": ramp.strategy, "start_rps": ramp.start_rps, "end_rps": ramp.end_rps}
    if s is None:
        row.update({"num_prompts": 0, "completed": 0})
        return row
    # a windowed stage's counted requests arrive over its duration_s (its lead-in and tail are not counted)
    span = spec.duration_s if spec.windowed else run.end_s - run.start_s
    row.update({"num_prompts": s.requests, "completed": s.completed, "rejected": s.rejected, "left_waiting": s.dropped,
                "request_throughput": s.completed / span if span > 0 else 0.0,
                "output_throughput": s.output_tokens / span if span > 0 else 0.0,
                "total_input_tokens": s.input_tokens, "total_output_tokens": s.output_tokens,
                "mean_input_tokens": s.input_tokens / s.completed if s.completed else 0.0})
    _latencies(s, row)
    # inference-perf's mean ITL as the public runs report it: a TPOT of the stage's means
    mean_output = s.output_tokens / s.completed if s.completed else 0.0
    row["itl_of_means_ms"] = ((row["mean_e2el_ms"] - row["mean_ttft_ms"]) / (mean_output - 1)
                              if mean_output > 1 else 0.0)
    load = next((load for load in result.loads if load.stage == run.index), None)
    if load is not None:
        row.update(_load_json(load))
    return row


#: the fields of a completed request's record (request_record), in order
REQUEST_FIELDS = ("id", "arrival_s", "input_tokens", "output_tokens", "cached_tokens", "instance", "scheduled_s",
                  "first_token_s", "finish_s", "queue_ms", "ttft_ms", "tpot_ms", "e2el_ms", "preemptions")


def request_record(r: Any) -> dict[str, Any]:
    out_tokens = r.req.output_tokens
    ttft = r.first_token_s - r.req.arrival_s
    e2e = r.finish_s - r.req.arrival_s
    return {
        "id": r.req.id,
        "arrival_s": r.req.arrival_s,
        "input_tokens": r.req.input_tokens,
        "output_tokens": out_tokens,
        "cached_tokens": r.cached,
        "instance": r.instance,
        "scheduled_s": r.scheduled_s,
        "first_token_s": r.first_token_s,
        "finish_s": r.finish_s,
        "queue_ms": max(0.0, r.scheduled_s - r.req.arrival_s) * 1e3,
        "ttft_ms": ttft * 1e3,
        "tpot_ms": (e2e - ttft) / (out_tokens - 1) * 1e3 if out_tokens > 1 else None,
        "e2el_ms": e2e * 1e3,
        "preemptions": r.preemptions,
    }
