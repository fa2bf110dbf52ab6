"""Sweep throughput: configurations simulated per CPU second in process, and per core on all cores.

    python benchmarks/sweep_rate.py [--quick] [--repeats 5] [--no-parallel] [--instructions]

Each case is a sweep from the bundled qwen3-30b.yaml (cards loaded and validated once, variants
derived in memory), timed end to end through `run_sweep` (deriving and validating each variant,
simulating decode, gathering rows); the last case is a layout search (pareto). The in-process rate
is configurations per CPU second (time.process_time: the machine may be shared, and another
process's load does not count against ours) of one sweep in a fresh process, after a small sweep
over the first grid axis only has imported the code and loaded the tables (a user's sweep starts as
cold: kernel costs and plan pieces are priced as the sweep first meets them); the median of
`--repeats` such processes. The requirement: at least 10,000 configurations per CPU second for
every case.

The rate depends on how fast the machine runs that day (a shared virtual machine varies by 2x);
`--instructions` counts instead what does not: the interpreter instructions per configuration of
each case (valgrind's callgrind: the whole process with the sweep, less the same process with its
warm-up only), for telling slower code from a slower machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tabulate import tabulate  # noqa: E402

from infersim.sweep import Search, SweepSpec, load_base, parse_grid, run_sweep  # noqa: E402
from infersim.sweep.runner import available_cpus  # noqa: E402

REQUIRED_PER_CPU_SECOND = 10_000.0

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
LAYOUT_SEARCH = "qwen3-30b-a3b layout search, 1..128 GPUs (pareto)"


def case_specs(quick: bool) -> list[tuple[str, SweepSpec, SweepSpec]]:
    """(name, the sweep, the small sweep that warms it up) of every case."""
    specs = []
    for name, overrides, grid in CASES:
        base = load_base("qwen3-30b.yaml", overrides)
        if quick:
            grid = [g.replace("1..512:1", "1..512:8").replace("1..256:1", "1..256:8") for g in grid]
        specs.append((name, SweepSpec(base, tuple(parse_grid(grid))), SweepSpec(base, tuple(parse_grid(grid[:1])))))
    base = load_base("qwen3-30b.yaml")
    search = SweepSpec(base, search=Search(tuple(2 ** i for i in range(8)), tuple(2 ** i for i in range(11))))
    specs.append((LAYOUT_SEARCH, search, SweepSpec(base, search=Search((1,), (1,)))))
    return specs


def one_run(index: int, quick: bool) -> None:
    """Time case `index` in this (fresh) process; print configurations and CPU seconds."""
    _name, spec, warm_up = case_specs(quick)[index]
    run_sweep(warm_up, workers=1, progress=False)  # imports, tables, the base's derived fields
    began = time.process_time()
    result = run_sweep(spec, workers=1, progress=False)
    print(result.simulated, time.process_time() - began)


def warm_up_only(index: int, quick: bool) -> None:
    """Case `index`'s warm-up alone: the baseline the instruction count subtracts."""
    run_sweep(case_specs(quick)[index][2], workers=1, progress=False)


def instructions(index: int, quick: bool) -> tuple[int, float]:
    """(configurations, interpreter instructions per configuration) of case `index` under callgrind."""
    counts = []
    quick_flag = ["--quick"] if quick else []
    # a fixed hash seed, and the bytecode compiled by a run before the two counted ones (else the
    # first counted run alone would pay for compiling what changed since the last run)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run([sys.executable, __file__, "--warm-up-only", str(index)] + quick_flag, check=True, env=env,
                   capture_output=True)
    for flag in ("--one", "--warm-up-only"):
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                               __file__, flag, str(index)] + quick_flag,
                              check=True, capture_output=True, text=True, env=env)
        counts.append(int(done.stderr.split("Collected :")[1].split()[0]))
        if flag == "--one":
            simulated = int(done.stdout.split()[0])
    return simulated, (counts[0] - counts[1]) / simulated


def cpu_rates(index: int, quick: bool, repeats: int) -> tuple[int, list[float]]:
    """(configurations, per-process rates) of case `index`, each run in a fresh process."""
    rates = []
    simulated = 0
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--one", str(index)] + (["--quick"] if quick else []),
                             check=True, capture_output=True, text=True).stdout.split()
        simulated, seconds = int(out[0]), float(out[1])
        rates.append(simulated / seconds)
    return simulated, rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller grids (a smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per case (median reported)")
    parser.add_argument("--no-parallel", action="store_true", help="skip the all-cores runs")
    parser.add_argument("--instructions", action="store_true",
                        help="count interpreter instructions per configuration (needs valgrind) instead of timing")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process: one case
    parser.add_argument("--warm-up-only", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        one_run(args.one, args.quick)
        return 0
    if args.warm_up_only is not None:
        warm_up_only(args.warm_up_only, args.quick)
        return 0
    if args.instructions:
        rows = [[name, f"{n:,}", f"{per / 1e3:,.0f}k"] for (name, _spec, _warm), (n, per)
                in zip(case_specs(args.quick), (instructions(i, args.quick) for i in range(len(CASES) + 1)))]
        print(tabulate(rows, headers=["case", "configs", "instructions per config"], disable_numparse=True))
        return 0
    cores = available_cpus()
    table = []
    worst = float("inf")
    for index, (name, spec, _warm_up) in enumerate(case_specs(args.quick)):
        simulated, rates = cpu_rates(index, args.quick, args.repeats)
        rate = statistics.median(rates)
        worst = min(worst, rate)
        row = [name, f"{simulated:,}", f"{rate:,.0f}", f"{min(rates):,.0f}..{max(rates):,.0f}"]
        if cores > 1 and not args.no_parallel:
            parallel = run_sweep(spec, workers=cores, progress=False)
            row += [f"{parallel.elapsed_s:.2f}", f"{parallel.rate:,.0f}", f"{parallel.rate / cores:,.0f}"]
        else:
            row += ["-", "-", "-"]
        table.append(row)
    print(tabulate(table, headers=["case", "configs", "configs/CPU s (median)", f"range of {args.repeats}",
                                   f"{cores} cores wall s", f"configs/s ({cores} cores)", "per core"],
                   disable_numparse=True))
    verdict = "meets" if worst >= REQUIRED_PER_CPU_SECOND else "MISSES"
    print(f"\nslowest case in process: {worst:,.0f} configurations per CPU second "
          f"({verdict} the {REQUIRED_PER_CPU_SECOND:,.0f} required)")
    return 0 if worst >= REQUIRED_PER_CPU_SECOND else 1


if __name__ == "__main__":
    raise SystemExit(main())
