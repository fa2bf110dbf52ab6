"""Summary of a serving run, with the field names `vllm bench serve` writes (milliseconds, tokens/s).

Definitions (as vLLM's benchmark computes them): TTFT = first token - arrival; TPOT of a request =
(E2E - TTFT) / (output tokens - 1), over requests with more than one output token; ITL = the gaps
between consecutive tokens of a request (mean_itl_ms = all gaps of all requests / their count;
percentiles from the per-step gaps, weighted by the tokens that saw them); E2E latency = finish -
arrival; duration = from t = 0 (the benchmark's start) to the last completion. Queueing time =
admission - arrival. Goodput = requests per second that meet every given SLO.
Little's law check: mean requests in the system (integrated over time inside the instances, in
flight between PD pools included) over [first arrival, last completion] against request
throughput x mean E2E latency over the same window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from infersim.serve.options import Slo
from infersim.serve.energy import serving_energy
from infersim.serve.simulate import ServeResult
from infersim.base.stats import percentile


def weighted_percentile(samples: Iterable[tuple[float, int]], q: float) -> float:
    ordered = sorted(samples)
    total = sum(w for _v, w in ordered)
    if not total:
        return 0.0
    target = q / 100 * total
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen >= target:
            return value
    return ordered[-1][0]


def percentile_key(q: float) -> str:
    """The summary's name of percentile q (as vllm bench serve names them): median, p90, p99.9."""
    if q == 50:
        return "median"
    return f"p{int(q) if float(q).is_integer() else q}"


def _stats(name: str, values: Iterable[float], out: dict[str, Any], extra: tuple[float, ...] = ()) -> list[float]:
    """mean/median/std/p90/p99 (and the `extra` percentiles) of `values` (seconds) as <stat>_<name>_ms;
    returns them sorted."""
    values = sorted(values)
    n = len(values)
    mean = sum(values) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n) if n else 0.0
    out[f"mean_{name}_ms"] = mean * 1e3
    out[f"median_{name}_ms"] = percentile(values, 50) * 1e3
    out[f"std_{name}_ms"] = std * 1e3
    out[f"p90_{name}_ms"] = percentile(values, 90) * 1e3
    out[f"p99_{name}_ms"] = percentile(values, 99) * 1e3
    for q in extra:
        out[f"{percentile_key(q)}_{name}_ms"] = percentile(values, q) * 1e3
    return values


def meets_slo(ttft_s: float, tpot_s: float | None, slo: Slo | None) -> bool:
    if slo is None:
        return True
    if slo.ttft_s is not None and ttft_s > slo.ttft_s:
        return False
    return not (slo.tpot_s is not None and tpot_s is not None and tpot_s > slo.tpot_s)


def summarize(result: ServeResult, slo: Slo | None = None, include_requests: bool = False) -> dict[str, Any]:
    done = result.outcomes
    opts = result.options
    slo = slo if slo is not None else opts.slo
    n = len(done)
    good = sum(1 for t, p in zip(done.ttft, done.tpot) if meets_slo(t, None if math.isnan(p) else p, slo))
    first_arrival, last_finish = done.first_arrival, done.last_finish
    duration = last_finish
    input_tokens, output_tokens = done.input_tokens, done.output_tokens
    gpus = result.gpus
    out: dict[str, Any] = {
        "mode": opts.mode,
        "num_prompts": n,
        "completed": n,
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": n / duration,
        "request_goodput": good / duration if slo is not None else None,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "num_gpus": gpus,
        "output_throughput_per_gpu": output_tokens / duration / gpus,
        "total_token_throughput_per_gpu": (input_tokens + output_tokens) / duration / gpus,
        "request_throughput_per_gpu": n / duration / gpus,
    }
    if opts.mode == "poisson":
        out["request_rate"] = opts.rate
    if opts.mode == "concurrency" or opts.concurrency:
        out["max_concurrency"] = opts.concurrency
    _stats("ttft", done.ttft, out, opts.percentiles)
    _stats("tpot", (p for p in done.tpot if not math.isnan(p)), out, opts.percentiles)
    samples = [s for pool in result.pools for inst in pool.instances
               for s in zip(inst.stats.itl_gaps, inst.stats.itl_tokens)]
    out["mean_itl_ms"] = done.gap_sum / done.gap_count * 1e3 if done.gap_count else 0.0
    out["median_itl_ms"] = weighted_percentile(samples, 50) * 1e3
    out["p90_itl_ms"] = weighted_percentile(samples, 90) * 1e3
    out["p99_itl_ms"] = weighted_percentile(samples, 99) * 1e3
    del samples
    e2e = _stats("e2el", done.e2e, out)
    _stats("queue", done.queue, out)
    if slo is not None:
        out["slo"] = {"ttft_ms": slo.ttft_s * 1e3 if slo.ttft_s is not None else None,
                      "tpot_ms": slo.tpot_s * 1e3 if slo.tpot_s is not None else None}
        out["slo_attainment"] = good / n
    window = last_finish - first_arrival
    inflight = sum(inst.stats.inflight_integral for pool in result.pools for inst in pool.instances)
    inflight += result.transfer_integral_s
    mean_latency = sum(e2e) / len(e2e)
    out["little"] = {
        "mean_in_flight": inflight / window if window > 0 else 0.0,
        "throughput_x_latency": n / window * mean_latency if window > 0 else 0.0,
    }
    pools = []
    for pool in result.pools:
        insts = pool.instances
        busy = sum(i.stats.busy_s for i in insts)
        kv_mean = sum(i.stats.kv_integral for i in insts) / busy / pool.settings.kv_capacity_tokens if busy else 0.0
        pools.append({
            "role": pool.name,
            "instances": pool.count,
            "gpus_per_instance": pool.config.deployment.num_gpus,
            "engine": f"{pool.config.engine.name} {pool.config.engine.version}",
            "scheduler": pool.settings.describe(),
            "token_budget": pool.settings.token_budget,
            "max_running_requests": pool.settings.max_running,
            "kv_capacity_tokens": pool.settings.kv_capacity_tokens,
            "kv_utilization_mean": kv_mean,
            "kv_utilization_peak": max(i.stats.kv_peak for i in insts) / pool.settings.kv_capacity_tokens,
            "steps": sum(i.stats.steps for i in insts),
            "iterations": sum(i.stats.iterations for i in insts),
            "busy_fraction": busy / (duration * pool.count) if duration else 0.0,
            "preemptions": sum(i.stats.preemptions for i in insts),
            "tokens_emitted": sum(i.stats.tokens_emitted for i in insts),
            "priced_step_shapes": pool.coster.priced,
        })
    out["pools"] = pools
    out["preemptions"] = sum(p["preemptions"] for p in pools)
    out["kv_utilization_mean"] = pools[-1]["kv_utilization_mean"]
    out["kv_utilization_peak"] = pools[-1]["kv_utilization_peak"]
    out["steps"] = sum(p["steps"] for p in pools)
    out["tokens_emitted"] = sum(p["tokens_emitted"] for p in pools)
    out["iterations"] = sum(p["iterations"] for p in pools)
    out["energy"] = serving_energy(result, duration)
    if result.notes:
        out["notes"] = list(result.notes)
    if include_requests:
        out["requests"] = [request_record(r) for r in result.records]
    return out


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
