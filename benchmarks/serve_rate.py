"""Serving-simulator speed: simulated requests per second and loop iterations per second on one core.

    python benchmarks/serve_rate.py [--requests 100000]

The issue's target: >= 20,000 simulated requests/s on one core for 100k requests of 1k-in/1k-out
at a saturating rate. Each case runs the bundled serve-llama-8b-h100.yaml (Llama-3.1-8B FP8 on one
H100) under an engine card, Poisson arrivals at 10x what the instance can serve (the queue never
empties: saturating), timed end to end in process (workload generation, scheduling, step pricing
through the stage engine, summary). 'steps' are engine steps simulated, 'iterations' the loop
turns (a skipped-over decode stretch is one), 'priced' the stage-engine evaluations (memo misses).
Rates are per CPU second of this process (time.process_time: one core, and not diluted when other
processes share the machine); wall seconds are shown too. The lognormal case shows the cost of varied lengths (more distinct step shapes and events).
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    rows = []
    ok = True
    for name, engine, options in CASES:
        config = load_run_config("serve-llama-8b-h100.yaml", [f"engine={engine}"])
        start, wall = time.process_time(), time.perf_counter()
        summary = simulate_serving(config, {"mode": "poisson", "rate": SATURATING_RATE,
                                            "num_requests": args.requests, "seed": 0, **options})
        elapsed = time.process_time() - start
        wall = time.perf_counter() - wall
        rate = args.requests / elapsed
        fixed = isinstance(options["isl"], int)
        if fixed and rate < REQUIRED:
            ok = False
        rows.append([name, f"{elapsed:.2f}", f"{wall:.2f}", f"{rate:,.0f}", f"{summary['steps']:,}", f"{summary['iterations']:,}",
                     f"{summary['iterations'] / elapsed:,.0f}", f"{summary['steps'] / elapsed:,.0f}",
                     f"{summary['pools'][0]['priced_step_shapes']:,}", f"{summary['output_throughput']:,.0f}",
                     "yes" if rate >= REQUIRED else "no"])
    print(f"{args.requests:,} requests per case, Poisson {SATURATING_RATE:g} req/s (saturating), one core")
    print(tabulate(rows, headers=["case", "CPU s", "wall s", "requests/s", "steps", "iterations", "iterations/s", "steps/s",
                                  "priced", "sim. out tok/s", f">= {REQUIRED:,.0f}/s"], tablefmt="simple",
                   disable_numparse=True))
    print("target (fixed 1k/1k cases): " + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
