"""Wall time of the main command as a whole process, against the interpreter's own start.

    python benchmarks/startup.py [--runs 15] [--config qwen3-30b.yaml]

Runs `python -c pass` and `python -m infersim --config CONFIG` (this checkout's package)
alternately, after one warm-up run that fills the on-disk caches and __pycache__ as any earlier run
on the machine would have, and prints the median of each, the difference (what InferSim itself
costs: imports, cards, tables, the two stages, the report) and the ratio. The issue's target: the
main command in <= 60 ms where the original InferSim's main.py takes 49 ms on the same machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parent.parent

# The checkout's package (not another one installed), timed with its bytecode in place as an
# installed package has it: with PYTHONDONTWRITEBYTECODE set, no run writes __pycache__ and every
# run compiles every module again (~45 ms more).
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--config", default="qwen3-30b.yaml")
    args = parser.parse_args(argv)
    bare = [sys.executable, "-c", "pass"]
    run = [sys.executable, "-m", "infersim", "--config", args.config]
    wall(run)  # warm-up: on-disk table cache, OS file cache
    bare_s, run_s = [], []
    for _ in range(args.runs):
        bare_s.append(wall(bare))
        run_s.append(wall(run))
    b, r = statistics.median(bare_s), statistics.median(run_s)
    print(f"python -c pass:                         {b * 1e3:7.1f} ms (median of {args.runs})")
    print(f"python -m infersim --config {args.config}: {r * 1e3:7.1f} ms")
    print(f"InferSim's own share:                   {(r - b) * 1e3:7.1f} ms; ratio {r / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
