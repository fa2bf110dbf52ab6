"""Python API of the serving simulator.

    from infersim.run.config import load_run_config
    from infersim.serve.api import simulate_serving
    summary = simulate_serving(load_run_config("serve-llama-8b-h100.yaml"),
                               {"mode": "poisson", "rate": 8, "num_requests": 2000,
                                "isl": {"dist": "lognormal", "mean": 2000, "std": 800}, "osl": 500,
                                "slo": {"ttft_ms": 2000, "tpot_ms": 50}})
    summary["p99_ttft_ms"], summary["output_throughput_per_gpu"]

Options (all optional but what the mode needs):
  mode            offline | poisson | concurrency | trace (default poisson; workload when `workload` is given)
  workload        a staged workload (infersim.serve.workload_spec): load stages, shared prefixes,
                  multi-turn conversations, chat sessions; instead of a mode, rate, concurrency or trace
  num_requests    requests to simulate (default 1000; a trace replays all its rows unless given, and a
                  cut is announced under "notes"); at most 10,000,000
  rate            requests/s (poisson); burstiness: gamma shape of the gaps (1 = Poisson)
  concurrency     clients in closed loop (concurrency)
  trace           path of a JSONL/CSV trace (trace); trace_time_scale stretches its arrival times
  isl, osl        an int, or {dist: fixed|uniform|normal|lognormal, mean, std, min, max}
                  (default: the config's workload.isl / workload.osl, fixed)
  lengths_trace   path of a trace whose (input, output) rows the lengths are drawn from (any mode but trace)
  seed            random seed (default 0)
  replicas        data-parallel instances of the config's deployment behind a router (default 1)
  router          round-robin | least-loaded
  prefix_hit_rate share of each prompt found in the prefix cache; prefix_cache: true/false overrides the engine card
  slo             {ttft_ms, tpot_ms} (or ttft_s, tpot_s): goodput and attainment
  disaggregate    "3P1D" or {prefill: 3, decode: 1, prefill_deployment: {...}, decode_deployment: {...}}
  max_running_requests, max_num_tokens
                  override the running-request cap and the per-step token budget of every instance
                  (e.g. MLPerf's gpu_batch_size); default: engine card, or trtllm-bench's heuristic offline
  max_waiting     open loop: requests an instance's queue holds before arrivals are left waiting
                  (default 10,000; 0: no bound; infersim.serve.overload)
  max_model_len   requests longer than this (prompt + output tokens) are rejected on arrival, or admitted
                  with their output cut where the engine does that (engine card context_limit)
  host_kv_bytes, host_kv_tokens
                  a host (CPU) tier of the prefix cache per instance, where the engine card has one
  kv_capacity_tokens
                  the KV pool per instance instead of the engine's (a measured pool)
  bucket_width    relative width of the step-cost grid (default 1.04; see infersim.serve.cost)
  requests        true: include per-request records under "requests"
A calibration profile (the run config key `calibration`, docs/calibration.md) is applied by
load_run_config / config_from_mapping, as on the command line; infersim.run.config.without_calibration
gives the same run on the uncalibrated cards.

Returns the summary dict (infersim.serve.metrics.summarize): vllm-bench-serve names (mean_ttft_ms,
median_ttft_ms, p99_ttft_ms, mean_tpot_ms, ..., mean_itl_ms, mean_e2el_ms, request_throughput,
output_throughput, total_token_throughput) plus output_throughput_per_gpu over all GPUs of all
replicas / pools, queueing, KV utilisation, preemptions, per-pool scheduler facts and a Little's
law check, the prefix cache's hit rate, "load" and "warnings" (offered load against what was served;
infersim.serve.overload), "stages" for a workload (per load stage), and "notes": what the run did
that was not asked for (a trace cut to num_requests, lengths whose realised mean is not the
distribution's, what a workload file says that is not read). Bad options raise InferSimError with one
clear message; valid options that cannot run (a request larger than the KV cache) NotPossible.
"""

from __future__ import annotations

from typing import Any

from infersim.run.config import RunConfig
from infersim.serve.cost import StepPriceBook
from infersim.serve.metrics import summarize
from infersim.serve.options import parse_options
from infersim.serve.simulate import simulate_serving_run


def simulate_serving(config: RunConfig, options: dict[str, Any], prices: StepPriceBook | None = None) -> dict[str, Any]:
    """The summary of one serving run; `prices`: a caller's book of step prices, shared by its runs
    (infersim.serve.cost: a run reads the prices of earlier runs with the same cards and tables)."""
    options = dict(options)
    include_requests = bool(options.pop("requests", False))
    opts = parse_options(options)
    return summarize(simulate_serving_run(config, opts, keep_records=include_requests, prices=prices),
                     include_requests=include_requests)
