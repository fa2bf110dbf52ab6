"""Text report of a serving run, a rate sweep and an SLO search (JSON is the summary dict itself)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from infersim.base.texttable import counted
from infersim.serve.energy import energy_text
from infersim.serve.metrics import percentile_key


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def summary_text(s: dict[str, Any], title: str = "") -> str:
    lines = []
    if title:
        lines.append(title)
    mode = s["mode"]
    capped = f", at most {s['max_concurrency']} in flight" if mode == "poisson" and s.get("max_concurrency") else ""
    if mode == "concurrency":
        load = f"closed loop, {counted(s['max_concurrency'], 'client')}"
    else:
        load = {"poisson": f"Poisson {s.get('request_rate', 0):g} req/s{capped}", "offline": "offline (all requests at "
                "t = 0)", "trace": "trace replay", "workload": s.get("workload", "workload")}[mode]
    done = counted(s["completed"], "request")
    if s.get("failed"):
        done = (f"{s['completed']:,} of {counted(s['num_prompts'], 'request')} completed ({s['rejected']:,} rejected "
                f"as too long, {s['left_waiting']:,} left waiting)")
    lines.append(f"  load:        {done}, {load}; {s['total_input_tokens']:,} input and "
                 f"{s['total_output_tokens']:,} output tokens")
    for pool in s["pools"]:
        lines.append(f"  {pool['role']:<12} {pool['instances']} x {pool['gpus_per_instance']} GPU(s), "
                     f"{pool['engine']}: {pool['scheduler']}")
    lines.append("")
    lines.append(f"THROUGHPUT  over {s['duration']:,.2f} s on {s['num_gpus']} GPU(s)")
    lines.append(f"  requests   {s['request_throughput']:,.3f} req/s"
                 + (f"   goodput {s['request_goodput']:,.3f} req/s ({s['slo_attainment']:.1%} of requests meet the SLO)"
                    if s.get("request_goodput") is not None else ""))
    lines.append(f"  output     {s['output_throughput']:,.1f} tok/s   ({s['output_throughput_per_gpu']:,.1f} per GPU)")
    lines.append(f"  total      {s['total_token_throughput']:,.1f} tok/s   ({s['total_token_throughput_per_gpu']:,.1f} per GPU)")
    load_info = s.get("load") or {}
    if load_info.get("overloaded"):
        capacity = load_info.get("saturated_capacity_rps")
        offered = load_info.get("offered_rps")
        lines.append(f"  OVERLOADED: offered {offered:,.3f} req/s" if offered is not None else "  OVERLOADED")
        unmeasured = load_info.get("saturated_capacity_unmeasured")
        lines[-1] += (f", saturated capacity {capacity:,.3f} req/s" if capacity is not None else
                      f", saturated capacity not measured ({unmeasured})" if unmeasured else "") + (
            f"; {counted(load_info['admitted'], 'request')} admitted, "
            f"{load_info['left_waiting']:,} left waiting")
    lines.append("")
    rows = []
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"),
                       ("queue", "queueing")):
        rows.append([label, _ms(s.get(f"mean_{key}_ms")), _ms(s.get(f"median_{key}_ms")),
                     _ms(s.get(f"p90_{key}_ms")), _ms(s.get(f"p99_{key}_ms"))])
    lines.append("LATENCY (ms)")
    lines.append(tabulate(rows, headers=["metric", "mean", "p50", "p90", "p99"], tablefmt="simple",
                          disable_numparse=True, colalign=("left", "right", "right", "right", "right")))
    lines.append("")
    kv = ", ".join(f"{p['role']} KV use mean {p['kv_utilization_mean']:.1%} peak {p['kv_utilization_peak']:.1%}, "
                   f"busy {p['busy_fraction']:.1%}" for p in s["pools"])
    lines.append(f"ENGINE  {kv}; preemptions {s['preemptions']:,}; {counted(s['steps'], 'step')} simulated in "
                 f"{counted(s['iterations'], 'iteration')}")
    if s.get("prefix_cache_hit_rate"):
        lines.append(f"  prefix cache: {s['prefix_cache_hit_rate']:.1%} of prompt tokens found cached"
                     + (f" ({s['host_cache_hit_rate']:.1%} from the host tier)" if s.get("host_cache_hit_rate") else "")
                     + f"; {counted(sum(p['prefix_cache_evicted_tokens'] for p in s['pools']), 'token')} evicted")
    for pool in s["pools"]:
        spec = pool.get("speculative")
        if spec:
            lines.append(f"  speculative decoding ({pool['role']}): {counted(spec['lookahead'], 'token')} drafted a "
                         "step"
                         + (" (lookahead auto)" if spec["lookahead_auto"] else "")
                         + f", {spec['expected_tokens_per_step']:.2f} expected per step")
    little = s["little"]
    lines.append(f"  Little's law: mean requests in the system {little['mean_in_flight']:,.2f} = throughput x mean "
                 f"latency {little['throughput_x_latency']:,.2f}")
    if s.get("stages"):
        lines += ["", stages_text(s["stages"])]
    energy = energy_text(s)
    if energy:
        lines += [""] + energy
    if s.get("warnings"):
        lines += ["", "WARNINGS"] + [f"  - {w}" for w in s["warnings"]]
    if s.get("notes"):
        lines += ["", "NOTES"] + [f"  - {note}" for note in s["notes"]]
    return "\n".join(lines)


def stages_text(stages: list[dict[str, Any]]) -> str:
    """Per-stage metrics, as inference-perf reports each stage."""
    rows = []
    for st in stages:
        ramp = st.get("ramp")
        load = (f"{st['rate']:g}/s" if st.get("rate") is not None else
                f"ramp {ramp['start_rps']:g} to {ramp['end_rps']:g}/s" if ramp else
                counted(st.get("concurrency"), "client"))
        if st.get("duration_s") is not None:
            load += f" x {st['duration_s']:g} s"
        rows.append([str(st["stage"]), load, f"{st['num_prompts']:,}", f"{st['completed']:,}",
                     f"{st.get('rejected', 0) + st.get('left_waiting', 0):,}",
                     _ms(st.get("mean_ttft_ms")), _ms(st.get("p90_ttft_ms")), _ms(st.get("p99_ttft_ms")),
                     _ms(st.get("mean_itl_ms")), _ms(st.get("mean_e2el_ms")), _ms(st.get("p99_e2el_ms")),
                     f"{st.get('prefix_cache_hit_rate', 0):.1%}", "yes" if st.get("overloaded") else "no"])
    return "STAGES (ms)\n" + tabulate(
        rows, headers=["stage", "load", "sent", "done", "failed", "TTFT", "p90 TTFT", "p99 TTFT", "ITL", "E2E",
                       "p99 E2E", "cache hit", "overloaded"], tablefmt="simple", disable_numparse=True)


def sweep_text(rows: list[dict[str, Any]]) -> str:
    table = [[f"{r['rate']:g}", f"{r['request_throughput']:,.2f}", f"{r['output_throughput']:,.0f}",
              f"{r['output_throughput_per_gpu']:,.0f}", _ms(r["median_ttft_ms"]), _ms(r["p99_ttft_ms"]),
              _ms(r["median_tpot_ms"]), _ms(r["p99_tpot_ms"]), _ms(r["mean_e2el_ms"]),
              f"{r['slo_attainment']:.1%}" if r.get("slo_attainment") is not None else "-"] for r in rows]
    return "RATE SWEEP (Poisson)\n" + tabulate(
        table, headers=["rate", "req/s", "out tok/s", "per GPU", "p50 TTFT", "p99 TTFT", "p50 TPOT", "p99 TPOT",
                        "mean E2E", "SLO met"], tablefmt="simple", disable_numparse=True) + rejected_text(
        rows, next((r["rejected_as_longer_than"] for r in rows if r.get("rejected_as_longer_than")), None))


def rejected_text(rows: list[dict[str, Any]], longer: str | None) -> str:
    """A line under a rate search: the requests rejected on arrival at each rate (none: "")."""
    if not any(r.get("rejected") for r in rows):
        return ""
    why = f" as longer (prompt + output) than {longer}" if longer else ""
    counts = {(r.get("rejected", 0), r["num_prompts"]) for r in rows}
    if len(counts) == 1:
        rejected, sent = counts.pop()
        return (f"\n  {rejected:,} of the {counted(sent, 'request')} {'was' if rejected == 1 else 'were'} rejected "
                f"on arrival{why}, at every rate; the figures are of the others")
    return (f"\n  requests rejected on arrival{why}, by rate: "
            + ", ".join(f"{r['rate']:g}: {r.get('rejected', 0):,} of {r['num_prompts']:,}" for r in rows)
            + "; the figures are of the others")


def slo_search_text(found: dict[str, Any]) -> str:
    s = found["summary"]
    pct = found["percentile"]
    key = percentile_key(pct)
    pct = f"{pct:g}"
    lines = [f"HIGHEST RATE UNDER THE SLO (p{pct} TTFT <= {_ms(s['slo']['ttft_ms'])} ms, "
             f"p{pct} TPOT <= {_ms(s['slo']['tpot_ms'])} ms): {found['max_rate']:.3f} req/s "
             f"(offline capacity {found['capacity_rate']:.3f} req/s)",
             f"  at that rate: {s['output_throughput']:,.1f} output tok/s ({s['output_throughput_per_gpu']:,.1f} per GPU), "
             f"{key} TTFT {s[f'{key}_ttft_ms']:,.1f} ms, {key} TPOT {s[f'{key}_tpot_ms']:,.2f} ms",
             "  probes: " + ", ".join(f"{p['rate']:.3g}{'+' if p['met'] else 'x'}" for p in found["probes"])
             + "   (+ met, x missed)"]
    return "\n".join(lines) + rejected_text(found["probes"], found.get("rejected_as_longer_than"))


def _value(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:,.2f}"
    return f"{value:,.3f}" if unit == "req/s" else f"{value:,.1f}"


def serving_comparison_text(source: str, comparison: Any) -> str:
    """A serving benchmark result against infersim serve at the same load (infersim.serve.bench_result)."""
    result = comparison.result
    what = f"{result.tool} result {source}" + (f" line {result.line}" if result.line > 1 else "")
    lines = [f"InferSim compare: {what} against infersim serve at the same load",
             f"  measured:   {result.backend or 'unknown backend'}"
             + (f", {result.model_id}" if result.model_id else "")
             + f"; {result.load}; {counted(result.completed, 'request')}, mean input {result.mean_input_len:,.1f} and "
               f"output {result.mean_output_len:,.1f} tokens",
             f"  predicted:  {comparison.predicted_title}", ""]
    rows = []
    for row in comparison.rows:
        error = row.error
        rows.append([f"{row.metric} ({row.unit})", _value(row.measured, row.unit), _value(row.predicted, row.unit),
                     "-" if error is None else f"{100 * error:+.1f}%"])
    lines.append(tabulate(rows, headers=["metric", "measured", "predicted", "error"], tablefmt="simple",
                          disable_numparse=True, colalign=("left", "right", "right", "right")))
    lines += [f"note: {note}" for note in comparison.notes]
    return "\n".join(lines)


def serving_comparison_json(source: str, comparison: Any) -> dict[str, Any]:
    result = comparison.result
    return {"line": result.line, "kind": "vllm_bench_serve" if result.tool.startswith("vllm") else "bench_serving",
            "tool": result.tool, "label": result.load, "backend": result.backend, "model_id": result.model_id,
            "request_rate": None if result.request_rate == float("inf") else result.request_rate,
            "max_concurrency": result.max_concurrency, "completed": result.completed,
            "mean_input_len": result.mean_input_len, "mean_output_len": result.mean_output_len,
            "predicted_run": comparison.predicted_title, "serve_options": comparison.options,
            "metrics": [{"metric": r.metric, "unit": r.unit, "measured": r.measured, "predicted": r.predicted,
                         "error": r.error} for r in comparison.rows],
            "notes": list(comparison.notes)}
