"""Sweep throughput: configurations simulated per second, in process (one core) and on all cores.

    python benchmarks/sweep_rate.py [--quick]

Each case is a decode-only sweep from the bundled qwen3-30b.yaml (cards loaded and validated
once, variants derived in memory), timed end to end through `run_sweep` (deriving and validating
each variant, simulating decode, gathering rows). The issue's requirement is >= 2,000
configurations per second per core for decode-only sweeps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tabulate import tabulate  # noqa: E402

from infersim.sweep import Search, SweepSpec, load_base, parse_grid, run_sweep  # noqa: E402
from infersim.sweep.runner import available_cpus  # noqa: E402

REQUIRED_PER_CORE = 2000.0

CASES = [
    # name, --set overrides, grid
    ("qwen3-30b-a3b MoE, kv heads x EP x batch", [],
     ["model.num_key_value_heads=1,2,4,8", "deployment.ffn.ep=1,2,4", "workload.decode_batch_per_gpu=1..512:1"]),
    ("qwen3-8b dense, TP x batch x ISL", ["model=qwen3-8b", "deployment.ffn.ep=1", "deployment.attention.dp=0"],
     ["deployment.attention.tp=1,2,4", "deployment.ffn.tp=4", "workload.decode_batch_per_gpu=1..256:1",
      "workload.isl=1024,4096,16384"]),
    ("deepseek-v3 MLA+MoE on 32 H800, EP x batch", ["model=deepseek-v3", "hardware=h800", "deployment.num_gpus=32",
                                                    "deployment.num_nodes=4", "deployment.attention.dp=0"],
     ["deployment.ffn.ep=8,16,32", "workload.decode_batch_per_gpu=1..256:1",
      "deployment.moe_comm=all-to-all,deepep-low-latency"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller grids (a smoke test)")
    args = parser.parse_args()
    cores = available_cpus()
    table = []
    worst = float("inf")
    for name, overrides, grid in CASES:
        base = load_base("qwen3-30b.yaml", overrides)
        if args.quick:
            grid = [g.replace("1..512:1", "1..512:8").replace("1..256:1", "1..256:8") for g in grid]
        spec = SweepSpec(base, tuple(parse_grid(grid)))
        run_sweep(SweepSpec(base, tuple(parse_grid(grid[:1]))), workers=1)  # warm imports and caches
        serial = run_sweep(spec, workers=1, progress=False)
        worst = min(worst, serial.rate)
        row = [name, f"{serial.simulated:,}", f"{serial.elapsed_s:.2f}", f"{serial.rate:,.0f}"]
        if cores > 1:
            parallel = run_sweep(spec, workers=cores, progress=False)
            row += [f"{parallel.elapsed_s:.2f}", f"{parallel.rate:,.0f}", f"{parallel.rate / cores:,.0f}"]
        else:
            row += ["-", "-", "-"]
        table.append(row)
    # a layout search (pareto): validation of many layouts, memory budget per layout, batches per layout
    base = load_base("qwen3-30b.yaml")
    spec = SweepSpec(base, search=Search(tuple(2 ** i for i in range(8)), tuple(2 ** i for i in range(11))))
    serial = run_sweep(spec, workers=1, progress=False)
    row = ["qwen3-30b-a3b layout search, 1..128 GPUs (pareto)", f"{serial.simulated:,}", f"{serial.elapsed_s:.2f}",
           f"{serial.rate:,.0f}"]
    if cores > 1:
        parallel = run_sweep(spec, workers=cores, progress=False)
        row += [f"{parallel.elapsed_s:.2f}", f"{parallel.rate:,.0f}", f"{parallel.rate / cores:,.0f}"]
    else:
        row += ["-", "-", "-"]
    table.append(row)
    print(tabulate(table, headers=["case", "configs", "1 core s", "configs/s (1 core)", f"{cores} cores s",
                                   f"configs/s ({cores} cores)", "per core"], disable_numparse=True))
    verdict = "meets" if worst >= REQUIRED_PER_CORE else "MISSES"
    print(f"\nslowest decode-only case in process: {worst:,.0f} configurations/s on one core "
          f"({verdict} the {REQUIRED_PER_CORE:,.0f}/s per core requirement)")
    return 0 if worst >= REQUIRED_PER_CORE else 1


if __name__ == "__main__":
    raise SystemExit(main())
