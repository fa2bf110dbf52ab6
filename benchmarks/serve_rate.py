"""Serving-simulator speed and memory: simulated requests per second on one core, and the memory a
run holds per request as the request count grows.

    python benchmarks/serve_rate.py [--requests 100000] [--memory-sizes 10000,100000,1000000]

Speed: the issue's target is >= 20,000 simulated requests/s on one core for 100k requests of
1k-in/1k-out at a saturating rate. Each case runs the bundled serve-llama-8b-h100.yaml (Llama-3.1-8B
FP8 on one H100) under an engine card, Poisson arrivals at 10x what the instance can serve and no
bound on the queue (`max_waiting: 0`, so every request waits and is served: the engine saturated
throughout), timed end to end in process (workload generation, scheduling, step pricing through
the stage engine, summary). 'steps' are engine steps simulated, 'iterations' the loop turns (a
skipped-over decode stretch is one), 'priced' the stage-engine evaluations (memo misses). Rates are
per CPU second of this process (time.process_time: one core, and not diluted when other processes
share the machine); wall seconds are shown too. The lognormal cases show the cost of varied lengths
(more distinct step shapes and events).

Memory: the sglang 1k/1k case offline (every request at t = 0, so the engine is saturated without
a growing queue of arrivals: an offline instance takes its requests as it admits them), at each
size in a fresh process; the peak of what the run allocates (tracemalloc, Python objects and
arrays), per request and per request added since the last size. Latency samples are exact up to 100,000 and a
bounded sketch past that (infersim.serve.quantiles), so the growth per request falls towards zero.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tabulate import tabulate  # noqa: E402

from infersim.run.config import load_run_config  # noqa: E402
from infersim.serve.api import simulate_serving  # noqa: E402

REQUIRED = 20_000.0
SATURATING_RATE = 200.0  # requests/s; one H100 serves ~8 req/s of 1k/1k Llama-3.1-8B

CASES = [
    # name, engine, options
    ("sglang, 1k/1k fixed", "sglang", {"isl": 1000, "osl": 1000}),
    ("vllm, 1k/1k fixed", "vllm", {"isl": 1000, "osl": 1000}),
    ("trtllm, 1k/1k fixed", "trtllm", {"isl": 1000, "osl": 1000}),
    ("sglang, lognormal 1k/1k (std 500)", "sglang",
     {"isl": {"dist": "lognormal", "mean": 1000, "std": 500}, "osl": {"dist": "lognormal", "mean": 1000, "std": 500}}),
    ("vllm, lognormal 1k/1k (std 500)", "vllm",
     {"isl": {"dist": "lognormal", "mean": 1000, "std": 500}, "osl": {"dist": "lognormal", "mean": 1000, "std": 500}}),
]


def speed(requests: int) -> bool:
    rows = []
    ok = True
    for name, engine, options in CASES:
        config = load_run_config("serve-llama-8b-h100.yaml", [f"engine={engine}"])
        start, wall = time.process_time(), time.perf_counter()
        summary = simulate_serving(config, {"mode": "poisson", "rate": SATURATING_RATE, "num_requests": requests,
                                            "seed": 0, "max_waiting": 0, **options})
        elapsed = time.process_time() - start
        wall = time.perf_counter() - wall
        rate = requests / elapsed
        fixed = isinstance(options["isl"], int)
        if fixed and rate < REQUIRED:
            ok = False
        rows.append([name, f"{elapsed:.2f}", f"{wall:.2f}", f"{rate:,.0f}", f"{summary['steps']:,}",
                     f"{summary['iterations']:,}", f"{summary['iterations'] / elapsed:,.0f}",
                     f"{summary['steps'] / elapsed:,.0f}", f"{summary['pools'][0]['priced_step_shapes']:,}",
                     f"{summary['output_throughput']:,.0f}", "yes" if rate >= REQUIRED else "no"])
    print(f"{requests:,} requests per case, Poisson {SATURATING_RATE:g} req/s (saturating), one core")
    print(tabulate(rows, headers=["case", "CPU s", "wall s", "requests/s", "steps", "iterations", "iterations/s",
                                  "steps/s", "priced", "sim. out tok/s", f">= {REQUIRED:,.0f}/s"], tablefmt="simple",
                   disable_numparse=True))
    print("target (fixed 1k/1k cases): " + ("met" if ok else "NOT met"))
    return ok


def _one_memory_run(requests: int) -> None:
    """Child process: one offline run; prints the peak Python memory it adds (tracemalloc) and its
    CPU time as JSON (tracemalloc slows the run: the rate shown is under it)."""
    import tracemalloc

    config = load_run_config("serve-llama-8b-h100.yaml", ["engine=sglang"])
    simulate_serving(config, {"mode": "offline", "num_requests": 100, "isl": 1000, "osl": 1000})  # warm caches
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    start = time.process_time()
    simulate_serving(config, {"mode": "offline", "num_requests": requests, "isl": 1000, "osl": 1000, "seed": 0})
    cpu = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"growth_bytes": peak - before, "cpu_s": cpu}))


def memory(sizes: list[int]) -> None:
    rows = []
    last: tuple[int, float] | None = None
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(n)], capture_output=True, text=True,
                             check=True)
        found = json.loads(out.stdout.strip().splitlines()[-1])
        growth = found["growth_bytes"]
        per = "-" if last is None else f"{(growth - last[1]) / (n - last[0]):,.1f}"
        rows.append([f"{n:,}", f"{growth / 1e6:,.2f}", f"{growth / n:,.1f}", per, f"{n / found['cpu_s']:,.0f}"])
        last = (n, growth)
    print("\nmemory: sglang 1k/1k offline, peak Python memory the run allocates (tracemalloc; fresh process per size)")
    print(tabulate(rows, headers=["requests", "peak MB", "bytes/request", "bytes/request since the last size",
                                  "requests/s (traced)"],
                   tablefmt="simple", disable_numparse=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--memory-sizes", default="10000,100000,1000000")
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child is not None:
        _one_memory_run(args.memory_child)
        return 0
    ok = speed(args.requests)
    if args.memory_sizes:
        memory([int(n) for n in args.memory_sizes.split(",")])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
